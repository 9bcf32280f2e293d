"""The ``curriculum`` group: one schema per curriculum of ``harness.curriculum``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from harness.config.errors import check


@dataclass
class CurriculumConfig:
    """Base of the ``curriculum`` group (``harness.curriculum.make(name, **params)``).

    Attributes:
        name: ``fixed``, ``uniform``, ``linear`` or ``success_band``.
        num_bins: Bins of the per-difficulty success table.
        adr_key: Removed; must stay ``null`` (kept so that a config naming it is refused with
            the reason, and old ``config.yaml`` files holding ``adr_key: null`` still load).
    """

    name: str = MISSING
    num_bins: int = 10
    adr_key: str | None = None

    def __post_init__(self) -> None:
        check(self.adr_key is None,
              f"curriculum.adr_key={self.adr_key!r} was removed: it made the curriculum's "
              "difficulty drive one named task level (the others at task.difficulty), which "
              "is not domain randomisation. Automatic domain randomisation is the adr block "
              "(adr.enabled=true, adr.params.<range>.bounds=[low, high], docs/sim_to_real.md)")

    def params(self, task_difficulty: float, group_size: int) -> dict[str, Any]:
        """Keyword parameters of ``harness.curriculum.make`` (without ``seed``); ``group_size``
        is the trainer's G (read by the curricula that weigh bins by group signal)."""
        params = dataclasses.asdict(self)
        del params["name"], params["adr_key"]
        return params


@dataclass
class FixedCurriculumConfig(CurriculumConfig):
    """Always ``difficulty``; ``None`` plays the task's own ``task.difficulty``."""

    name: str = "fixed"
    difficulty: float | None = None

    def params(self, task_difficulty: float, group_size: int) -> dict[str, Any]:
        params = super().params(task_difficulty, group_size)
        if params["difficulty"] is None:
            params["difficulty"] = task_difficulty
        return params


@dataclass
class UniformCurriculumConfig(CurriculumConfig):
    """Uniform in [low, high]."""

    name: str = "uniform"
    low: float = 0.0
    high: float = 1.0


@dataclass
class LinearCurriculumConfig(CurriculumConfig):
    """From ``start`` to ``end`` over ``steps`` episodes."""

    name: str = "linear"
    start: float = 0.0
    end: float = 1.0
    steps: int = 1000


@dataclass
class SuccessBandCurriculumConfig(CurriculumConfig):
    """Favours difficulties whose success lies in [low, high] (see ``harness.curriculum``); its
    G is the trainer's ``algo.group_size``."""

    name: str = "success_band"
    low: float = 0.2
    high: float = 0.8
    explore: float = 0.1
    min_obs: int = 16
    initial_frontier: int = 0
    prior: float = 1.0
    decay: float = 0.98

    def params(self, task_difficulty: float, group_size: int) -> dict[str, Any]:
        return {**super().params(task_difficulty, group_size), "group_size": group_size}


# The schema each ``conf/curriculum/*.yaml`` names in its defaults list.
CURRICULUM_SCHEMAS: dict[str, type[CurriculumConfig]] = {
    "fixed": FixedCurriculumConfig,
    "uniform": UniformCurriculumConfig,
    "linear": LinearCurriculumConfig,
    "success_band": SuccessBandCurriculumConfig,
}
