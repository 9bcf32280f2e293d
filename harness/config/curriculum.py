"""The ``curriculum`` group: one schema per curriculum of ``harness.curriculum``, each checking
its own values (the trainers build the curriculum with ``harness.curriculum.make``)."""

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
        check(self.num_bins >= 1, f"curriculum.num_bins={self.num_bins}; must be >= 1")
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

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.difficulty is None or 0.0 <= self.difficulty <= 1.0,
              f"curriculum.difficulty={self.difficulty}; expected a difficulty in [0, 1] or "
              "null (task.difficulty)")

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

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_band(self.low, self.high)


@dataclass
class LinearCurriculumConfig(CurriculumConfig):
    """From ``start`` to ``end`` over ``steps`` episodes."""

    name: str = "linear"
    start: float = 0.0
    end: float = 1.0
    steps: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_unit("start", self.start)
        _check_unit("end", self.end)
        check(self.steps >= 1, f"curriculum.steps={self.steps}; must be >= 1")


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

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_band(self.low, self.high)
        _check_unit("explore", self.explore)
        check(self.min_obs >= 0, f"curriculum.min_obs={self.min_obs}; must be >= 0")
        check(0 <= self.initial_frontier < self.num_bins,
              f"curriculum.initial_frontier={self.initial_frontier}; expected a bin in "
              f"[0, {self.num_bins - 1}] (curriculum.num_bins={self.num_bins})")
        check(self.prior > 0, f"curriculum.prior={self.prior}; must be > 0")
        check(0.0 < self.decay <= 1.0, f"curriculum.decay={self.decay}; expected (0, 1]")

    def params(self, task_difficulty: float, group_size: int) -> dict[str, Any]:
        return {**super().params(task_difficulty, group_size), "group_size": group_size}


def _check_unit(key: str, value: float) -> None:
    check(0.0 <= value <= 1.0, f"curriculum.{key}={value}; expected a number in [0, 1]")


def _check_band(low: float, high: float) -> None:
    """``curriculum.low`` < ``curriculum.high``, both in [0, 1]."""
    _check_unit("low", low)
    _check_unit("high", high)
    check(low < high, f"curriculum.low={low} must be below curriculum.high={high}")


# The schema each ``conf/curriculum/*.yaml`` names in its defaults list.
CURRICULUM_SCHEMAS: dict[str, type[CurriculumConfig]] = {
    "fixed": FixedCurriculumConfig,
    "uniform": UniformCurriculumConfig,
    "linear": LinearCurriculumConfig,
    "success_band": SuccessBandCurriculumConfig,
}
