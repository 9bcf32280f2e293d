"""The experiment report of a sweep of ``scripts/train.py``: ``report.md`` and ``plots/*.png``.

:func:`build_report` reads every run folder below a multirun directory (one holding
``summary.json`` and ``metrics.csv``), groups the runs into *arms* and writes, per arm:

* final held-out success: the interquartile mean (IQM) over runs of ``summary.json``'s
  ``success_rate``, with a 95% stratified bootstrap interval (Agarwal et al., 2021, "Deep RL at
  the Edge of the Statistical Precipice", through ``rliable``);
* learning curves of held-out (``eval/`` then ``final/``) and training (``rollout/``) success
  against environment steps: the mean over seeds on a common step grid, banded by min-max;
* environment steps to reach 50% and 80% success, median over seeds;
* the fraction of groups that carried a learning signal (outcomes not all equal);
* verifier error rates when a learned detector scored the attempts (``detector/*``);
* a table of every run's numbers, and the runs that were skipped with the reason.

**Arms.** An arm is the set of runs that share their command-line overrides
(``.hydra/overrides.yaml``) once the ones that are the same in every run, ``seed`` and ``task``
are left out; so ``-m curriculum=fixed,success_band seed=0,1,2`` gives the arms
``curriculum=fixed`` and ``curriculum=success_band`` of three runs each, and
``-m algo=ppo,grpo`` an algorithm ablation. Runs without ``.hydra/`` (copied folders) are told
apart by the values of ``config.yaml`` that differ instead.

**Tasks** are strata, never arms: a report over runs of several tasks raises
:class:`ReportError` unless ``allow_mixed_tasks=True``, which pools them with a warning at the top
of the report and in the log, and bootstraps runs within each task (the "stratified" of the
stratified bootstrap).

**Interval estimates** use ``rliable.library.get_interval_estimates`` (percentile method) with
``rliable.metrics.aggregate_iqm``. When rliable cannot be imported, or tasks hold different
numbers of runs (rliable needs a runs x tasks matrix), a numpy percentile bootstrap does the same:
resample runs with replacement within each task, pool, take the statistic, and read the 2.5th and
97.5th percentiles of ``reps`` replicates. The report names the method it used.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from harness.config import SB3_ALGOS
from harness.runs import atomic_write_text, read_metrics

log = logging.getLogger(__name__)

THRESHOLDS: tuple[float, ...] = (0.5, 0.8)
CONFIDENCE = 0.95
DEFAULT_REPS = 5000
CURVE_POINTS = 100
SEED_KEY = "seed"
TASK_KEYS = ("task", "task.name")          # overrides / config keys naming the task
SIGNAL_KEY = "rollout/mixed_outcome_fraction"  # group trainer, per iteration
OLD_SIGNAL_KEY = "rollout/signal_fraction"  # the same, in runs logged before the split of the two
CURRICULUM_SIGNAL_KEY = "curriculum/signal_fraction"  # cumulative over a curriculum's updates
BUDGET_TOLERANCE = 1.1                      # arms whose median env steps differ more: warn
MIN_RELIABLE_RUNS = 5                       # fewer runs in an arm: its bootstrap is unreliable


class ReportError(ValueError):
    """A multirun folder that cannot give a report (no runs, mixed tasks unasked, ...)."""


@dataclass
class RunRecord:
    """One finished training run, as read from its folder.

    Attributes:
        path: The run folder.
        job: The folder relative to the multirun directory (``"3_curriculum=linear,seed=0"``).
        summary: ``summary.json``.
        config: ``config.yaml`` (the resolved ``TrainConfig``); empty when the file is missing.
        overrides: ``.hydra/overrides.yaml`` as ``{key: value}`` (``+``/``~`` prefixes dropped);
            ``None`` when the run has no ``.hydra/`` folder.
        metrics: ``metrics.csv`` as ``{key: [(step, value), ...]}``.
        arm: The arm's label, set by :func:`scan_runs`.
    """

    path: Path
    job: str
    summary: dict[str, Any]
    config: dict[str, Any]
    overrides: dict[str, str] | None
    metrics: dict[str, list[tuple[int, float]]]
    arm: str = ""

    @property
    def task(self) -> str:
        return str(self.summary.get("task") or self.config.get("task", {}).get("name"))

    @property
    def algo(self) -> str:
        return str(self.summary.get("algo") or self.config.get("algo", {}).get("name"))

    @property
    def seed(self) -> int | None:
        seed = self.summary.get("seed", self.config.get("seed"))
        return None if seed is None else int(seed)

    @property
    def env_steps(self) -> int:
        return int(self.summary.get("env_steps", 0))


@dataclass(frozen=True)
class SkippedRun:
    """A folder that looked like a run but cannot be reported, and why."""

    path: Path
    reason: str


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


# ------------------------------------------------------------------------------- statistics
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
    with warnings.catch_warnings():
        # arch deprecates the RandomState that rliable hands it; the numbers are the same.
        warnings.filterwarnings("ignore", message=".*random_state", category=FutureWarning)
        _, intervals = library.get_interval_estimates(
            {"arm": scores}, lambda x: np.array([aggregate(x)]), reps=reps,
            confidence_interval_size=confidence, random_state=np.random.RandomState(seed),
        )
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


# ---------------------------------------------------------------------------------- reading
def scan_runs(multirun_dir: str | Path,
              metric: str = "success_rate") -> tuple[list[RunRecord], list[SkippedRun]]:
    """Every run below ``multirun_dir`` (the folder itself included), with arms assigned, and
    the folders that look like runs but cannot be reported.

    A folder looks like a run when it holds ``summary.json``, ``metrics.csv`` or
    ``.hydra/overrides.yaml``; it is reported when it has a readable ``summary.json`` with a
    numeric ``metric`` and a ``metrics.csv`` with rows.

    Raises:
        ReportError: ``multirun_dir`` is not a folder.
    """
    root = Path(multirun_dir)
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder; pass the multirun folder of a sweep "
                          "(multirun/<date>/<time>) or a run folder")
    folders = set()
    for path in _files_below(root):
        if path.name in ("summary.json", "metrics.csv"):
            folders.add(path.parent)
        elif path.name == "overrides.yaml" and path.parent.name == ".hydra":
            folders.add(path.parent.parent)
    runs: list[RunRecord] = []
    skipped: list[SkippedRun] = []
    for folder in sorted(folders, key=lambda f: _job_order(f.relative_to(root))):
        record = _read_run(folder, root, metric)
        (runs if isinstance(record, RunRecord) else skipped).append(record)
    _assign_arms(runs)
    return runs, skipped


def _files_below(root: Path):
    """Every file below ``root``, following links to folders (each real folder once), so that a
    folder of links to several sweeps (``ln -s ../sweep_a a``) reports them as one."""
    seen: set[Path] = set()
    stack = [root]
    while stack:
        folder = stack.pop()
        real = folder.resolve()
        if real in seen:
            continue
        seen.add(real)
        for entry in sorted(folder.iterdir()):
            if entry.is_dir():
                stack.append(entry)
            else:
                yield entry


def load_runs(multirun_dir: str | Path, metric: str = "success_rate") -> list[RunRecord]:
    """The reportable runs below ``multirun_dir`` with their arms (see :func:`scan_runs`); each
    skipped folder is logged as a warning with its reason."""
    runs, skipped = scan_runs(multirun_dir, metric)
    for skip in skipped:
        log.warning("skipped %s: %s", skip.path, skip.reason)
    return runs


def _job_order(relative: Path) -> tuple:
    """Hydra's job number first (``12_...`` after ``2_...``), then the path."""
    head = relative.name.split("_", 1)[0]
    return (str(relative.parent), int(head) if head.isdigit() else math.inf, str(relative))


def _read_run(folder: Path, root: Path, metric: str) -> RunRecord | SkippedRun:
    summary_path, metrics_path = folder / "summary.json", folder / "metrics.csv"
    if not summary_path.exists():
        return SkippedRun(folder, "no summary.json: the run did not finish (killed, crashed or "
                                  "still running)")
    if not metrics_path.exists():
        return SkippedRun(folder, "no metrics.csv")
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError) as error:
        return SkippedRun(folder, f"summary.json is unreadable: {error}")
    value = summary.get(metric)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return SkippedRun(folder, f"summary.json has no numeric {metric!r} (has "
                                  f"{sorted(summary)})")
    try:
        metrics = read_metrics(metrics_path)
    except (OSError, ValueError, KeyError, TypeError) as error:
        return SkippedRun(folder, f"metrics.csv is unreadable: {error!r}")
    if not metrics:
        return SkippedRun(folder, "metrics.csv holds no rows")
    config: dict[str, Any] = {}
    if (folder / "config.yaml").exists():
        config = yaml.safe_load((folder / "config.yaml").read_text()) or {}
    overrides = None
    if (folder / ".hydra" / "overrides.yaml").exists():
        overrides = _parse_overrides(
            yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) or []
        )
    record = RunRecord(folder, str(folder.relative_to(root)) if folder != root else folder.name,
                       summary, config, overrides, metrics)
    if record.task in ("None", ""):
        return SkippedRun(folder, "neither summary.json nor config.yaml names the task")
    return record


def _parse_overrides(lines: list[str]) -> dict[str, str]:
    """``["+experiment=x", "seed=1"]`` -> ``{"experiment": "x", "seed": "1"}``."""
    parsed = {}
    for line in lines:
        key, _, value = str(line).partition("=")
        parsed[key.lstrip("+~")] = value
    return parsed


def _assign_arms(runs: list[RunRecord]) -> list[str]:
    """Label each run's arm by the settings that vary across runs, ``seed`` and the task left
    out; returns those keys."""
    if runs and all(r.overrides is not None for r in runs):
        settings = [dict(r.overrides) for r in runs]
    else:
        settings = [_flatten(r.config) for r in runs]
    keys: list[str] = []
    for setting in settings:
        keys += [k for k in setting if k not in keys]
    varying = [
        k for k in keys
        if k != SEED_KEY and k not in TASK_KEYS and not k.startswith("hydra.")
        and len({s.get(k) for s in settings}) > 1
    ]
    varying = _collapse_named_groups(varying, settings)
    for run, setting in zip(runs, settings, strict=True):
        parts = [f"{k.removesuffix('.name')}={setting.get(k, '<default>')}" for k in varying]
        run.arm = ", ".join(parts) if parts else "all runs"
    return varying


def _collapse_named_groups(varying: list[str], settings: list[dict[str, Any]]) -> list[str]:
    """Drop ``algo.n_steps`` and the like when ``algo.name`` varies and fixes them (config
    fallback: switching the algorithm changes every key of its group)."""
    named = {k.removesuffix(".name") for k in varying if k.endswith(".name")}
    kept = []
    for key in varying:
        group = key.rsplit(".", 1)[0] if "." in key else None
        if group in named and not key.endswith(".name"):
            by_name: dict[Any, set] = {}
            for s in settings:
                by_name.setdefault(s.get(f"{group}.name"), set()).add(repr(s.get(key)))
            if all(len(values) == 1 for values in by_name.values()):
                continue
        kept.append(key)
    return kept


def _flatten(node: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(node, Mapping):
        out: dict[str, str] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: str(node)}


# ----------------------------------------------------------------------------- per-run numbers
def held_out_curve(run: RunRecord, metric: str = "success_rate") -> list[tuple[int, float]]:
    """Periodic evaluations (``eval/<metric>``) followed by the final one (``final/<metric>``)."""
    return _sorted_unique(run.metrics.get(f"eval/{metric}", [])
                          + run.metrics.get(f"final/{metric}", []))


def training_curve(run: RunRecord, metric: str = "success_rate") -> list[tuple[int, float]]:
    """Training attempts (``rollout/<metric>``): at the curriculum's difficulties, not the
    evaluation's."""
    return _sorted_unique(run.metrics.get(f"rollout/{metric}", []))


def _sorted_unique(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Step order, the last value kept where a step repeats."""
    return sorted(dict(points).items())


def informative_fraction(run: RunRecord) -> tuple[float | None, str]:
    """The fraction of groups whose outcomes were not all equal, and where it came from.

    The group trainer logs ``rollout/mixed_outcome_fraction`` per iteration (older runs:
    ``rollout/signal_fraction``, which then meant the same): its mean over iterations.
    Otherwise a group trainer's cumulative ``curriculum/signal_fraction`` (last value). SB3 runs
    have no groups: their curriculum receives one outcome per episode, so its signal fraction
    is 0 by construction and is not reported.
    """
    key = SIGNAL_KEY if run.metrics.get(SIGNAL_KEY) else OLD_SIGNAL_KEY
    if run.metrics.get(key):
        return float(np.mean([v for _, v in run.metrics[key]])), \
            f"mean of {key} over iterations"
    if run.algo in SB3_ALGOS:
        return None, "no groups (SB3 trains on single episodes)"
    if run.metrics.get(CURRICULUM_SIGNAL_KEY):
        return run.metrics[CURRICULUM_SIGNAL_KEY][-1][1], \
            f"last {CURRICULUM_SIGNAL_KEY} (cumulative)"
    return None, "not logged"


def detector_rates(run: RunRecord) -> dict[str, float]:
    """Mean over the run of each ``detector/*`` metric (empty without a learned verifier)."""
    return {k: float(np.mean([v for _, v in points]))
            for k, points in run.metrics.items() if k.startswith("detector/") and points}


# ------------------------------------------------------------------------------------ report
@dataclass
class _Arm:
    name: str
    runs: list[RunRecord] = field(default_factory=list)

    def strata(self, values: Mapping[int, float]) -> list[list[float]]:
        """``values`` (by run index in ``runs``) grouped by task."""
        by_task: dict[str, list[float]] = {}
        for i, run in enumerate(self.runs):
            if i in values:
                by_task.setdefault(run.task, []).append(values[i])
        return list(by_task.values())


def build_report(multirun_dir: str | Path, out_dir: str | Path | None = None,
                 metric: str = "success_rate", allow_mixed_tasks: bool = False,
                 reps: int = DEFAULT_REPS, seed: int = 0) -> Path:
    """Write ``report.md`` and ``plots/*.png`` for the runs below ``multirun_dir``.

    Args:
        multirun_dir: A sweep's folder (``multirun/<date>/<time>``), or any folder of runs.
        out_dir: Where to write; defaults to ``multirun_dir``.
        metric: The summary key of final held-out performance; curves read ``eval/<metric>``,
            ``final/<metric>`` and ``rollout/<metric>``; steps-to-threshold needs a rate in [0, 1].
        allow_mixed_tasks: Pool runs of different tasks (tasks become bootstrap strata) with a
            warning, instead of raising.
        reps: Bootstrap replicates.
        seed: Seed of the bootstrap.

    Returns:
        The path of ``report.md``.

    Raises:
        ReportError: No reportable run (the reasons of the skipped folders are listed), or runs
            of several tasks without ``allow_mixed_tasks``.
    """
    from harness import plots

    root = Path(multirun_dir)
    runs, skipped = scan_runs(root, metric)
    if not runs:
        reasons = "".join(f"\n  {s.path}: {s.reason}" for s in skipped)
        raise ReportError(
            f"no runs to report in {root}: no folder below it holds a summary.json and a "
            f"metrics.csv" + (f"; skipped:{reasons}" if skipped else "")
        )
    found: list[str] = []
    for skip in skipped:
        found.append(f"skipped `{_relative(skip.path, root)}`: {skip.reason}")
    tasks = Counter(run.task for run in runs)
    if len(tasks) > 1:
        listing = ", ".join(f"{task} ({n} runs)" for task, n in tasks.items())
        if not allow_mixed_tasks:
            raise ReportError(
                f"runs of different tasks are mixed in {root}: {listing}. Report each task's "
                "runs on their own, or pass allow_mixed_tasks=True (--allow-mixed-tasks) to pool "
                "them, tasks then being the strata of the bootstrap"
            )
        found.insert(0, f"runs of different tasks are pooled: {listing}. Arms mix tasks; "
                        "intervals resample runs within each task")
    arms: dict[str, _Arm] = {}
    for run in runs:
        arms.setdefault(run.arm, _Arm(run.arm)).runs.append(run)
    found += _budget_warnings(arms)
    for message in found:
        log.warning("%s", message)

    out = Path(out_dir) if out_dir is not None else root
    (out / "plots").mkdir(parents=True, exist_ok=True)
    names = list(arms)
    lines = [f"# Experiment report: `{root.name}`", ""]
    if found:
        lines += [f"> **Warning:** {message}  " for message in found] + [""]
    lines += _overview(root, runs, arms, metric)
    lines += _final_section(arms, metric, reps, seed, out, plots, names)
    lines += _curves_section(arms, metric, out, plots, names)
    if metric.endswith("success_rate"):
        lines += _threshold_section(arms, metric)
    lines += _signal_section(arms, reps, seed, out, plots, names)
    lines += _detector_section(arms)
    lines += _runs_section(runs, metric)
    if skipped:
        lines += ["## Skipped folders", ""]
        lines += [f"* `{_relative(s.path, root)}`: {s.reason}" for s in skipped] + [""]
    report = out / "report.md"
    atomic_write_text(report, "\n".join(lines) + "\n")
    return report


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _budget_warnings(arms: dict[str, _Arm]) -> list[str]:
    found = []
    medians = {name: float(np.median([r.env_steps for r in arm.runs])) for name, arm in
               arms.items()}
    if len(medians) > 1 and min(medians.values()) > 0 \
            and max(medians.values()) > BUDGET_TOLERANCE * min(medians.values()):
        listing = ", ".join(f"{name}: {steps:,.0f}" for name, steps in medians.items())
        found.append(f"arms ran different budgets (median env steps {listing}); final success "
                     "is not compared at equal experience (check total_timesteps, max_minutes "
                     "and each trainer's rollout size)")
    sizes = {name: len(arm.runs) for name, arm in arms.items()}
    if len(set(sizes.values())) > 1:
        found.append(f"arms hold different numbers of runs: {sizes}")
    single = [name for name, n in sizes.items() if n == 1]
    if single:
        found.append(f"arms with a single run have no spread, their intervals are a point: "
                     f"{single}")
    return found


def _overview(root: Path, runs: list[RunRecord], arms: dict[str, _Arm], metric: str) -> list[str]:
    tasks = sorted({r.task for r in runs})
    algos = sorted({r.algo for r in runs})
    seeds = sorted({r.seed for r in runs if r.seed is not None})
    return [
        f"{len(runs)} runs of task {', '.join(tasks)} with {', '.join(algos)} in `{root}`, "
        f"{len(arms)} arm(s), seeds {seeds}; written {datetime.now():%Y-%m-%d %H:%M} by "
        "`scripts/report.py`.",
        "",
        "An arm is the runs sharing the command-line overrides that vary across the sweep "
        "(`seed` and `task` left out). Final held-out performance is `summary.json`'s "
        f"`{metric}` (the final evaluation on held-out seeds at `eval.difficulties`, by default "
        "`task.difficulty`).",
        "",
    ]


def _final_section(arms, metric, reps, seed, out, plots, names) -> list[str]:
    estimates: dict[str, Estimate] = {}
    for name, arm in arms.items():
        values = {i: float(r.summary[metric]) for i, r in enumerate(arm.runs)}
        estimates[name] = stratified_bootstrap(arm.strata(values), "iqm", reps, seed)
    method = next(iter(estimates.values())).method
    rows = []
    for name, arm in arms.items():
        scores = [float(r.summary[metric]) for r in arm.runs]
        e = estimates[name]
        rows.append([name, len(arm.runs), _num(e.point), f"[{_num(e.low)}, {_num(e.high)}]",
                     _num(float(np.mean(scores))), ", ".join(_num(s) for s in scores)])
    plots.interval_estimates(
        {name: (e.point, e.low, e.high) for name, e in estimates.items()},
        {name: [float(r.summary[metric]) for r in arm.runs] for name, arm in arms.items()},
        out / "plots" / "final_iqm.png", arms=names,
        xlabel=f"final held-out {metric}: IQM (|), 95% CI (bar), single runs (o)",
        title="Final held-out performance: IQM and 95% CI over runs",
    )
    note = _few_runs_note({name: len(arm.runs) for name, arm in arms.items()})
    if note:
        log.warning("%s", note)
    return [
        f"## Final held-out `{metric}`", "",
        _table(["arm", "runs", "IQM", "95% CI", "mean", "per run"], rows), "",
        *([note, ""] if note else []),
        f"IQM: interquartile mean over runs (the middle 50% after sorting; with fewer than 4 "
        f"runs nothing is trimmed and it is the mean). 95% CI: {method}, resampling runs within "
        "each task. Dots in the figure are single runs.", "",
        "![final IQM](plots/final_iqm.png)", "",
    ]


def _few_runs_note(runs_per_arm: Mapping[str, int]) -> str | None:
    """The sentence that warns of bootstrap intervals over too few runs, or ``None``.

    Args:
        runs_per_arm: Number of runs of each arm.

    Returns:
        A sentence naming the arms with fewer than ``MIN_RELIABLE_RUNS`` runs and their counts,
        or ``None`` when every arm has enough.
    """
    few = {name: n for name, n in runs_per_arm.items() if n < MIN_RELIABLE_RUNS}
    if not few:
        return None
    listing = ", ".join(f"{name} ({n} run{'s' if n != 1 else ''})" for name, n in few.items())
    return (f"Bootstrap intervals over fewer than {MIN_RELIABLE_RUNS} runs per arm are "
            f"unreliable (Agarwal et al. 2021 recommend more runs): {listing}.")


def _curves_section(arms, metric, out, plots, names) -> list[str]:
    panels: dict[str, dict[str, tuple]] = {"held-out evaluation": {}, "training attempts": {}}
    for name, arm in arms.items():
        for panel, curve in (("held-out evaluation", held_out_curve),
                             ("training attempts", training_curve)):
            band = band_across_runs([curve(r, metric) for r in arm.runs])
            if band is not None:
                panels[panel][name] = band.as_tuple()
    panels = {k: v for k, v in panels.items() if v}
    if not panels:
        return ["## Learning curves", "", f"No run logged `eval/{metric}`, `final/{metric}` or "
                f"`rollout/{metric}`.", ""]
    plots.band_curves(panels, out / "plots" / "learning_curves.png", arms=names,
                      ylabel=metric, title="Learning curves (mean over seeds, band: min-max)")
    return [
        "## Learning curves", "",
        "![learning curves](plots/learning_curves.png)", "",
        f"Line: mean over seeds; band: min to max over seeds; curves interpolated linearly on "
        f"{CURVE_POINTS} env-step points spanning the steps every seed reached. Held-out: "
        f"`eval/{metric}` every `eval.every_steps`, then `final/{metric}`; an arm whose seeds "
        "share no step range (only a final evaluation each) is one point with a min-max bar. "
        f"Training: `rollout/{metric}` of the sampled attempts, at the difficulties the "
        "curriculum chose, so it is not comparable across curricula; compare held-out curves.",
        "",
    ]


def _threshold_section(arms, metric) -> list[str]:
    header = ["arm"] + [f"{kind} {t:.0%}" for kind in ("held-out", "training")
                        for t in THRESHOLDS]
    rows = []
    for name, arm in arms.items():
        row = [name]
        for curve in (held_out_curve, training_curve):
            for threshold in THRESHOLDS:
                steps = [first_step_reaching(curve(r, metric), threshold) for r in arm.runs]
                median, reached = median_steps(steps)
                shown = "not reached" if math.isinf(median) else f"{median:,.0f}"
                row.append(f"{shown} ({reached}/{len(steps)})")
        rows.append(row)
    return [
        "## Environment steps to reach 50% and 80% success", "",
        _table(header, rows), "",
        "Median over seeds of the first logged step at or above the threshold; a seed that "
        "never reached it counts as infinitely late, so the median reads *not reached* when "
        "half the seeds or more never got there. (k/n): seeds that reached it. Held-out steps "
        "are only as fine as `eval.every_steps`; training values are single noisy iterations at "
        "the curriculum's difficulties.", "",
    ]


def _signal_section(arms, reps, seed, out, plots, names) -> list[str]:
    estimates: dict[str, tuple[Estimate, dict[int, float]]] = {}
    sources, curves = set(), {}
    for name, arm in arms.items():
        values: dict[int, float] = {}
        for i, run in enumerate(arm.runs):
            value, source = informative_fraction(run)
            sources.add(source)
            if value is not None:
                values[i] = value
        if values:
            estimates[name] = (stratified_bootstrap(arm.strata(values), "mean", reps, seed),
                               values)
        band = band_across_runs([r.metrics.get(SIGNAL_KEY) or r.metrics.get(OLD_SIGNAL_KEY, [])
                                 for r in arm.runs])
        if band is not None:
            curves[name] = band.as_tuple()
    reference = next(iter(estimates), None)
    rows = []
    for name in arms:
        if name not in estimates:
            rows.append([name, 0, "n/a", "", "", ""])
            continue
        estimate, values = estimates[name]
        base = estimates[reference][0].point
        rows.append([name, len(values), _num(estimate.point),
                     f"[{_num(estimate.low)}, {_num(estimate.high)}]",
                     f"{estimate.point / base:.2f}x" if base > 0 else "n/a",
                     ", ".join(_num(values[i]) for i in sorted(values))])
    lines = [
        "## Fraction of informative groups", "",
        _table(["arm", "runs", "mean", "95% CI", f"ratio to {reference}", "per run"], rows), "",
        "A group (G attempts from one start state) is informative when its outcomes are not all "
        "equal. For GRPO, Dr. GRPO and RLOO every advantage of another group is zero, so it "
        "carries no gradient; for REINFORCE (r) and the critic baseline (r - V(s0)) it may "
        "still carry one (rollout/signal_fraction counts groups by the estimator's own "
        "advantages). Per run: "
        f"{'; '.join(sorted(sources))}. Across runs: mean, 95% stratified bootstrap interval; "
        "the ratio is of the means (n/a when the first arm's is 0).", "",
    ]
    if curves:
        plots.band_curves({"groups with signal": curves}, out / "plots" / "signal_fraction.png",
                          arms=names, ylabel="fraction of groups with signal",
                          title="Informative groups per iteration (mean over seeds, band: "
                                "min-max)")
        lines += ["![signal fraction](plots/signal_fraction.png)", ""]
    return lines


def _detector_section(arms) -> list[str]:
    per_arm = {name: [detector_rates(r) for r in arm.runs] for name, arm in arms.items()}
    keys = sorted({k for rates in per_arm.values() for r in rates for k in r})
    if not keys:
        return []
    rows = []
    for name, rates in per_arm.items():
        row = [name, sum(bool(r) for r in rates)]
        for key in keys:
            values = [r[key] for r in rates if key in r]
            row.append(_num(float(np.mean(values))) if values else "n/a")
        rows.append(row)
    return [
        "## Verifier error rates", "",
        _table(["arm", "runs"] + [k.removeprefix("detector/") for k in keys], rows), "",
        "The learned detector's verdicts against the scripted ground truth on training "
        "attempts: mean over each run's logged values, then over runs.", "",
    ]


def _runs_section(runs: list[RunRecord], metric: str) -> list[str]:
    rows = []
    for run in runs:
        interval = run.summary.get(f"{metric.removesuffix('_rate')}_interval")
        signal, _ = informative_fraction(run)
        reached = first_step_reaching(held_out_curve(run, metric), THRESHOLDS[0])
        job = Path(run.job)
        number = job.name.split("_", 1)[0]
        if number.isdigit() and job.parent != Path("."):
            number = f"{job.parent.as_posix()}/{number}"  # one of several pooled sweeps
        elif not number.isdigit():
            number = run.job
        rows.append([
            f"`{number}`", run.arm, run.seed, run.algo,
            run.task, _num(float(run.summary[metric])),
            f"[{_num(interval[0])}, {_num(interval[1])}]" if interval else "n/a",
            f"{run.env_steps:,}", run.summary.get("iterations", ""),
            _num(run.summary.get("wall_clock_s"), 0),
            _num(signal), "not reached" if reached is None else f"{reached:,}",
        ])
    return [
        "## Runs", "",
        _table(["job", "arm", "seed", "algo", "task", metric, "95% Wilson", "env steps",
                "iterations", "wall-clock s", "informative groups", "held-out steps to 50%"],
               rows), "",
        "job: the run's folder is the one starting with that number (Hydra's job number), "
        "below the named subfolder when sweeps are pooled.", "",
    ]


def _num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|"]
                     + [line(row) for row in rows])
