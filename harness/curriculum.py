"""Difficulty curricula: choose how hard the next episode is, learn from its outcome.

Difficulty is a float in [0, 1] that tasks map onto their level parameters (spawn ranges, goal
distance, distractors, randomisation ranges). Every curriculum has the same small surface:

* ``sample() -> float``: the difficulty of the next group (or episode);
* ``update(difficulty, successes)``: the binary (or fractional) outcomes observed there;
* ``metrics() -> dict[str, float]``: ``curriculum/...`` keys for the run loop to log;
* ``state_dict()`` / ``load_state_dict(state)``: plain JSON-able dicts, RNG included, so that a
  resumed run samples exactly what the uninterrupted run would have.

Why a success band: a group of G attempts at a start state whose success probability is p gives
GRPO a learning signal only when its outcomes are not all equal, which happens with probability
``signal_probability(p, G) = 1 - p**G - (1 - p)**G``. That is near zero when p is near 0 or 1, so
``success_band`` spends its samples where p is mid-range and widens the range of difficulties as
the policy improves (in the spirit of ADR, Akkaya et al. 2019, and of DAPO's dynamic sampling).

Build one with ``make(name, **params)``; ``tasks=[...]`` gives one curriculum per task.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "CURRICULA",
    "Curriculum",
    "FixedCurriculum",
    "LinearCurriculum",
    "MultiTaskCurriculum",
    "SuccessBandCurriculum",
    "SuccessTable",
    "UniformCurriculum",
    "make",
    "no_signal_probability",
    "signal_probability",
]

Seed = int | Sequence[int]


def signal_probability(p: float | np.ndarray, group_size: int) -> float | np.ndarray:
    """Probability that a group of Bernoulli(p) outcomes is not all equal.

    A group-relative advantage ((r - mean) / std as in GRPO, Shao et al. 2024) is zero for every
    attempt when all G rewards are equal, so only groups with mixed outcomes carry gradient:
    ``1 - p**G - (1 - p)**G``.

    Args:
        p: Success probability of one attempt, in [0, 1]; a scalar or an array of any shape.
        group_size: Number of attempts G in the group, at least 1.

    Returns:
        The probability, with the shape of ``p`` (a float for a scalar ``p``).

    Raises:
        ValueError: If ``p`` lies outside [0, 1] or ``group_size`` < 1.
    """
    return 1.0 - no_signal_probability(p, group_size)


def no_signal_probability(p: float | np.ndarray, group_size: int) -> float | np.ndarray:
    """Probability that a group of Bernoulli(p) outcomes is all successes or all failures.

    ``p**G + (1 - p)**G``; e.g. p = 0.05, G = 8 gives 0.6634: two groups in three are wasted.

    Args:
        p: Success probability of one attempt, in [0, 1]; a scalar or an array of any shape.
        group_size: Number of attempts G in the group, at least 1.

    Returns:
        The probability, with the shape of ``p`` (a float for a scalar ``p``).

    Raises:
        ValueError: If ``p`` lies outside [0, 1] or ``group_size`` < 1.
    """
    if int(group_size) != group_size or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    p_arr = np.asarray(p, dtype=np.float64)
    if np.any((p_arr < 0.0) | (p_arr > 1.0)) or np.any(np.isnan(p_arr)):
        raise ValueError(f"p must be in [0, 1], got {p!r}")
    prob = p_arr**group_size + (1.0 - p_arr) ** group_size
    return float(prob) if prob.ndim == 0 else prob


def _check_unit(name: str, value: float) -> float:
    """Return ``value`` as a float, raising if it is not in [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


class SuccessTable:
    """Per-bin success estimates over [0, 1] from discounted Beta counts.

    Bin ``i`` covers difficulties [i / num_bins, (i + 1) / num_bins) (the last bin includes 1).
    Each bin holds a Beta(prior + s, prior + f) posterior whose counts s, f are discounted: before
    n new outcomes are added, both are multiplied by ``decay**n``, so the estimate follows roughly
    the last ``1 / (1 - decay)`` outcomes as the policy improves (``decay=1`` keeps plain counts).
    The estimate is the posterior mean, so an unseen bin reads 0.5. Each bin also keeps discounted
    counts of groups (updates of two or more outcomes) and of informative ones (outcomes not all
    equal), discounted alike: the observed signal, which ``success_band`` can weigh bins by.
    Counts are discounted only when their bin receives outcomes, so a bin left unsampled keeps
    them however old they are; ``reset_bin`` clears them. ``samples`` is the cumulative number of
    outcomes per bin and is never cleared.

    Args:
        num_bins: Number of bins, at least 1.
        prior: Pseudo-count of successes and of failures, > 0.
        decay: Per-outcome discount of old counts, in (0, 1].

    Raises:
        ValueError: If an argument is out of range.
    """

    def __init__(self, num_bins: int = 10, prior: float = 1.0, decay: float = 0.98) -> None:
        if int(num_bins) != num_bins or num_bins < 1:
            raise ValueError(f"num_bins must be an integer >= 1, got {num_bins!r}")
        if not prior > 0.0:
            raise ValueError(f"prior must be > 0, got {prior!r}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.num_bins = int(num_bins)
        self.prior = float(prior)
        self.decay = float(decay)
        self.successes = np.zeros(self.num_bins)
        self.failures = np.zeros(self.num_bins)
        self.samples = np.zeros(self.num_bins, dtype=np.int64)
        self.groups = np.zeros(self.num_bins)
        self.informative = np.zeros(self.num_bins)

    def bin_of(self, difficulty: float) -> int:
        """Index of the bin holding ``difficulty`` (in [0, 1])."""
        return min(int(difficulty * self.num_bins), self.num_bins - 1)

    def bin_range(self, index: int) -> tuple[float, float]:
        """Lower and upper difficulty of bin ``index``."""
        return index / self.num_bins, (index + 1) / self.num_bins

    def record(self, index: int, outcomes: np.ndarray) -> None:
        """Add outcomes (each in [0, 1]) observed at bin ``index``."""
        discount = self.decay ** len(outcomes)
        self.successes[index] = self.successes[index] * discount + outcomes.sum()
        self.failures[index] = self.failures[index] * discount + (1.0 - outcomes).sum()
        self.samples[index] += len(outcomes)
        self.groups[index] *= discount
        self.informative[index] *= discount
        if len(outcomes) >= 2:
            self.groups[index] += 1.0
            self.informative[index] += float(outcomes.min() != outcomes.max())

    def reset_bin(self, index: int) -> None:
        """Clear the success, failure, group and informative counts of bin ``index``.

        The bin's estimate returns to the prior (0.5); its cumulative ``samples`` are kept.
        """
        self.successes[index] = 0.0
        self.failures[index] = 0.0
        self.groups[index] = 0.0
        self.informative[index] = 0.0

    def estimate(self) -> np.ndarray:
        """Posterior-mean success probability of every bin, shape (num_bins,)."""
        return (self.successes + self.prior) / (self.successes + self.failures + 2 * self.prior)

    def state_dict(self) -> dict[str, Any]:
        """Counts as plain lists."""
        return {
            "successes": self.successes.tolist(),
            "failures": self.failures.tolist(),
            "samples": self.samples.tolist(),
            "groups": self.groups.tolist(),
            "informative": self.informative.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counts written by ``state_dict`` (group counts start at zero for states
        written before they were kept)."""
        if len(state["samples"]) != self.num_bins:
            raise ValueError(
                f"state has {len(state['samples'])} bins, this table has {self.num_bins}"
            )
        self.successes = np.asarray(state["successes"], dtype=np.float64)
        self.failures = np.asarray(state["failures"], dtype=np.float64)
        self.samples = np.asarray(state["samples"], dtype=np.int64)
        self.groups = np.asarray(state.get("groups", np.zeros(self.num_bins)), dtype=np.float64)
        self.informative = np.asarray(
            state.get("informative", np.zeros(self.num_bins)), dtype=np.float64
        )


class Curriculum(ABC):
    """Shared bookkeeping: seeded RNG, per-bin success table, signal fraction, state.

    Subclasses implement ``sample`` and may react to outcomes in ``_after_update``.

    Args:
        seed: Seed of the curriculum's own ``numpy.random.Generator``.
        num_bins: Bins of the success table that ``metrics`` reports (and ``success_band`` uses).
        prior: Beta prior pseudo-count of the success table.
        decay: Per-outcome discount of the success table.
        adr_key: Optional name of a task level parameter (e.g. a domain-randomisation scale) that
            the difficulty drives; ``reset_options`` then passes ``{adr_key: difficulty}``.
    """

    def __init__(
        self,
        *,
        seed: Seed = 0,
        num_bins: int = 10,
        prior: float = 1.0,
        decay: float = 0.98,
        adr_key: str | None = None,
    ) -> None:
        self.table = SuccessTable(num_bins, prior=prior, decay=decay)
        self.adr_key = adr_key
        self._rng = np.random.default_rng(seed)
        self._updates = 0
        self._groups = 0
        self._signal_groups = 0

    @abstractmethod
    def sample(self) -> float:
        """Draw the difficulty, in [0, 1], of the next group or episode."""

    def update(
        self,
        difficulty: float,
        successes: Sequence[bool | float],
        task: str | None = None,
    ) -> None:
        """Record the outcomes of one group (or one episode) played at ``difficulty``.

        Args:
            difficulty: The difficulty that ``sample`` returned, in [0, 1].
            successes: One outcome per attempt: booleans or success fractions in [0, 1].
            task: Only for multi-task curricula; must be None here.

        Raises:
            ValueError: If ``difficulty`` or an outcome is outside [0, 1], ``successes`` is
                empty, or a task is given.
        """
        if task is not None:
            raise ValueError(f"this curriculum has no tasks, got task={task!r}")
        difficulty = _check_unit("difficulty", difficulty)
        outcomes = np.asarray(successes, dtype=np.float64).reshape(-1)
        if outcomes.size == 0:
            raise ValueError("successes must hold at least one outcome, got an empty sequence")
        if np.any((outcomes < 0.0) | (outcomes > 1.0)) or np.any(np.isnan(outcomes)):
            raise ValueError(f"successes must be booleans or floats in [0, 1], got {successes!r}")
        index = self.table.bin_of(difficulty)
        self.table.record(index, outcomes)
        self._updates += 1
        if outcomes.size >= 2:
            self._groups += 1
            self._signal_groups += int(outcomes.min() != outcomes.max())
        self._after_update(index)

    def _after_update(self, index: int) -> None:  # noqa: B027 (optional hook)
        """Hook run after outcomes at bin ``index`` were recorded."""

    @property
    def groups(self) -> int:
        """Updates so far that held at least two outcomes."""
        return self._groups

    @property
    def signal_groups(self) -> int:
        """Groups so far whose outcomes were not all equal."""
        return self._signal_groups

    @property
    def frontier(self) -> float:
        """The hardest difficulty currently sampled."""
        return 1.0

    def reset_options(self, difficulty: float) -> dict[str, Any]:
        """Gymnasium ``reset`` options that play ``difficulty``.

        Returns:
            ``{"difficulty": difficulty}``, or ``{"difficulty": {adr_key: difficulty}}`` when the
            curriculum drives one named level parameter.
        """
        if self.adr_key is None:
            return {"difficulty": difficulty}
        return {"difficulty": {self.adr_key: difficulty}}

    def metrics(self) -> dict[str, float]:
        """Per-bin success estimates and sample counts, frontier and signal fraction.

        ``curriculum/signal_fraction`` is the fraction of updates with at least two outcomes whose
        outcomes were not all equal (0 before any such update).
        """
        out: dict[str, float] = {}
        for i, (p, n) in enumerate(zip(self.table.estimate(), self.table.samples, strict=True)):
            out[f"curriculum/bin_{i}_success"] = float(p)
            out[f"curriculum/bin_{i}_samples"] = float(n)
        out["curriculum/frontier"] = float(self.frontier)
        out["curriculum/signal_fraction"] = self._signal_groups / max(self._groups, 1)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically, as a JSON-able dict."""
        return {
            "rng": self._rng.bit_generator.state,
            "table": self.table.state_dict(),
            "updates": self._updates,
            "groups": self._groups,
            "signal_groups": self._signal_groups,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` into a curriculum built with the same parameters."""
        self._rng.bit_generator.state = state["rng"]
        self.table.load_state_dict(state["table"])
        self._updates = int(state["updates"])
        self._groups = int(state["groups"])
        self._signal_groups = int(state["signal_groups"])


class FixedCurriculum(Curriculum):
    """Always the same difficulty.

    Args:
        difficulty: The difficulty, in [0, 1].
        seed: See ``Curriculum``.
        num_bins: See ``Curriculum``.
        adr_key: See ``Curriculum``.
    """

    def __init__(
        self,
        difficulty: float = 1.0,
        *,
        seed: Seed = 0,
        num_bins: int = 10,
        adr_key: str | None = None,
    ) -> None:
        super().__init__(seed=seed, num_bins=num_bins, adr_key=adr_key)
        self.difficulty = _check_unit("difficulty", difficulty)

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
        adr_key: See ``Curriculum``.
    """

    def __init__(
        self,
        low: float = 0.0,
        high: float = 1.0,
        *,
        seed: Seed = 0,
        num_bins: int = 10,
        adr_key: str | None = None,
    ) -> None:
        super().__init__(seed=seed, num_bins=num_bins, adr_key=adr_key)
        self.low = _check_unit("low", low)
        self.high = _check_unit("high", high)
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
        adr_key: See ``Curriculum``.
    """

    def __init__(
        self,
        start: float = 0.0,
        end: float = 1.0,
        steps: int = 1000,
        *,
        seed: Seed = 0,
        num_bins: int = 10,
        adr_key: str | None = None,
    ) -> None:
        super().__init__(seed=seed, num_bins=num_bins, adr_key=adr_key)
        self.start = _check_unit("start", start)
        self.end = _check_unit("end", end)
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


SIGNAL_WEIGHTS = ("bernoulli", "observed")


class SuccessBandCurriculum(Curriculum):
    """Sample where groups carry signal; widen the frontier when its edge gets easy.

    Bins ``0..frontier_bin`` are unlocked. Each unlocked bin with estimated success p (see
    ``SuccessTable``: discounted Beta counts, unseen bins read 0.5) gets weight
    ``signal_probability(p, group_size)`` (``signal="bernoulli"``, the default). That formula
    treats a group's attempts as independent draws at the bin's mean success; when start states
    differ (some nearly always solved, some nearly never) a bin's groups split far less often
    than it says. ``signal="observed"`` weighs by the bin's observed fraction of informative
    groups instead, shrunk towards the formula with a pseudo-count of ``prior`` groups:
    ``(informative + prior * formula) / (groups + prior)``. If some unlocked bins lie in the band
    [low, high], sampling picks among them in proportion to weight with probability
    ``1 - explore``, and uniformly among the other unlocked bins with probability ``explore``; if
    none do, all unlocked bins are candidates. The difficulty is uniform within the chosen bin.
    (Group counts are discounted like the outcomes, so with the default ``decay`` a bin
    remembers about 7 groups of 8: the observed weight is noisy, and on the reach ablation it
    kept no more informative groups than the formula; docs/results.md.)

    After each update, once the hardest unlocked bin has ``min_obs`` outcomes since the frontier
    last moved, the next bin is unlocked if its estimate exceeds ``high`` and it is locked again if
    its estimate is below ``low`` (at least one bin always stays unlocked). Whenever the frontier
    moves onto a bin, by unlocking it or by falling back to it, that bin's counts are reset to the
    prior (``SuccessTable.reset_bin``), so only outcomes observed there since the move decide the
    next move; the bin left behind keeps its counts. Without the reset, counts from a visit long
    ago (never discounted while the bin was locked) could lock a re-unlocked bin again at once.

    Args:
        num_bins: Number of difficulty bins over [0, 1], at least 1.
        low: Lower edge of the success band, in [0, 1].
        high: Upper edge of the success band, in [0, 1], above ``low``.
        group_size: Attempts per group G used in the signal weight, at least 2.
        explore: Share of samples spread over unlocked bins outside the band, in [0, 1].
        signal: ``"bernoulli"`` or ``"observed"``: what a bin's weight estimates (see above).
        min_obs: Outcomes needed at the hardest unlocked bin before the frontier moves.
        initial_frontier: Index of the hardest bin unlocked at the start.
        prior: Beta prior pseudo-count, > 0.
        decay: Per-outcome discount of old counts, in (0, 1].
        seed: See ``Curriculum``.
        adr_key: See ``Curriculum``.

    Raises:
        ValueError: If an argument is out of range.
    """

    def __init__(
        self,
        num_bins: int = 10,
        low: float = 0.2,
        high: float = 0.8,
        group_size: int = 8,
        explore: float = 0.1,
        min_obs: int = 16,
        initial_frontier: int = 0,
        prior: float = 1.0,
        decay: float = 0.98,
        signal: str = "bernoulli",
        *,
        seed: Seed = 0,
        adr_key: str | None = None,
    ) -> None:
        super().__init__(seed=seed, num_bins=num_bins, prior=prior, decay=decay, adr_key=adr_key)
        if signal not in SIGNAL_WEIGHTS:
            raise ValueError(f"signal must be one of {SIGNAL_WEIGHTS}, got {signal!r}")
        self.signal = signal
        self.low = _check_unit("low", low)
        self.high = _check_unit("high", high)
        if self.low >= self.high:
            raise ValueError(f"low must be < high, got low={low!r}, high={high!r}")
        if int(group_size) != group_size or group_size < 2:
            raise ValueError(f"group_size must be an integer >= 2, got {group_size!r}")
        self.group_size = int(group_size)
        self.explore = _check_unit("explore", explore)
        if int(min_obs) != min_obs or min_obs < 0:
            raise ValueError(f"min_obs must be an integer >= 0, got {min_obs!r}")
        self.min_obs = int(min_obs)
        if int(initial_frontier) != initial_frontier or not 0 <= initial_frontier < num_bins:
            raise ValueError(
                f"initial_frontier must be an integer in [0, {num_bins - 1}], "
                f"got {initial_frontier!r}"
            )
        self.frontier_bin = int(initial_frontier)
        self._samples_at_move = 0

    def bin_probabilities(self) -> np.ndarray:
        """Probability of sampling each bin next, shape (num_bins,); locked bins get 0."""
        unlocked = self.frontier_bin + 1
        p = self.table.estimate()[:unlocked]
        weight = np.asarray(signal_probability(p, self.group_size))
        if self.signal == "observed":
            prior = self.table.prior
            weight = (self.table.informative[:unlocked] + prior * weight) / (
                self.table.groups[:unlocked] + prior)
        in_band = (p >= self.low) & (p <= self.high)
        candidates = in_band if in_band.any() else np.ones(unlocked, dtype=bool)
        others = ~candidates if (~candidates).any() else candidates
        candidate_weight = np.where(candidates, weight, 0.0)
        if candidate_weight.sum() > 0.0:
            informative = candidate_weight / candidate_weight.sum()
        else:
            informative = candidates / candidates.sum()
        spread = others / others.sum()
        probs = np.zeros(self.table.num_bins)
        probs[:unlocked] = (1.0 - self.explore) * informative + self.explore * spread
        return probs

    def sample(self) -> float:
        """Draw a bin by ``bin_probabilities``, then a difficulty uniformly inside it."""
        index = int(self._rng.choice(self.table.num_bins, p=self.bin_probabilities()))
        lo, hi = self.table.bin_range(index)
        return float(self._rng.uniform(lo, hi))

    def _after_update(self, index: int) -> None:
        if index != self.frontier_bin:
            return
        if self.table.samples[index] - self._samples_at_move < self.min_obs:
            return
        p_edge = self.table.estimate()[index]
        if p_edge > self.high and index < self.table.num_bins - 1:
            self._move_frontier(index + 1)
        elif p_edge < self.low and index > 0:
            self._move_frontier(index - 1)

    def _move_frontier(self, index: int) -> None:
        # Only outcomes seen after the move may move the frontier again, so a bin that was just
        # re-exposed must prove itself afresh rather than on counts from before: its counts are
        # cleared, and ``min_obs`` counts its cumulative samples from here.
        self.frontier_bin = index
        self.table.reset_bin(index)
        self._samples_at_move = int(self.table.samples[index])

    @property
    def frontier(self) -> float:
        """Upper difficulty of the hardest unlocked bin."""
        return self.table.bin_range(self.frontier_bin)[1]

    def metrics(self) -> dict[str, float]:
        """``Curriculum.metrics`` plus ``curriculum/bin_{i}_prob``, the sampling probability."""
        out = super().metrics()
        for i, prob in enumerate(self.bin_probabilities()):
            out[f"curriculum/bin_{i}_prob"] = float(prob)
        return out

    def state_dict(self) -> dict[str, Any]:
        """``Curriculum.state_dict`` plus the frontier."""
        return {
            **super().state_dict(),
            "frontier_bin": self.frontier_bin,
            "samples_at_move": self._samples_at_move,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` into a curriculum built with the same parameters."""
        super().load_state_dict(state)
        self.frontier_bin = int(state["frontier_bin"])
        self._samples_at_move = int(state["samples_at_move"])


class MultiTaskCurriculum:
    """One curriculum per task, each with its own bins; the task of each sample is uniform.

    ``sample()`` returns ``(task, difficulty)`` and ``update`` needs ``task=``. Metrics are
    namespaced ``curriculum/{task}/...``, plus ``curriculum/signal_fraction`` over all tasks.

    Args:
        curricula: Curriculum of each task, in a fixed order.
        seed: Seed of the generator that picks the task.

    Raises:
        ValueError: If ``curricula`` is empty.
    """

    def __init__(self, curricula: dict[str, Curriculum], *, seed: Seed = 0) -> None:
        if not curricula:
            raise ValueError("curricula must name at least one task, got none")
        self.curricula = dict(curricula)
        self.tasks = list(self.curricula)
        self._rng = np.random.default_rng(seed)

    def sample(self) -> tuple[str, float]:
        """Draw a task uniformly, then a difficulty from that task's curriculum."""
        task = self.tasks[int(self._rng.integers(len(self.tasks)))]
        return task, self.curricula[task].sample()

    def update(
        self,
        difficulty: float,
        successes: Sequence[bool | float],
        task: str | None = None,
    ) -> None:
        """Record one group's outcomes at ``difficulty`` on ``task``.

        Raises:
            ValueError: If ``task`` is missing or unknown, or as ``Curriculum.update``.
        """
        if task not in self.curricula:
            raise ValueError(f"task must be one of {self.tasks}, got {task!r}")
        self.curricula[task].update(difficulty, successes)

    def reset_options(self, difficulty: float, task: str) -> dict[str, Any]:
        """Reset options of ``task``'s curriculum (see ``Curriculum.reset_options``)."""
        return self.curricula[task].reset_options(difficulty)

    def metrics(self) -> dict[str, float]:
        """Every task's metrics under ``curriculum/{task}/`` and the overall signal fraction."""
        out: dict[str, float] = {}
        for task, curriculum in self.curricula.items():
            for key, value in curriculum.metrics().items():
                out[key.replace("curriculum/", f"curriculum/{task}/", 1)] = value
        groups = sum(c.groups for c in self.curricula.values())
        signal_groups = sum(c.signal_groups for c in self.curricula.values())
        out["curriculum/signal_fraction"] = signal_groups / max(groups, 1)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Task-picking RNG and every task's state, as a JSON-able dict."""
        return {
            "rng": self._rng.bit_generator.state,
            "tasks": {task: c.state_dict() for task, c in self.curricula.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` into a curriculum built with the same tasks and parameters."""
        if sorted(state["tasks"]) != sorted(self.tasks):
            raise ValueError(f"state holds tasks {sorted(state['tasks'])}, expected {self.tasks}")
        self._rng.bit_generator.state = state["rng"]
        for task, task_state in state["tasks"].items():
            self.curricula[task].load_state_dict(task_state)


CURRICULA: dict[str, type[Curriculum]] = {
    "fixed": FixedCurriculum,
    "uniform": UniformCurriculum,
    "linear": LinearCurriculum,
    "success_band": SuccessBandCurriculum,
}


def make(
    name: str, *, tasks: Sequence[str] | None = None, **params: Any
) -> Curriculum | MultiTaskCurriculum:
    """Build the curriculum ``name`` from keyword parameters.

    Args:
        name: One of ``CURRICULA``: ``fixed``, ``uniform``, ``linear``, ``success_band``.
        tasks: Task names; when given, returns a ``MultiTaskCurriculum`` holding one curriculum
            per task (each seeded from ``seed`` and its position), else a single curriculum.
        **params: Parameters of the curriculum class, including ``seed``.

    Returns:
        The curriculum.

    Raises:
        ValueError: If ``name`` or a parameter name is unknown, ``tasks`` is empty or repeats a
            name, or a parameter value is out of range.
    """
    if name not in CURRICULA:
        raise ValueError(f"unknown curriculum {name!r}; choose one of {sorted(CURRICULA)}")
    cls = CURRICULA[name]
    accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for curriculum {name!r}; expected some of {accepted}"
        )
    if tasks is None:
        return cls(**params)
    if isinstance(tasks, str) or not tasks or len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks must be a non-empty list of distinct names, got {tasks!r}")
    seed = params.pop("seed", 0)
    root = [seed] if isinstance(seed, int) else list(seed)
    curricula = {task: cls(**params, seed=[*root, i + 1]) for i, task in enumerate(tasks)}
    return MultiTaskCurriculum(curricula, seed=[*root, 0])
