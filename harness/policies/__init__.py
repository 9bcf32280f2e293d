"""Policies the harness trains: action-token policies over a gymnasium ``Dict`` observation."""

from __future__ import annotations

import torch
from gymnasium import spaces

from harness.policies import (
    hf_vla,  # noqa: F401  (registers kind "hf_vla"; imports no model code)
    smolvla_policy,  # noqa: F401  (registers "smolvla"; no model code)
)
from harness.policies.encoders import MLPTokenPolicy, TinyVLA  # registers "mlp" and "tiny_vla"
from harness.policies.saving import load_policy, save_policy
from harness.policies.token_policy import TokenPolicy, build_policy
from harness.policies.tokens import (
    KINDS,
    TokenPolicyConfig,
    actions_to_tokens,
    obs_shapes_from_space,
    obs_to_batch,
    sample_tokens,
    tokens_to_actions,
)

__all__ = [
    "KINDS",
    "MLPTokenPolicy",
    "TinyVLA",
    "TokenPolicy",
    "TokenPolicyConfig",
    "actions_to_tokens",
    "build_policy",
    "load_policy",
    "make",
    "obs_shapes_from_space",
    "obs_to_batch",
    "resolve_device",
    "sample_tokens",
    "save_policy",
    "tokens_to_actions",
]


def make(config: TokenPolicyConfig, observation_space: spaces.Dict) -> TokenPolicy:
    """Build the policy ``config.kind`` names, sized from an environment's observation space.

    Args:
        config: The policy configuration.
        observation_space: The environment's ``Dict`` observation space.

    Returns:
        A freshly initialised policy.

    Raises:
        TypeError: The space is not a ``Dict`` of ``Box`` spaces.
        ValueError: The space lacks a key the policy needs (``state`` for ``mlp``, ``pixels``
            for ``tiny_vla``); the message names it.
    """
    return build_policy(config, obs_shapes_from_space(observation_space))


def resolve_device(name: str) -> torch.device:
    """The torch device a ``device`` option names, checked to be usable on this machine.

    Args:
        name: ``"auto"`` (CUDA if available, else Apple's MPS if available, else the CPU),
            ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.

    Returns:
        The device.

    Raises:
        ValueError: An unknown name, or a CUDA or MPS device this machine does not have; the
            message names the value.
    """
    mps_available = torch.backends.mps.is_available()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if mps_available else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={name!r}; expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r}, but CUDA is not available here; use 'auto' or 'cpu'")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device={name!r}, but this machine has "
                         f"{torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not mps_available:
        raise ValueError(f"device={name!r}, but MPS is not available here; use 'auto' or 'cpu'")
    return device
