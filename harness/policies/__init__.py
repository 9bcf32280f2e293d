"""Policies the group trainer fine-tunes, behind one contract.

* :class:`Policy` (:mod:`~harness.policies.contract`): what the trainers, rollouts, behaviour
  cloning, evaluation and export call; :class:`PolicySpec`: what its decisions look like.
* Kinds: ``mlp`` and ``tiny_vla`` (the harness's own networks, any action head), ``hf_vla`` (a
  ``transformers`` vision-language model) and ``smolvla`` (LeRobot's SmolVLA), each a
  subpackage that registers its config and builder (:func:`register_policy`).
* Heads (:mod:`~harness.policies.heads`): ``tokens``, ``gaussian``, ``flow``
  (:func:`register_head`); a user's own kinds and heads register from a plugin module
  (``plugins=[my_module]``, :func:`import_plugins`).

Importing this package imports no torch (a config composes without it): the names below load
their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from harness.policies.registry import (
    head_class,
    head_names,
    import_plugins,
    policy_entry,
    policy_kinds,
    register_builtins,
    register_head,
    register_policy,
)

_EXPORTS = {
    "Policy": "contract", "PolicySpec": "contract",
    "PolicyConfig": "config",
    "build_policy": "factory", "make": "factory", "config_from_saved": "factory",
    "load_policy": "saving", "save_policy": "saving",
    "obs_to_batch": "observations", "obs_shapes_from_space": "observations",
    "resolve_device": "devices",
    "actions_to_tokens": "heads.tokens", "tokens_to_actions": "heads.tokens",
    "sample_tokens": "heads.tokens",
}

__all__ = [
    "Policy", "PolicyConfig", "PolicySpec", "actions_to_tokens", "build_policy",
    "config_from_saved", "head_class", "head_names", "import_plugins", "load_policy", "make",
    "obs_shapes_from_space", "obs_to_batch", "policy_entry", "policy_kinds", "register_builtins",
    "register_head", "register_policy", "resolve_device", "sample_tokens", "save_policy",
    "tokens_to_actions",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
