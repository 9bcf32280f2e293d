"""Curricula that do not look at outcomes: a fixed difficulty, a uniform range, a linear ramp."""

from __future__ import annotations

from harness.curriculum.base import Curriculum, Seed, check_unit


class FixedCurriculum(Curriculum):
    """Always the same difficulty.

    Args:
        difficulty: The difficulty, in [0, 1].
        seed: See ``Curriculum``.
        num_bins: See ``Curriculum``.
    """

    def __init__(
        self,
        difficulty: float = 1.0,
        *,
        seed: Seed = 0,
        num_bins: int = 10,
    ) -> None:
        super().__init__(seed=seed, num_bins=num_bins)
        self.difficulty = check_unit("difficulty", difficulty)

    def sample(self) -> float:
        """Return the fixed difficulty."""
        return self.difficulty

    @property
    def frontier(self) -> float:
        """The fixed difficulty."""
        return self.difficulty


class UniformCurriculum(Curriculum):
    """Difficulty drawn uniformly from [low, high].

    Args:
        low: Lowest difficulty, in [0, 1].
        high: Highest difficulty, in [0, 1], above ``low``.
        seed: See ``Curriculum``.
        num_bins: See ``Curriculum``.
    """

    def __init__(
        self,
        low: float = 0.0,
        high: float = 1.0,
        *,
        seed: Seed = 0,
        num_bins: int = 10,
    ) -> None:
        super().__init__(seed=seed, num_bins=num_bins)
        self.low = check_unit("low", low)
        self.high = check_unit("high", high)
        if self.low >= self.high:
            raise ValueError(f"low must be < high, got low={low!r}, high={high!r}")

    def sample(self) -> float:
        """Draw uniformly from [low, high]."""
        return float(self._rng.uniform(self.low, self.high))

    @property
    def frontier(self) -> float:
        """``high``."""
        return self.high


class LinearCurriculum(Curriculum):
    """Difficulty moving linearly from ``start`` to ``end`` over ``steps`` updates.

    The schedule counts ``update`` calls (groups or episodes whose outcomes came back), not
    ``sample`` calls, so all groups drawn before one learning step share a difficulty; after
    ``steps`` updates the difficulty stays at ``end``.

    Args:
        start: Difficulty before any update, in [0, 1].
        end: Difficulty after ``steps`` updates, in [0, 1] (may be below ``start``).
        steps: Number of updates the ramp takes, at least 1.
        seed: See ``Curriculum``.
        num_bins: See ``Curriculum``.
    """

    def __init__(
        self,
        start: float = 0.0,
        end: float = 1.0,
        steps: int = 1000,
        *,
        seed: Seed = 0,
        num_bins: int = 10,
    ) -> None:
        super().__init__(seed=seed, num_bins=num_bins)
        self.start = check_unit("start", start)
        self.end = check_unit("end", end)
        if int(steps) != steps or steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
        self.steps = int(steps)

    def sample(self) -> float:
        """Return ``start + (end - start) * min(updates / steps, 1)``."""
        fraction = min(self._updates / self.steps, 1.0)
        return self.start + (self.end - self.start) * fraction

    @property
    def frontier(self) -> float:
        """The current difficulty."""
        return self.sample()
