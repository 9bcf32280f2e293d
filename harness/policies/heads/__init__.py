"""Action heads: features ``(B, F)`` -> a distribution over a chunk of actions (one decision).

One family, one contract (:class:`ActionHead`): ``tokens`` (:class:`TokenHead`, ``K`` categorical
bins per action dimension, as RT-2 and OpenVLA), ``gaussian`` (:class:`GaussianHead`, a
tanh-squashed diagonal Gaussian) and ``flow`` (:class:`FlowHead`, flow matching sampled with
Flow-Noise, whose chain SmolVLA shares). Each is registered here by name
(:func:`harness.policies.register_head`); a user's own head registers the same way from a plugin
module. Importing this package imports no torch: the classes load on first use.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from harness.policies.registry import head_class, register_head

register_head("tokens", "harness.policies.heads.tokens:TokenHead")
register_head("gaussian", "harness.policies.heads.gaussian:GaussianHead")
register_head("flow", "harness.policies.heads.flow:FlowHead")


def make_head(name: str, feature_dim: int, chunk_size: int, action_dim: int = 4,
              **options: Any):
    """Build the registered action head ``name``.

    Args:
        name: ``tokens``, ``gaussian``, ``flow`` or a plugin's head.
        feature_dim: ``F``, width of the features the head reads.
        chunk_size: ``H``, actions per decision.
        action_dim: ``A``, dimensions of one action.
        **options: The head's options (the fields of its ``Config``).

    Returns:
        A freshly initialised head.

    Raises:
        ValueError: An unknown head or option (the choices named), or a bad size or option
            value (the value named).
    """
    head = head_class(name)
    known = tuple(field.name for field in dataclasses.fields(head.Config))
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"options {unknown} are unknown to the {name!r} action head; it takes "
                         f"{known}")
    return head(feature_dim, chunk_size, action_dim, **options)


def noise_bounded(name: str) -> bool:
    """Whether the registered head ``name`` has a noise scale ``algo.exploration`` can bound
    (it overrides :meth:`ActionHead.bound_noise`)."""
    from harness.policies.heads.base import ActionHead

    return head_class(name).bound_noise is not ActionHead.bound_noise


_EXPORTS = {
    "ActionHead": "base", "BCScores": "base", "Decision": "base",
    "gaussian_log_density": "base", "uniforms_to_normals": "base",
    "TokenHead": "tokens", "actions_to_tokens": "tokens", "tokens_to_actions": "tokens",
    "sample_tokens": "tokens", "GaussianHead": "gaussian", "FlowHead": "flow",
}
__all__ = [
    "ActionHead", "BCScores", "Decision", "FlowHead", "GaussianHead", "TokenHead",
    "actions_to_tokens", "gaussian_log_density", "sample_tokens", "tokens_to_actions",
    "make_head", "noise_bounded", "uniforms_to_normals",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
