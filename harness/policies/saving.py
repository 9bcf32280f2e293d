"""Token policy files: config, observation shapes and weights in one ``torch.save``.

:func:`save_policy` writes what :func:`load_policy` rebuilds (through
:func:`~harness.policies.token_policy.build_policy`); a policy config saved before a field
existed loads with that field's default (:meth:`TokenPolicyConfig.from_saved`).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import torch
from gymnasium import spaces

from harness.policies.token_policy import TokenPolicy, build_policy
from harness.policies.tokens import TokenPolicyConfig, obs_shapes_from_space
from harness_common.files import atomic_write

CHECKPOINT_FORMAT = 1


def save_policy(path: str | os.PathLike, policy: TokenPolicy) -> None:
    """Write config, observation shapes and weights to ``path`` atomically.

    The checkpoint is a ``torch.save`` of ``{"format": 1, "config": dict, "obs_shapes":
    {key: list}, "state_dict": ...}``, written atomically
    (:func:`harness_common.files.atomic_write`), so a crash never leaves a half-written file at
    ``path``.
    """
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "config": asdict(policy.config),
        "obs_shapes": {k: list(v) for k, v in policy.obs_shapes.items()},
        "state_dict": {k: v.detach().cpu() for k, v in policy.state_dict().items()},
    }
    atomic_write(path, lambda file: torch.save(checkpoint, file))


def load_policy(
    path: str | os.PathLike,
    observation_space: spaces.Dict | None = None,
    map_location: torch.device | str = "cpu",
) -> TokenPolicy:
    """Rebuild a policy written by :func:`save_policy`.

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
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a policy checkpoint of format {CHECKPOINT_FORMAT}")

    try:
        config = TokenPolicyConfig.from_saved(checkpoint["config"])
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    saved_shapes = {k: tuple(v) for k, v in checkpoint["obs_shapes"].items()}
    if observation_space is not None:
        wanted = obs_shapes_from_space(observation_space)
        if wanted != saved_shapes:
            raise ValueError(
                f"{path} was saved for observation shapes {saved_shapes}, not {wanted}"
            )
    policy = build_policy(config, saved_shapes)
    try:
        policy.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as error:
        message = f"weights in {path} do not fit the policy they describe: {error}"
        raise ValueError(message) from error
    return policy.to(map_location)
