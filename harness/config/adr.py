"""The ``adr`` block: automatic domain randomisation over the task's randomisation ranges and
the scales of its continuous imperfections, for SB3 and the group trainer alike. This is the
schema and its checks; the trainers build the ADR (``harness.curriculum.make_adr``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import tasks
from harness.config.errors import ConfigError, check
from tasks.randomization import RANGE_KEYS, check_range
from tasks.wrappers import SCALABLE

DISCRETE_IMPERFECTIONS = ("action_latency", "dropped_frames")  # refused with their own reason


@dataclass
class AdrParamConfig:
    """One randomised range (``adr.params.<name>``): a key of ``tasks.randomization.RANGE_KEYS``
    or an imperfection of ``tasks.wrappers.SCALABLE``, whose scale multiplies the configured
    level ``task.imperfections.<name>``.

    Attributes:
        bounds: ``[min, max]`` hard bounds of the scale (``0 < min <= max``; an imperfection's
            ``0 <= min <= max``, 0 turning it off).
        initial: ``[low, high]`` at the start, inside ``bounds``; ``None``: the nominal
            ``[1.0, 1.0]``.
        step: How far a boundary moves at a time.
    """

    bounds: list[float] = field(default_factory=lambda: [0.5, 1.5])
    initial: list[float] | None = None
    step: float = 0.05

    def check(self, name: str) -> None:
        """Check the pairs, that ``initial`` lies inside ``bounds`` and the step.

        Args:
            name: The range's name, for the messages (``adr.params.<name>``).

        Raises:
            ConfigError: A pair that is not two finite numbers low <= high, an initial range
                outside the bounds, or a step that is not > 0.
        """
        initial = [1.0, 1.0] if self.initial is None else list(self.initial)
        for key, pair in (("initial", initial), ("bounds", list(self.bounds))):
            check(len(pair) == 2 and all(isinstance(v, (int, float)) and math.isfinite(v)
                                         for v in pair),
                  f"adr.params.{name}.{key}={pair}; expected [low, high], two finite numbers")
            check(pair[0] <= pair[1], f"adr.params.{name}.{key}={pair}: low > high")
        check(self.bounds[0] <= initial[0] <= initial[1] <= self.bounds[1],
              f"adr.params.{name}.initial={initial} lies outside its bounds "
              f"{list(self.bounds)}")
        check(math.isfinite(self.step) and self.step > 0,
              f"adr.params.{name}.step={self.step!r}; expected a number > 0")


@dataclass
class AdrConfig:
    """Automatic domain randomisation (``adr``; docs/sim_to_real.md). Off by default.

    Held-out evaluation never plays ADR's ranges: it plays ``task.randomization`` as configured
    (off by default).

    Attributes:
        enabled: Widen and narrow ``params`` from training outcomes.
        params: ``{range name: {bounds, initial, step}}`` (:class:`AdrParamConfig`); names
            from ``tasks.randomization.RANGE_KEYS`` that change something in the task's scene
            (``task`` decides: ``object_size`` needs free objects), or imperfections of
            ``tasks.wrappers.SCALABLE`` whose configured level is on (> 0). A free-form dict,
            so the command line adds ranges with ``+``: ``+adr.params.friction.bounds=[0.5,2.0]``.
        threshold_low: Boundary success at or below which the boundary moves in.
        threshold_high: Boundary success at or above which it moves out.
        buffer: Outcomes collected at a boundary before they are read.
        boundary_prob: Probability that an episode (a group) pins one boundary.
    """

    enabled: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    threshold_low: float = 0.4
    threshold_high: float = 0.8
    buffer: int = 32
    boundary_prob: float = 0.5

    def __post_init__(self) -> None:
        allowed = [f.name for f in fields(AdrParamConfig)]
        params = {}
        for name, value in dict(self.params).items():
            if isinstance(value, AdrParamConfig):
                params[name] = value
                continue
            check(isinstance(value, dict), f"adr.params.{name}={value!r}; expected a mapping "
                                           f"of {allowed}")
            unknown = sorted(set(value) - set(allowed))
            check(not unknown, f"adr.params.{name}: unknown field(s) {unknown}; allowed: "
                               f"{allowed}")
            params[name] = AdrParamConfig(**value)
        self.params = params

    def check(self, task: str, imperfections: Mapping[str, Any] | None = None) -> None:
        """Validate against ``task``'s scene and its configured imperfections
        (``task.imperfections``); every error names the key and the value.

        Raises:
            ConfigError: An unknown range, bounds the randomisation block refuses, an
                imperfection that is off or not continuous, a negative imperfection bound,
                thresholds, buffer or probability out of range, or ``enabled`` without
                ``params``.
        """
        if not self.enabled:
            return
        check(bool(self.params), "adr.enabled=true with no adr.params: name the ranges to "
                                 f"widen, e.g. adr.params.friction.bounds=[0.5,2.0] "
                                 f"(ranges: {list(RANGE_KEYS)}; imperfections: "
                                 f"{list(SCALABLE)})")
        env = tasks.make(task)
        present = env.unwrapped.randomization_ranges()
        env.close()
        for name, param in self.params.items():
            if name in SCALABLE:
                _check_imperfection(name, param, dict(imperfections or {}))
            else:
                _check_range(name, param, task, present)
            param.check(name)
        for key in ("threshold_low", "threshold_high", "boundary_prob"):
            value = getattr(self, key)
            check(0.0 <= value <= 1.0, f"adr.{key} must be in [0, 1], got {value!r}")
        check(self.threshold_low < self.threshold_high,
              f"adr.threshold_low={self.threshold_low} must be below "
              f"adr.threshold_high={self.threshold_high}")
        check(self.buffer >= 1, f"adr.buffer={self.buffer!r}; expected an integer >= 1")


def _check_range(name: str, param: AdrParamConfig, task: str, present: tuple[str, ...]) -> None:
    """``adr.params.<name>`` of a randomisation range: one that changes something in
    ``task``'s scene (``present``), with bounds the randomisation block accepts."""
    check(name not in DISCRETE_IMPERFECTIONS,
          f"adr.params.{name} (bounds {list(param.bounds)}): ADR does not scale "
          f"{name} (whole steps or a per-frame event, not a noise level); it scales "
          f"the continuous imperfections {list(SCALABLE)}")
    check(name in present,
          f"adr.params.{name}: not a randomisation range of task {task!r}; its ranges "
          f"are {list(present)}, and the imperfections ADR scales are "
          f"{list(SCALABLE)}")
    try:
        check_range(name, param.bounds)
    except ValueError as error:
        raise ConfigError(f"adr.params.{name}.bounds: {error}") from None


def _check_imperfection(name: str, param: AdrParamConfig, levels: dict[str, Any]) -> None:
    """``adr.params.<name>`` of an imperfection: a scale of ``task.imperfections.<name>``,
    which must be on, with ``0 <= min <= max`` (control jitter: ``level * max < 1``)."""
    level = levels.get(name, 0.0)
    check(isinstance(level, (int, float)) and level > 0,
          f"adr.params.{name}: task.imperfections.{name}={level!r} is off, so there is no "
          f"level to scale; set task.imperfections.{name} > 0 (the level ADR's scale 1 plays)")
    bounds = list(param.bounds)
    check(len(bounds) == 2 and all(isinstance(b, (int, float)) and math.isfinite(b)
                                   for b in bounds) and 0 <= bounds[0] <= bounds[1],
          f"adr.params.{name}.bounds={bounds}; expected a scale range [min, max] with "
          "0 <= min <= max (a scale of the configured level; 0 turns it off)")
    check(name != "control_jitter" or level * bounds[1] < 1,
          f"adr.params.{name}.bounds={bounds}: max {bounds[1]} times task.imperfections."
          f"{name}={level} must stay below 1 (a fraction of the control period)")
