"""Hydra's side: the schemas in its ConfigStore, composition, and the one conversion of a composed
``DictConfig`` into a validated :class:`~harness.config.train.TrainConfig`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.config.algos import ALGO_SCHEMAS
from harness.config.curriculum import CURRICULUM_SCHEMAS
from harness.config.errors import ConfigError
from harness.config.moved import check_moved
from harness.config.train import TrainConfig
from harness_common.paths import register_resolver

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
register_resolver()  # ${data_dir:} in the configs, however they are composed


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent): ``train_schema`` for the primary
    config, ``schema/algo/*`` and ``schema/curriculum/*`` for the group files; each policy kind
    stores its own ``schema/policy/<kind>`` when it registers."""
    from harness.policies import register_builtins  # the kinds store their own schemas

    register_builtins()
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for name, schema in ALGO_SCHEMAS.items():
        store.store(group="schema/algo", name=name, node=schema)
    for name, schema in CURRICULUM_SCHEMAS.items():
        store.store(group="schema/curriculum", name=name, node=schema)


def plugins_in(overrides: list[str]) -> list[str]:
    """The modules a ``plugins=[a,b]`` (or ``plugins=a``) override names, in order."""
    modules: list[str] = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") == "plugins":
            modules += [m.strip().strip("'\"") for m in value.strip("[]").split(",") if m.strip()]
    return modules


def import_plugins(modules) -> None:
    """Import the plugin modules, which register their kinds, heads or tasks.

    Raises:
        ConfigError: A module that cannot be imported, naming it.
    """
    from harness.policies import import_plugins as import_modules

    try:
        import_modules(list(modules))
    except ValueError as error:
        raise ConfigError(str(error)) from None


def load(cfg: DictConfig) -> TrainConfig:
    """Convert a composed ``DictConfig`` into a validated :class:`TrainConfig`, once, after
    importing its ``plugins``.

    Raises:
        ConfigError: A value is missing, has the wrong type, or breaks a rule; names the key.
    """
    import_plugins(cfg.get("plugins") or [])
    unknown = _unknown_keys(cfg)
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown}; check the spelling (added with '+'?)")
    try:
        config = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except OmegaConfBaseException as error:
        cause = error.__cause__ if isinstance(error.__cause__, ConfigError) else None
        if cause is not None:
            raise cause from None
        raise ConfigError(str(error)) from None
    if not isinstance(config, TrainConfig):
        raise ConfigError(f"expected a TrainConfig, composed a {type(config).__name__}")
    return config


def _unknown_keys(node: Any, path: str = "") -> list[str]:
    """Keys of typed nodes that their dataclass lacks (``+key=value`` slips past Hydra's check,
    and ``OmegaConf.to_object`` would drop them silently)."""
    if not isinstance(node, DictConfig):
        return []
    schema = OmegaConf.get_type(node)
    typed = dataclasses.is_dataclass(schema)
    names = {f.name for f in dataclasses.fields(schema)} if typed else None
    unknown = []
    for key in node.keys():
        dotted = f"{path}{key}"
        if names is not None and key not in names:
            unknown.append(dotted)
        elif names is not None:
            unknown += _unknown_keys(node._get_node(key), f"{dotted}.")
    return unknown


def compose(overrides: list[str] | None = None, config_dir: str | Path = CONF_DIR) -> TrainConfig:
    """Compose ``conf/train.yaml`` with command-line style overrides, outside ``@hydra.main``
    (tests, notebooks, sweeps driven from Python).

    Raises:
        ConfigError: As :func:`load`; Hydra's own errors (unknown group choice, unknown key) pass
            through unchanged since they already list the choices or name the key.
    """
    check_moved(overrides or [])
    import_plugins(plugins_in(list(overrides or [])))  # their heads are choices of policy/head
    register_configs()
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=list(overrides or []))
    return load(cfg)


def to_yaml(config: TrainConfig) -> str:
    """The resolved configuration as YAML (what ``config.yaml`` in a run dir holds)."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))

