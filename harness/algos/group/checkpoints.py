"""The group trainer's checkpoint format: its version, reading a file safely, migrating older
versions, rebuilding the policies it holds and the policy functions that evaluate them.

:meth:`harness.algos.group.run.GroupRun.state_dict` writes the fields and
:meth:`~harness.algos.group.run.GroupRun.load_state_dict` reads them back; this module holds what
both sides share: :data:`CHECKPOINT_FORMAT` and :func:`migrate`, the one place that knows an
older layout.

Format history:

* 1: the fields of :data:`RESUME_KEYS` without a ``format`` key (runs saved until 2026-12-05).
* 2: the same fields and ``format: 2``; ``best`` is ``None`` or ``{"success_rate",
  "mean_return"}``.
* 3: adds the start policy's sampled test outcomes (``start_sampled_outcomes``), its
  validation success rates (``start_validation``) and the better decoding they chose
  (``best_start_decoding``): :class:`harness.algos.group.summary.StartBaseline`.
* 4: the policy's own config (``policy_config`` of its kind, :mod:`harness.policies.saving`'s
  format 2) and the ``plugins`` that registered its kind or head; format 3 held every kind's
  fields in one record, and the tokens head's layer as ``action_head`` (runs saved until
  2026-12-07).
"""

from __future__ import annotations

import io
import math
from typing import Any

import torch

from harness.policies import obs_to_batch, resolve_device
from harness.policies.registry import build_function
from harness.policies.saving import policy_from_record
from harness.runs import CheckpointError

CHECKPOINT_FORMAT = 4
# What any version holds: enough to rebuild and evaluate the policies (with the ``policy_format``
# and ``plugins`` of format 4, which migrate() fills in for older ones).
POLICY_KEYS: tuple[str, ...] = ("policy_config", "obs_shapes", "trainer")
# What a resume reads (GroupRun.load_state_dict): in every version since 1, the start's
# figures of format 3 and the policy record's format and plugins of format 4, which migrate()
# fills in for older ones.
RESUME_KEYS: tuple[str, ...] = (
    *POLICY_KEYS, "curriculum", "starts", "adr", "detector_refresh", "iteration", "env_steps",
    "best", "start", "start_outcomes", "start_counter", "temperature", "schedules",
    "start_sampled_outcomes", "start_validation", "best_start_decoding", "policy_format",
    "plugins",
)
# What format 2 lacks, as migrate() fills it in: the start's figures were not kept.
FORMAT_3_DEFAULTS: dict[str, Any] = {
    "start_sampled_outcomes": (), "start_validation": None, "best_start_decoding": None,
}


def write_state(state: dict[str, Any], handle) -> None:
    """``torch.save`` of a checkpoint's fields into an open file, in one write."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    handle.write(buffer.getvalue())


def read_checkpoint(path) -> dict[str, Any]:
    """The state a group-trainer checkpoint holds, migrated to :data:`CHECKPOINT_FORMAT` and read
    with ``torch.load(weights_only=True)``: tensors and plain Python values only, so a crafted
    file cannot run code when it is loaded.

    Raises:
        CheckpointError: The file is unreadable, holds anything else, lacks the policy fields,
            or has a format this version does not know.
    """
    return migrate(_load(path), path)


def _load(path) -> dict[str, Any]:
    """The fields of a checkpoint file as written (see :func:`read_checkpoint`)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle, zip and torch raise many types for a bad file
        raise CheckpointError(f"checkpoint {path} could not be loaded safely (tensors and plain "
                              f"values only): {error}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is not a group-trainer checkpoint: it holds a "
                              f"{type(state).__name__}, not a dict of fields")
    missing = [key for key in POLICY_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a group-trainer checkpoint: it lacks "
                              f"{missing}")
    return state


def migrate(state: dict[str, Any], path="<state>") -> dict[str, Any]:
    """``state`` in the current format (:data:`CHECKPOINT_FORMAT`).

    Format 1 (no ``format`` key) becomes format 2 by adding the key and turning a ``best``
    success rate saved as a float into the dict format 2 keeps. Format 2 becomes format 3 with
    :data:`FORMAT_3_DEFAULTS`: no sampled start outcomes and no better start decoding, so a
    resumed run's summary gives the gain over the start's greedy decoding only. Fields a
    resume needs are checked by :func:`check_resumable`, not here, so that an old checkpoint
    missing them still evaluates.

    Raises:
        CheckpointError: A format newer than this harness's, or not an int.
    """
    version = state.get("format", 1)
    if not isinstance(version, int) or version < 1 or version > CHECKPOINT_FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {version!r}; this harness reads "
                              f"formats 1 to {CHECKPOINT_FORMAT} (a newer harness wrote it?)")
    state = dict(state)
    if version == 1:
        best = state.get("best")
        if isinstance(best, float):  # the oldest format-1 files kept the success rate alone
            state["best"] = None if best < 0 else {"success_rate": best,
                                                   "mean_return": -math.inf}
        state["format"] = 2
    if state["format"] == 2:
        state = {**FORMAT_3_DEFAULTS, **state, "format": 3}
    if state["format"] == 3:
        state = {**state, "format": 4, "policy_format": 1, "plugins": [],
                 "trainer": _renamed_weights(state["trainer"], state["policy_config"])}
    return state


def _renamed_weights(trainer: dict[str, Any], saved_config: dict[str, Any]) -> dict[str, Any]:
    """The trainer's networks with format 1's parameter names made the current ones by the
    kind's own ``migrate_state``."""
    kind = saved_config.get("kind") if isinstance(saved_config, dict) else None
    if not isinstance(trainer, dict) or not isinstance(kind, str):
        return trainer  # check_resumable and policy_from_state name what is wrong
    try:
        rename = build_function(kind).migrate_state
    except ValueError:
        return trainer
    return {key: (rename(value) if key in ("policy", "reference", "critic")
                  and isinstance(value, dict) else value) for key, value in trainer.items()}


def check_resumable(state: dict[str, Any], path, written_as: int | None = None) -> None:
    """Refuse, by name, a checkpoint that lacks a field a resume reads.

    Args:
        state: The checkpoint's fields.
        path: The file, for the message.
        written_as: The format the file was written in (before :func:`migrate`), for the
            message; default ``state["format"]``.

    Raises:
        CheckpointError: Naming the missing fields and the format.
    """
    missing = [key for key in RESUME_KEYS if key not in state]
    if missing:
        version = state.get("format", 1) if written_as is None else written_as
        raise CheckpointError(
            f"checkpoint {path} (format {version}) cannot be resumed: it lacks "
            f"{missing}, written by an older harness; evaluate it with scripts/evaluate.py, or "
            "start a fresh run")


def policy_from_state(state: dict[str, Any], which: str = "policy"):
    """The fine-tuned (``which="policy"``) or start (``"reference"``) policy of a checkpoint
    (migrated to :data:`CHECKPOINT_FORMAT`)."""
    record = {"format": state.get("policy_format", 2), "config": state["policy_config"],
              "obs_shapes": state["obs_shapes"], "plugins": state.get("plugins", [])}
    policy = policy_from_record(record, None)
    policy.load_state_dict(state["trainer"][which])
    return policy


def policy_fn(policy, sampled: bool = False, temperature: float = 1.0):
    """A raw-observation policy function of ``policy``: greedy tokens, or sampled at
    ``temperature`` (from torch's global generator). It answers the ``execute_steps`` actions
    of each decision, ``(k, action_dim)``, which :func:`harness.evaluation.evaluate` plays in
    order."""
    device = next(policy.parameters()).device
    steps = policy.spec.execute_steps

    def act(obs):
        with torch.no_grad():
            _, actions = policy.act(obs_to_batch(obs, device=device), deterministic=not sampled,
                                    temperature=temperature)
        return actions[0, :steps].cpu().numpy()
    return act


def validate_checkpoint(checkpoint, metadata: dict[str, Any]) -> None:
    """Load a checkpoint to resume from, fully, before the run directory is touched.

    Raises:
        CheckpointError: It cannot be read safely, lacks a field a resume reads, or its
            networks cannot be rebuilt.
    """
    written = _load(checkpoint)
    state = migrate(written, checkpoint)
    check_resumable(state, checkpoint, written.get("format", 1))
    try:
        for which in ("policy", "reference"):
            policy_from_state(state, which)
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint {checkpoint} cannot be resumed: {error!r}") from None


def load_policy(checkpoint, metadata: dict[str, Any], device: str = "cpu",
                sampled: bool = False, reference: bool = False):
    """Policy function of a group-trainer checkpoint, on ``device`` whichever device wrote it:
    greedy tokens, or sampled at the run's temperature (``sampled``); the fine-tuned policy, or
    the frozen start policy (``reference``)."""
    state = read_checkpoint(checkpoint)
    policy = policy_from_state(state, "reference" if reference else "policy")
    temperature = float(state.get("temperature", 1.0))
    return policy_fn(policy.to(resolve_device(device)).eval(), sampled, temperature)
