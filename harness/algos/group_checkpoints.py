"""The group trainer's checkpoints: reading them safely, rebuilding their policies, and the
policy functions that evaluate them (:mod:`harness.algos.group` re-exports these as the
trainer module's interface: ``load_policy``, ``validate_checkpoint``)."""

from __future__ import annotations

from typing import Any

import torch

from harness.policies import (
    TokenPolicy,
    TokenPolicyConfig,
    build_policy,
    obs_to_batch,
    resolve_device,
)
from harness.runs import CheckpointError


def _policy_fn(policy: TokenPolicy, sampled: bool = False, temperature: float = 1.0):
    device = next(policy.parameters()).device

    def act(obs):
        with torch.no_grad():
            _, actions = policy.act(obs_to_batch(obs, device=device), deterministic=not sampled,
                                    temperature=temperature)
        return actions[0].cpu().numpy()
    return act


def load_policy(checkpoint, metadata: dict[str, Any], device: str = "cpu",
                sampled: bool = False, reference: bool = False):
    """Policy function of a group-trainer checkpoint, on ``device`` whichever device wrote it:
    greedy tokens, or sampled at the run's temperature (``sampled``); the fine-tuned policy, or
    the frozen start policy (``reference``)."""
    state = read_checkpoint(checkpoint)
    policy = _policy_from_checkpoint(state, "reference" if reference else "policy")
    temperature = float(state.get("temperature", 1.0))
    return _policy_fn(policy.to(resolve_device(device)).eval(), sampled, temperature)


def read_checkpoint(path) -> dict[str, Any]:
    """The state a group-trainer checkpoint holds, read with ``torch.load(weights_only=True)``:
    tensors and plain Python values only, so a crafted file cannot run code when it is loaded.

    Raises:
        CheckpointError: The file is unreadable or holds anything else.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle, zip and torch raise many types for a bad file
        raise CheckpointError(f"checkpoint {path} could not be loaded safely (tensors and plain "
                              f"values only): {error}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is not a group-trainer checkpoint: it holds a "
                              f"{type(state).__name__}, not a dict of fields")
    missing = [key for key in ("policy_config", "obs_shapes", "trainer") if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a group-trainer checkpoint: it lacks "
                              f"{missing}")
    return state


def validate_checkpoint(checkpoint, metadata: dict[str, Any]) -> None:
    """Load a checkpoint to resume from, fully, before the run directory is touched.

    Raises:
        CheckpointError: It cannot be read safely, or its networks cannot be rebuilt.
    """
    state = read_checkpoint(checkpoint)
    try:
        for which in ("policy", "reference"):
            _policy_from_checkpoint(state, which)
        for key in ("curriculum", "iteration", "env_steps", "start"):
            state[key]  # noqa: B018 - presence check
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint {checkpoint} cannot be resumed: {error!r}") from None


def _policy_from_checkpoint(state: dict[str, Any], which: str = "policy") -> TokenPolicy:
    """The fine-tuned (``which="policy"``) or start (``"reference"``) policy of a checkpoint."""
    policy = build_policy(TokenPolicyConfig.from_saved(state["policy_config"]),
                          {k: tuple(v) for k, v in state["obs_shapes"].items()})
    policy.load_state_dict(state["trainer"][which])
    return policy
