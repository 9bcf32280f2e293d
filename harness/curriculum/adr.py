"""Automatic domain randomisation (ADR; OpenAI et al. 2019, "Solving Rubik's Cube with a Robot
Hand", section 5) over the scale ranges of the task's randomisation block and the scales of its
continuous imperfection levels.

Each parameter has a range ``[low, high]`` that starts at ``initial`` and stays inside hard
``bounds``. Every episode (the group trainer: every group, whose G attempts share one
randomised model) draws, with probability ``boundary_prob``, one parameter and one of its two
boundaries, both uniformly, and *pins* that parameter at that boundary (the range ``(b, b)``);
the other parameters keep their current ranges. Outcomes of a pinned episode go into the buffer
of that (parameter, boundary). Once the buffer holds ``buffer`` outcomes, their mean success
``s`` is read and the buffer emptied:

* ``s >= threshold_high``: the boundary moves out by ``step`` (``low - step`` or
  ``high + step``), never beyond the hard bound;
* ``s <= threshold_low``: it moves in by ``step``, never past the other boundary.

Episodes that pin nothing train on the current ranges and teach ADR nothing. The ranges reach
the environment as reset options: ``{"randomization": {name: (low, high)}}`` for the
randomisation ranges (``tasks.RandomizationConfig.with_ranges``) and ``{"imperfections": {name:
(low, high)}}`` for the scales of the imperfections of ``tasks.wrappers.SCALABLE`` (a scale
multiplies the configured level; ``tasks.wrappers``). Held-out evaluation never gets them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from harness.curriculum.base import Seed, check_unit
from tasks.wrappers import SCALABLE

if TYPE_CHECKING:
    from harness.config import AdrConfig

SIDES = ("low", "high")
ADR_STREAM = 2_019  # ADR's generator: [seed, ADR_STREAM], apart from the curriculum's


@dataclass(frozen=True)
class AdrParameter:
    """One randomised parameter's ADR settings.

    Attributes:
        initial: ``(low, high)`` range at the start (often the nominal point ``(1, 1)``).
        bounds: ``(min, max)`` hard bounds the range never leaves.
        step: How far a boundary moves at a time (the parameter's units: a scale).
    """

    initial: tuple[float, float] = (1.0, 1.0)
    bounds: tuple[float, float] = (0.5, 1.5)
    step: float = 0.05

    def check(self, name: str) -> None:
        """Raises ``ValueError`` naming ``name`` and the value that is out of range."""
        for field in ("initial", "bounds"):
            value = getattr(self, field)
            if len(value) != 2 or not all(math.isfinite(v) for v in value):
                raise ValueError(f"adr.params.{name}.{field}={list(value)}; expected "
                                 "[low, high], two finite numbers")
            if value[0] > value[1]:
                raise ValueError(f"adr.params.{name}.{field}={list(value)}: low > high")
        (low, high), (lowest, highest) = self.initial, self.bounds
        if not lowest <= low <= high <= highest:
            raise ValueError(f"adr.params.{name}.initial={list(self.initial)} lies outside its "
                             f"bounds {list(self.bounds)}")
        if not (math.isfinite(self.step) and self.step > 0):
            raise ValueError(f"adr.params.{name}.step={self.step!r}; expected a number > 0")


@dataclass(frozen=True)
class AdrEpisode:
    """What ADR chose for one episode or group.

    Attributes:
        ranges: ``{parameter: (low, high)}`` to play.
        pinned: ``(parameter, "low" | "high")`` when a boundary is pinned, else ``None``.
    """

    ranges: dict[str, tuple[float, float]]
    pinned: tuple[str, str] | None


class AutomaticDomainRandomization:
    """ADR's ranges, boundary buffers and seeded sampler (see the module docstring).

    Args:
        parameters: ``{name: AdrParameter}`` (or the same fields as a dict), at least one.
        threshold_low: Mean success at or below which a boundary moves in, in [0, 1].
        threshold_high: Mean success at or above which a boundary moves out, in [0, 1],
            above ``threshold_low``.
        buffer: Outcomes a boundary's buffer collects before they are read, at least 1.
        boundary_prob: Probability that an episode pins a boundary, in [0, 1].
        seed: Seed of ADR's own generator (with :data:`ADR_STREAM`).

    Raises:
        ValueError: An argument out of range, named with its value.
    """

    def __init__(self, parameters: Mapping[str, AdrParameter | Mapping[str, Any]],
                 threshold_low: float = 0.4, threshold_high: float = 0.8, buffer: int = 32,
                 boundary_prob: float = 0.5, *, seed: Seed = 0) -> None:
        if not parameters:
            raise ValueError("adr.params is empty; name at least one randomisation range")
        self.parameters = {name: p if isinstance(p, AdrParameter) else AdrParameter(
            **{k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in p.items()})
            for name, p in parameters.items()}
        for name, parameter in self.parameters.items():
            parameter.check(name)
        self.threshold_low = check_unit("adr.threshold_low", threshold_low)
        self.threshold_high = check_unit("adr.threshold_high", threshold_high)
        if self.threshold_low >= self.threshold_high:
            raise ValueError(f"adr.threshold_low={threshold_low} must be below "
                             f"adr.threshold_high={threshold_high}")
        if int(buffer) != buffer or buffer < 1:
            raise ValueError(f"adr.buffer={buffer!r}; expected an integer >= 1")
        self.buffer = int(buffer)
        self.boundary_prob = check_unit("adr.boundary_prob", boundary_prob)
        base = [int(seed)] if np.isscalar(seed) else [int(s) for s in seed]
        self._rng = np.random.default_rng([*base, ADR_STREAM])
        self.ranges = {name: tuple(map(float, p.initial)) for name, p in self.parameters.items()}
        self.buffers: dict[str, list[float]] = {f"{n}_{s}": [] for n in self.parameters
                                                for s in SIDES}

    def sample(self) -> AdrEpisode:
        """The ranges of the next episode (or group), one boundary pinned or none."""
        ranges = dict(self.ranges)
        pinned = None
        if self._rng.random() < self.boundary_prob:
            names = list(self.parameters)
            name = names[int(self._rng.integers(len(names)))]
            side = SIDES[int(self._rng.integers(2))]
            value = ranges[name][SIDES.index(side)]
            ranges[name], pinned = (value, value), (name, side)
        return AdrEpisode(ranges, pinned)

    @staticmethod
    def reset_options(episode: AdrEpisode) -> dict[str, Any]:
        """Gymnasium reset options that play ``episode``'s ranges: ``randomization`` with the
        randomisation ranges, and ``imperfections`` with the imperfection scales when ADR has
        any (names from ``tasks.wrappers.SCALABLE``)."""
        options: dict[str, Any] = {"randomization": {
            name: r for name, r in episode.ranges.items() if name not in SCALABLE}}
        imperfections = {name: r for name, r in episode.ranges.items() if name in SCALABLE}
        if imperfections:
            options["imperfections"] = imperfections
        return options

    def update(self, episode: AdrEpisode, successes: Sequence[bool | float]) -> None:
        """Record the outcomes of ``episode``; a boundary whose buffer is full moves.

        Raises:
            ValueError: An outcome outside [0, 1], or none.
        """
        outcomes = np.asarray(successes, dtype=np.float64).reshape(-1)
        if outcomes.size == 0 or np.any(~((outcomes >= 0.0) & (outcomes <= 1.0))):
            raise ValueError(f"successes must be booleans or floats in [0, 1], got {successes!r}")
        if episode.pinned is None:
            return
        name, side = episode.pinned
        buffer = self.buffers[f"{name}_{side}"]
        buffer.extend(outcomes.tolist())
        if len(buffer) < self.buffer:
            return
        success = float(np.mean(buffer))
        buffer.clear()
        if success >= self.threshold_high:
            self._move(name, side, outwards=True)
        elif success <= self.threshold_low:
            self._move(name, side, outwards=False)

    def _move(self, name: str, side: str, outwards: bool) -> None:
        parameter, (low, high) = self.parameters[name], self.ranges[name]
        lowest, highest = parameter.bounds
        step = parameter.step
        if side == "low":
            low = max(low - step, lowest) if outwards else min(low + step, high)
        else:
            high = min(high + step, highest) if outwards else max(high - step, low)
        # Rounded, so that ranges walked out and back land on the very numbers they left.
        self.ranges[name] = (round(low, 9), round(high, 9))

    def metrics(self) -> dict[str, float]:
        """``adr/<parameter>_low`` and ``adr/<parameter>_high``: the current ranges."""
        return {f"adr/{name}_{side}": value for name, bounds in self.ranges.items()
                for side, value in zip(SIDES, bounds, strict=True)}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically, as a JSON-able dict."""
        return {"rng": self._rng.bit_generator.state,
                "ranges": {name: list(r) for name, r in self.ranges.items()},
                "buffers": {key: list(values) for key, values in self.buffers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` into an ADR built with the same parameters.

        Raises:
            ValueError: No state (a run started without ADR), or one of other parameters.
        """
        if state is None:
            raise ValueError("the checkpoint holds no ADR state: the run started with "
                             "adr.enabled=false; resume it with the config it started with")
        if set(state["ranges"]) != set(self.ranges):
            raise ValueError(f"the ADR state holds parameters {sorted(state['ranges'])}; this "
                             f"run randomises {sorted(self.ranges)}")
        self._rng.bit_generator.state = state["rng"]
        self.ranges = {name: (float(r[0]), float(r[1])) for name, r in state["ranges"].items()}
        self.buffers = {key: [float(v) for v in values]
                        for key, values in state["buffers"].items()}


def make_adr(config: AdrConfig, seed: Seed) -> AutomaticDomainRandomization | None:
    """The run's ADR from its checked ``adr`` block (the trainers build it; the config only
    checks it).

    Args:
        config: The run's ``adr`` block (``harness.config.AdrConfig``).
        seed: The run's seed (ADR draws from its own stream of it, :data:`ADR_STREAM`).

    Returns:
        The ADR, or ``None`` when ``config.enabled`` is false.

    Raises:
        ValueError: A parameter, threshold, buffer or probability out of range, named with
            its value.
    """
    if not config.enabled:
        return None
    parameters = {name: AdrParameter(
        initial=(1.0, 1.0) if param.initial is None else tuple(param.initial),
        bounds=tuple(param.bounds), step=param.step) for name, param in config.params.items()}
    return AutomaticDomainRandomization(
        parameters, threshold_low=config.threshold_low, threshold_high=config.threshold_high,
        buffer=config.buffer, boundary_prob=config.boundary_prob, seed=seed)


class NextResetOptions(gym.Wrapper):
    """Adds the options given to :meth:`set_next` to the env's next reset, and to that reset
    only: how ADR's ranges reach an env that other code resets (the group trainer's start-state
    env, reset by its start sources). Every other attribute (``snapshot``...) reads through.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.pending: dict[str, Any] = {}

    def set_next(self, options: dict[str, Any]) -> None:
        """Options for the next reset (``{}`` withdraws pending ones)."""
        self.pending = dict(options)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        extra, self.pending = self.pending, {}
        return self.env.reset(seed=seed, options={**extra, **(options or {})})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)
