"""Policy files: config, observation shapes and weights in one ``torch.save``.

:func:`save_policy` writes what :func:`load_policy` rebuilds (through
:func:`~harness.policies.factory.build_policy`). Format history:

* 1: ``{"format": 1, "config": <every kind's fields, "kind">, "obs_shapes", "state_dict"}``,
  the tokens head's layer named ``action_head`` (files written until 2026-12-07);
* 2: ``{"format": 2, "config": <the kind's own config, "name">, "plugins": [...], ...}``, the
  plugin modules that registered the kind or the head, imported before it is rebuilt.

Format 1 loads as format 2 (:func:`~harness.policies.factory.config_from_saved`,
:meth:`migrate_state` of the kind's class).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from gymnasium import spaces

from harness.policies.factory import build_policy, config_from_saved, policy_plugins
from harness.policies.observations import obs_shapes_from_space
from harness_common.files import atomic_write

CHECKPOINT_FORMAT = 2
FORMATS = (1, 2)


def policy_record(policy) -> dict[str, Any]:
    """What rebuilds ``policy`` apart from its weights: format, config, shapes, plugins."""
    return {"format": CHECKPOINT_FORMAT, "config": policy.config.to_saved(),
            "obs_shapes": {k: list(v) for k, v in policy.obs_shapes.items()},
            "plugins": list(policy_plugins(policy.config))}


def policy_from_record(record: dict[str, Any], state_dict: dict[str, torch.Tensor] | None):
    """The policy a :func:`policy_record` (or a format-1 file's fields) describes, with
    ``state_dict`` loaded when given.

    Raises:
        ValueError: A format this version does not read, or a config it refuses.
        RuntimeError: Weights that do not fit the network.
    """
    version = record.get("format", 1)
    if version not in FORMATS:
        raise ValueError(f"policy format {version!r}; this harness reads formats {FORMATS} (a "
                         "newer harness wrote it?)")
    config = config_from_saved(record["config"], tuple(record.get("plugins", ())))
    policy = build_policy(config, {k: tuple(v) for k, v in record["obs_shapes"].items()})
    if state_dict is not None:
        if version == 1:
            state_dict = type(policy).migrate_state(state_dict)
        policy.load_state_dict(state_dict)
    return policy


def save_policy(path: str | os.PathLike, policy) -> None:
    """Write config, observation shapes and weights to ``path`` atomically.

    The checkpoint is a ``torch.save`` of :func:`policy_record` and ``"state_dict"``, written
    atomically (:func:`harness_common.files.atomic_write`), so a crash never leaves a
    half-written file at ``path``.
    """
    checkpoint = {**policy_record(policy),
                  "state_dict": {k: v.detach().cpu() for k, v in policy.state_dict().items()}}
    atomic_write(path, lambda file: torch.save(checkpoint, file))


def load_policy(
    path: str | os.PathLike,
    observation_space: spaces.Dict | None = None,
    map_location: torch.device | str = "cpu",
):
    """Rebuild a policy written by :func:`save_policy` (format 1 or 2).

    Args:
        path: The checkpoint file.
        observation_space: When given, the observations the caller will feed; a policy saved for
            other shapes is refused here instead of failing later inside a layer.
        map_location: Where the weights are loaded.

    Returns:
        The policy with its saved weights (in training mode, as ``nn.Module`` starts).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: The file is not a readable policy checkpoint, or its shapes do not match.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no policy checkpoint at {path}")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        raise ValueError(f"cannot read policy checkpoint {path}: {error}") from error
    if not isinstance(checkpoint, dict) or checkpoint.get("format") not in FORMATS:
        raise ValueError(f"{path} is not a policy checkpoint of format {FORMATS}")
    saved_shapes = {k: tuple(v) for k, v in checkpoint["obs_shapes"].items()}
    if observation_space is not None:
        wanted = obs_shapes_from_space(observation_space)
        if wanted != saved_shapes:
            raise ValueError(
                f"{path} was saved for observation shapes {saved_shapes}, not {wanted}"
            )
    try:
        policy = policy_from_record(checkpoint, checkpoint["state_dict"])
    except RuntimeError as error:
        message = f"weights in {path} do not fit the policy they describe: {error}"
        raise ValueError(message) from error
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return policy.to(map_location)
