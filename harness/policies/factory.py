"""Building a policy from its config: the registered kind's build function, on checked
observation shapes; and a config from the plain values a saved policy holds (any format)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gymnasium import spaces

from harness.policies.observations import ObsShapes, check_obs_shapes, obs_shapes_from_space
from harness.policies.registry import build_function, import_plugins, policy_entry


def build_policy(config, obs_shapes: ObsShapes):
    """Build the policy ``config.name`` names for observations of the given shapes.

    Args:
        config: A registered kind's config.
        obs_shapes: Shape of one observation per key, without the batch dimension.

    Returns:
        A freshly initialised policy (it meets :class:`harness.policies.Policy`).

    Raises:
        ValueError: The observations lack the key the kind reads, or a shape is malformed.
    """
    build = build_function(config.name)
    check_obs_shapes(config.name, config.reads, obs_shapes)
    return build(config, obs_shapes)


def make(config, observation_space: spaces.Dict):
    """:func:`build_policy` sized from an environment's ``Dict`` observation space.

    Raises:
        TypeError: The space is not a ``Dict`` of ``Box`` spaces.
        ValueError: The space lacks a key the policy needs (``state`` for ``mlp``, ``pixels``
            for ``tiny_vla``); the message names it.
    """
    return build_policy(config, obs_shapes_from_space(observation_space))


def config_from_saved(saved: Mapping[str, Any], plugins: tuple[str, ...] = ()):
    """The kind's config from the plain values a saved policy holds: this format's
    (``{"name": <kind>, ...}``, :meth:`~harness.policies.config.PolicyConfig.to_saved`) or
    format 1's (``{"kind": <kind>, ...}``, every kind's fields in one record), after importing
    the ``plugins`` that registered its kind or head.

    Raises:
        ValueError: An unknown kind, a field the kind does not have, or a value it refuses.
    """
    import_plugins(plugins)
    saved = dict(saved)
    if "kind" in saved and "name" not in saved:  # format 1
        config_class = policy_entry(saved["kind"]).config_class
        saved = config_class.format1_values(saved)
    config_class = policy_entry(saved.get("name")).config_class
    names = {f for f in config_class.__dataclass_fields__}
    unknown = sorted(set(saved) - names)
    if unknown:
        raise ValueError(f"policy config fields {unknown} are unknown to policy="
                         f"{saved['name']!r} of this version")
    return config_class(**saved)


def policy_plugins(config) -> tuple[str, ...]:
    """The plugin modules a policy of ``config`` needs (its kind's and head's, when they are not
    the package's own): what a saved policy records, so that loading it imports them."""
    from harness.policies.registry import head_module

    modules = [policy_entry(config.name).module]
    head = getattr(config, "head", None)
    if isinstance(head, Mapping):
        modules.append(head_module(head["name"]))
    return tuple(dict.fromkeys(m for m in modules if not m.startswith("harness.")))
