"""The ``adr`` block: automatic domain randomisation over the task's randomisation ranges
(``harness.curriculum.adr``), for SB3 and the group trainer alike."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import tasks
from harness.config.errors import ConfigError, check
from harness.curriculum.adr import AdrParameter, AutomaticDomainRandomization
from tasks.randomization import RANGE_KEYS, check_range


@dataclass
class AdrParamConfig:
    """One randomised range (``adr.params.<name>``, a key of ``tasks.randomization.RANGE_KEYS``).

    Attributes:
        bounds: ``[min, max]`` hard bounds of the scale (``0 < min <= max``).
        initial: ``[low, high]`` at the start, inside ``bounds``; ``None``: the nominal
            ``[1.0, 1.0]``.
        step: How far a boundary moves at a time.
    """

    bounds: list[float] = field(default_factory=lambda: [0.5, 1.5])
    initial: list[float] | None = None
    step: float = 0.05

    def parameter(self) -> AdrParameter:
        initial = [1.0, 1.0] if self.initial is None else self.initial
        return AdrParameter(tuple(initial), tuple(self.bounds), self.step)


@dataclass
class AdrConfig:
    """Automatic domain randomisation (``adr``; docs/sim_to_real.md). Off by default.

    Held-out evaluation never plays ADR's ranges: it plays ``task.randomization`` as configured
    (off by default).

    Attributes:
        enabled: Widen and narrow ``params`` from training outcomes.
        params: ``{range name: {bounds, initial, step}}`` (:class:`AdrParamConfig`); names
            from ``tasks.randomization.RANGE_KEYS`` that change something in the task's scene
            (``task`` decides: ``object_size`` needs free objects). A free-form dict, so the
            command line adds ranges with ``+``: ``+adr.params.friction.bounds=[0.5,2.0]``.
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

    def check(self, task: str) -> None:
        """Validate against ``task``'s scene; every error names the key and the value.

        Raises:
            ConfigError: An unknown range, bounds the randomisation block refuses, thresholds,
                buffer or probability out of range, or ``enabled`` without ``params``.
        """
        if not self.enabled:
            return
        check(bool(self.params), "adr.enabled=true with no adr.params: name the ranges to "
                                 f"widen, e.g. adr.params.friction.bounds=[0.5,2.0] "
                                 f"(ranges: {list(RANGE_KEYS)})")
        env = tasks.make(task)
        present = env.unwrapped.randomization_ranges()
        env.close()
        for name, param in self.params.items():
            check(name in present,
                  f"adr.params.{name}: not a randomisation range of task {task!r}; its ranges "
                  f"are {list(present)}")
            try:
                check_range(name, param.bounds)
            except ValueError as error:
                raise ConfigError(f"adr.params.{name}.bounds: {error}") from None
        try:
            self.build(seed=0)
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def build(self, seed: int) -> AutomaticDomainRandomization | None:
        """The run's ADR (``None`` when off)."""
        if not self.enabled:
            return None
        return AutomaticDomainRandomization(
            {name: param.parameter() for name, param in self.params.items()},
            threshold_low=self.threshold_low, threshold_high=self.threshold_high,
            buffer=self.buffer, boundary_prob=self.boundary_prob, seed=seed)
