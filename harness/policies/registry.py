"""The one place that knows which policy kinds and action heads exist: each registers itself once,
by name, and a user's own register from a plugin module (``plugins=[my_module]``).

* :func:`register_policy` ``(name, config_class, build)``: the kind's config dataclass (its
  ``policy`` schema, checked when a run's config is loaded) and the function that builds the
  policy from a config and the observation shapes.
* :func:`register_head` ``(name, head_class)``: an :class:`~harness.policies.heads.ActionHead`
  subclass; its options are its ``Config`` dataclass (or, for a class without one, its
  keyword-only arguments).

A built-in kind or head registers with a ``"module:attribute"`` string instead of the object, so
that composing a config (``--help``, ``--cfg job``) imports no torch; the object is imported on
first use. This module imports neither torch nor any kind.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# Modules that register the built-in kinds and heads (imported by register_builtins()).
BUILTIN_MODULES: tuple[str, ...] = (
    "harness.policies.heads",
    "harness.policies.mlp",
    "harness.policies.tiny_vla",
    "harness.policies.hf_vla",
    "harness.policies.smolvla",
    "harness.policies.residual",
)


@dataclass(frozen=True)
class PolicyEntry:
    """A registered policy kind.

    Attributes:
        name: The kind (``policy=<name>``).
        config_class: Its config dataclass.
        build: ``(config, obs_shapes) -> policy``, or ``"module:function"`` until first use;
            ``None`` for a network another library builds (SB3's).
        module: The module that registered it (a saved policy names it, so loading imports it).
    """

    name: str
    config_class: type
    build: Callable[..., Any] | str | None
    module: str


@dataclass(frozen=True)
class HeadEntry:
    """A registered action head: its class (or ``"module:Class"`` until first use)."""

    name: str
    head: type | str
    module: str


_POLICIES: dict[str, PolicyEntry] = {}
_HEADS: dict[str, HeadEntry] = {}


def _resolve(target: Any) -> Any:
    """``target``, or the attribute a ``"module:attribute"`` string names."""
    if not isinstance(target, str):
        return target
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _module_of(target: Any) -> str:
    return target.partition(":")[0] if isinstance(target, str) else target.__module__


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{what} name {name!r}; need an identifier such as 'my_head'")
    return name


def register_policy(name: str, config_class: type, build: Callable[..., Any] | str | None,
                    module: str | None = None) -> None:
    """Register the policy kind ``name``: ``policy=<name>`` then takes ``config_class``'s fields.

    Registering the same name again replaces the entry (a module imported twice, a plugin that
    overrides a kind).

    Args:
        name: The kind.
        config_class: A dataclass whose ``name`` field defaults to ``name``; its
            ``__post_init__`` checks the values (raising ``ValueError`` naming them).
        build: ``(config, obs_shapes) -> policy``, a ``"module:function"`` string, or ``None``
            for a network that another library builds (SB3's ``cnn``).
        module: The module to import to have the kind (default: ``config_class``'s).

    Raises:
        ValueError: ``name`` is not an identifier, or ``config_class`` is not a dataclass.
    """
    _check_name(name, "policy kind")
    if not dataclasses.is_dataclass(config_class):
        raise ValueError(f"register_policy({name!r}, ...): the config {config_class!r} is not a "
                         "dataclass")
    _POLICIES[name] = PolicyEntry(name, config_class, build, module or config_class.__module__)
    from hydra.core.config_store import ConfigStore

    # The schema a ``conf/policy/<name>.yaml`` names (``/schema/policy@_here_: <name>``).
    ConfigStore.instance().store(group="schema/policy", name=name, node=config_class)


def register_head(name: str, head: type | str) -> None:
    """Register the action head ``name``: ``policy/head=<name>`` then builds ``head`` on mlp and
    tiny_vla policies. A head class without a ``Config`` dataclass gets one made from its
    keyword-only arguments (each needs a default).

    Args:
        name: The head's name.
        head: An :class:`~harness.policies.heads.ActionHead` subclass, or ``"module:Class"``.

    Raises:
        ValueError: ``name`` is not an identifier, or a keyword-only argument has no default.
    """
    _check_name(name, "action head")
    if not isinstance(head, str):
        _with_config(head)
        _store_head_node(name, head)
    _HEADS[name] = HeadEntry(name, head, _module_of(head))


def _with_config(head: type) -> type:
    """``head`` with a ``Config`` dataclass of its options (made from its keyword-only arguments
    when it defines none)."""
    if dataclasses.is_dataclass(head.__dict__.get("Config")):
        return head
    options = []
    for parameter in inspect.signature(head).parameters.values():
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        if parameter.default is inspect.Parameter.empty:
            raise ValueError(f"{head.__name__}'s option {parameter.name!r} has no default; "
                             "give every keyword-only argument a default, or a Config dataclass")
        kind = parameter.annotation if isinstance(parameter.annotation, type) else Any
        options.append((parameter.name, kind, dataclasses.field(default=parameter.default)))
    config = dataclasses.make_dataclass("Config", options)
    config.__module__ = head.__module__  # picklable where the head is
    config.__qualname__ = f"{head.__qualname__}.Config"
    head.Config = config
    return head


def _store_head_node(name: str, head: type) -> None:
    """Make ``policy/head=<name>`` a choice of Hydra's config group, with the head's defaults
    (the built-in heads have YAML files instead)."""
    from hydra.core.config_store import ConfigStore

    defaults = {field.name: field.default for field in dataclasses.fields(head.Config)
                if field.default is not dataclasses.MISSING}
    ConfigStore.instance().store(group="policy/head", name=name, node={"name": name, **defaults})


def register_builtins() -> None:
    """Import the modules that register the built-in kinds and heads (idempotent)."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def _order(module: str) -> int:
    """Where a kind or head registered by ``module`` is listed: the built-in ones in
    :data:`BUILTIN_MODULES` order (whichever was imported first), then the others."""
    for position, builtin in enumerate(BUILTIN_MODULES):
        if module == builtin or module.startswith(builtin + "."):
            return position
    return len(BUILTIN_MODULES)


def policy_kinds(family: str | None = None) -> tuple[str, ...]:
    """The registered kinds (of one algorithm family: ``group`` or ``sb3``), the built-in
    ones first."""
    register_builtins()
    entries = sorted(_POLICIES.values(), key=lambda entry: _order(entry.module))
    return tuple(entry.name for entry in entries
                 if family is None or family in entry.config_class.families)


def policy_entry(name: str) -> PolicyEntry:
    """The registered kind ``name``.

    Raises:
        ValueError: An unknown kind, naming the registered ones.
    """
    register_builtins()
    if name not in _POLICIES:
        raise ValueError(f"policy kind {name!r} is not registered; the kinds are "
                         f"{tuple(_POLICIES)} (a kind of your own: plugins=[<its module>])")
    return _POLICIES[name]


def head_names() -> tuple[str, ...]:
    """The registered action heads."""
    register_builtins()
    return tuple(_HEADS)


def head_class(name: str) -> type:
    """The head class registered as ``name`` (imported on first use), with its ``Config``.

    Raises:
        ValueError: An unknown head, naming the registered ones.
    """
    register_builtins()
    if name not in _HEADS:
        raise ValueError(f"action head {name!r} is not registered; the heads are "
                         f"{tuple(_HEADS)} (a head of your own: plugins=[<its module>])")
    entry = _HEADS[name]
    if isinstance(entry.head, str):
        entry = HeadEntry(name, _with_config(_resolve(entry.head)), entry.module)
        _HEADS[name] = entry
    return entry.head


def head_module(name: str) -> str:
    """The module that registered the head ``name`` (a saved policy names it)."""
    head_class(name)
    return _HEADS[name].module


def build_function(name: str) -> Callable[..., Any]:
    """The build function of the kind ``name`` (imported on first use).

    Raises:
        ValueError: An unknown kind, or one that another library builds.
    """
    entry = policy_entry(name)
    if entry.build is None:
        raise ValueError(f"policy={name!r} is built by Stable-Baselines3, not by "
                         "harness.policies; its algorithms are ppo, a2c and trpo")
    return _resolve(entry.build)


def import_plugins(modules: Iterable[str]) -> None:
    """Import each plugin module, which registers its kinds, heads (or tasks) as it loads.

    Raises:
        ValueError: A module that cannot be imported, naming it and the error.
    """
    for module in modules:
        if not isinstance(module, str) or not module:
            raise ValueError(f"plugins: {module!r} is not a module name such as 'my_heads'")
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(f"plugins: cannot import {module!r} ({error}); the module must be "
                             "importable (on PYTHONPATH, or installed)") from None
