"""``residual``: a frozen start policy plus a small zero-initialised Gaussian head whose action is
added to the start's greedy one (ResiP, Ankile et al. 2024; Policy Decorator, Yuan et al. 2024).

The group trainer builds it from the start policy when ``algo.residual.scale > 0``
(:func:`~harness.policies.residual.model.residual_of`); it is not a ``policy=`` choice of its
own. Importing this module registers the kind (no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.config.errors import check
from harness.policies.config import PolicyConfig
from harness.policies.registry import policy_entry, register_policy


def residual_head() -> dict[str, Any]:
    """The residual's Gaussian head: a std of ``e^-1`` (0.37 of the residual's range)."""
    return {"name": "gaussian", "log_std_init": -1.0}


@dataclass
class ResidualConfig(PolicyConfig):
    """A frozen base policy and a residual Gaussian head on its features.

    Attributes:
        base: The base policy's saved config (:meth:`PolicyConfig.to_saved`): an ``mlp`` or
            ``tiny_vla`` of any head.
        scale: The residual's largest size in action units: ``a = clip(a_base + scale *
            tanh(u), -1, 1)``, in ``(0, 2]``.
        head: The residual head's options (``gaussian``'s; its mean starts at zero).
    """

    families: ClassVar[tuple[str, ...]] = ()  # built by the trainer, not chosen by policy=

    name: str = "residual"
    base: Any = field(default_factory=dict)
    scale: float = 0.1
    head: Any = field(default_factory=residual_head)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(isinstance(self.scale, (int, float)) and math.isfinite(self.scale)
              and 0 < self.scale <= 2, f"residual scale={self.scale!r}; must be in (0, 2]")
        check(isinstance(self.base, dict) and self.base.get("name") in ("mlp", "tiny_vla"),
              f"a residual policy's base is an mlp or tiny_vla policy, not "
              f"{dict(self.base).get('name')!r}")
        check(dict(self.head).get("name") == "gaussian",
              f"a residual head is gaussian, not {dict(self.head).get('name')!r}")

    @property
    def reads(self) -> str:  # type: ignore[override]
        """The observation key the base reads."""
        return policy_entry(self.base["name"]).config_class.reads


register_policy("residual", ResidualConfig, "harness.policies.residual.model:ResidualPolicy")
