"""Policies the harness trains: action-token policies over a gymnasium ``Dict`` observation."""

from __future__ import annotations

from gymnasium import spaces

from harness.policies.token_policy import (
    KINDS,
    MLPTokenPolicy,
    TinyVLA,
    TokenPolicy,
    TokenPolicyConfig,
    actions_to_tokens,
    build_policy,
    load_policy,
    obs_shapes_from_space,
    obs_to_batch,
    save_policy,
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
