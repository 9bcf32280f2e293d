"""The statistics of the report: interquartile mean, stratified bootstrap intervals (rliable, or
numpy when rliable cannot run), the probability of improvement, curves banded across runs and
steps to a threshold."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

CONFIDENCE = 0.95
DEFAULT_REPS = 5000
CURVE_POINTS = 100


@dataclass(frozen=True)
class Band:
    """Runs' curves on a common step grid: mean, and min-max across runs, shapes ``(points,)``."""

    steps: np.ndarray
    centre: np.ndarray
    low: np.ndarray
    high: np.ndarray
    runs: int

    def as_tuple(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.steps, self.centre, self.low, self.high


@dataclass(frozen=True)
class Estimate:
    """A point estimate over runs with its confidence interval."""

    point: float
    low: float
    high: float
    method: str


def interquartile_mean(values: Sequence[float] | np.ndarray, axis: int | None = None) -> Any:
    """Mean of the values left after cutting ``int(0.25 n)`` from each end of the sorted values
    (``scipy.stats.trim_mean(values, 0.25)``, which is ``rliable.metrics.aggregate_iqm``).

    Args:
        values: Scores, any shape; ``axis=None`` pools them all.
        axis: Axis to reduce.

    Returns:
        A float for ``axis=None``, otherwise an array without ``axis``.
    """
    array = np.asarray(values, dtype=np.float64)
    if axis is None:
        array, axis = array.reshape(-1), 0
    n = array.shape[axis]
    if n == 0:
        raise ValueError("the interquartile mean of no values is undefined")
    cut = int(0.25 * n)
    ordered = np.sort(array, axis=axis)
    kept = np.take(ordered, np.arange(cut, n - cut), axis=axis)
    result = kept.mean(axis=axis)
    return float(result) if np.ndim(result) == 0 else result


STATISTICS: dict[str, Callable[..., Any]] = {
    "iqm": interquartile_mean,
    "mean": lambda values, axis=None: np.mean(values, axis=axis),
}


def stratified_bootstrap(
    strata: Sequence[Sequence[float]], statistic: str = "iqm", reps: int = DEFAULT_REPS,
    seed: int = 0, confidence: float = CONFIDENCE,
) -> Estimate:
    """Point estimate of ``statistic`` over all runs and its percentile bootstrap interval, runs
    resampled with replacement within each stratum (task).

    rliable's ``get_interval_estimates`` computes it when every stratum holds the same number of
    runs; otherwise, or when rliable cannot be imported, the numpy bootstrap below does.

    Args:
        strata: One sequence of run scores per task.
        statistic: ``iqm`` or ``mean``.
        reps: Bootstrap replicates.
        seed: Seed of the resampling, so that a report is reproducible.
        confidence: Coverage of the interval.

    Returns:
        The estimate, whose ``method`` says which bootstrap ran.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r}; choose one of {sorted(STATISTICS)}")
    arrays = [np.asarray(s, dtype=np.float64) for s in strata if len(s)]
    if not arrays:
        raise ValueError("a bootstrap needs at least one score")
    point = float(STATISTICS[statistic](np.concatenate(arrays)))
    if len({len(a) for a in arrays}) == 1:
        try:
            low, high = _rliable_interval(np.stack(arrays, axis=1), statistic, reps, seed,
                                          confidence)
            return Estimate(point, low, high,
                            f"rliable stratified bootstrap, percentile, {reps} replicates")
        except ImportError as error:
            log.warning("rliable cannot be imported (%s); using the numpy bootstrap", error)
    low, high = _numpy_interval(arrays, statistic, reps, seed, confidence)
    return Estimate(point, low, high,
                    f"numpy stratified percentile bootstrap, {reps} replicates")


def _rliable_interval(scores: np.ndarray, statistic: str, reps: int, seed: int,
                      confidence: float) -> tuple[float, float]:
    from rliable import library, metrics

    aggregate = {"iqm": metrics.aggregate_iqm, "mean": metrics.aggregate_mean}[statistic]
    # rliable's stratified resampling draws from the global np.random whatever random_state it
    # is given, so the interval changed from one report to the next: seed it, then restore it.
    global_state = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            # arch deprecates the RandomState that rliable hands it; the numbers are the same.
            warnings.filterwarnings("ignore", message=".*random_state", category=FutureWarning)
            _, intervals = library.get_interval_estimates(
                {"arm": scores}, lambda x: np.array([aggregate(x)]), reps=reps,
                confidence_interval_size=confidence, random_state=np.random.RandomState(seed),
            )
    finally:
        np.random.set_state(global_state)
    low, high = intervals["arm"][:, 0]
    return float(low), float(high)


def _numpy_interval(strata: list[np.ndarray], statistic: str, reps: int, seed: int,
                    confidence: float) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    resampled = np.concatenate(
        [s[rng.integers(0, len(s), size=(reps, len(s)))] for s in strata], axis=1
    )  # (reps, runs)
    replicates = STATISTICS[statistic](resampled, axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)


def probability_of_improvement(
    x: Sequence[float], y: Sequence[float], reps: int = DEFAULT_REPS, seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """P(X > Y) of Agarwal et al. (2021): the chance that a run of X scores higher than a run of
    Y, ties counting half (the Mann-Whitney U statistic over ``len(x) * len(y)``), with a
    percentile bootstrap interval resampling the runs of each side independently.

    rliable's ``probability_of_improvement`` and ``get_interval_estimates`` compute it when they
    can be imported; the numpy computation below gives the same point estimate.

    Args:
        x: One score per run of X.
        y: One score per run of Y.
        reps: Bootstrap replicates.
        seed: Seed of the resampling.
        confidence: Coverage of the interval.

    Returns:
        The estimate, whose ``method`` says which bootstrap ran.

    Raises:
        ValueError: ``x`` or ``y`` is empty.
    """
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if not len(xs) or not len(ys):
        raise ValueError(f"a probability of improvement needs runs on both sides; got "
                         f"{len(xs)} and {len(ys)}")
    point = _improvement_probability(xs, ys)
    try:
        from rliable import library, metrics
    except ImportError as error:
        log.warning("rliable cannot be imported (%s); using the numpy bootstrap", error)
    else:
        global_state = np.random.get_state()  # rliable draws from the global state too
        np.random.seed(seed)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*random_state",
                                        category=FutureWarning)
                _, intervals = library.get_interval_estimates(
                    {"pair": [xs[:, None], ys[:, None]]},
                    lambda a, b: np.array([metrics.probability_of_improvement(a, b)]),
                    reps=reps, confidence_interval_size=confidence,
                    random_state=np.random.RandomState(seed))
        finally:
            np.random.set_state(global_state)
        low, high = intervals["pair"][:, 0]
        return Estimate(point, float(low), float(high),
                        f"rliable independent bootstrap, percentile, {reps} replicates")
    rng = np.random.default_rng(seed)
    replicates = [_improvement_probability(xs[rng.integers(0, len(xs), len(xs))],
                                           ys[rng.integers(0, len(ys), len(ys))])
                  for _ in range(reps)]
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return Estimate(point, float(low), float(high),
                    f"numpy independent percentile bootstrap, {reps} replicates")


def _improvement_probability(xs: np.ndarray, ys: np.ndarray) -> float:
    """The share of pairs (x_i, y_j) with x_i > y_j, ties counting half."""
    greater = (xs[:, None] > ys[None, :]).mean()
    ties = (xs[:, None] == ys[None, :]).mean()
    return float(greater + 0.5 * ties)


def band_across_runs(curves: Sequence[Sequence[tuple[int, float]]],
                     points: int = CURVE_POINTS) -> Band | None:
    """Interpolate runs' curves linearly on a common grid of ``points`` steps spanning the range
    every run covers (no extrapolation), then take the mean and the min-max across runs.

    When the runs' step ranges do not overlap (e.g. a single final evaluation each), the arm is
    one point: the mean of the runs' last values at their median last step.

    Args:
        curves: Per run, ``(step, value)`` pairs in step order.
        points: Grid size.

    Returns:
        The band, or ``None`` when no run has a point.
    """
    curves = [c for c in curves if c]
    if not curves:
        return None
    start = max(c[0][0] for c in curves)
    end = min(c[-1][0] for c in curves)
    if end > start:
        grid = np.linspace(start, end, points)
        values = np.stack([np.interp(grid, *zip(*c, strict=True)) for c in curves])
    else:
        grid = np.array([float(np.median([c[-1][0] for c in curves]))])
        values = np.array([[c[-1][1]] for c in curves])
    return Band(grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0), len(curves))


def first_step_reaching(curve: Sequence[tuple[int, float]], threshold: float) -> int | None:
    """The first logged step whose value is at least ``threshold``, or ``None``."""
    return next((step for step, value in curve if value >= threshold), None)


def median_steps(steps: Sequence[int | None]) -> tuple[float, int]:
    """Median over runs of the steps to a threshold, a run that never reached it counting as
    infinitely late (so the median is ``inf`` when half the runs or more never reached it).

    Returns:
        ``(median, runs that reached it)``.
    """
    values = [math.inf if s is None else float(s) for s in steps]
    return float(np.median(values)), sum(s is not None for s in steps)
