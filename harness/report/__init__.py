"""The experiment report of a sweep of ``scripts/train.py``: ``report.md`` and ``plots/*.png``.

:func:`build_report` reads every run folder below a multirun directory (one holding
``summary.json`` and ``metrics.csv``), groups the runs into *arms* and writes, per arm:

* final held-out success: the interquartile mean (IQM) over runs of ``summary.json``'s
  ``success_rate``, with a 95% stratified bootstrap interval (Agarwal et al., 2021, "Deep RL at
  the Edge of the Statistical Precipice", through ``rliable``);
* against a reference arm (``algo=grpo`` by default): the probability of improvement over it,
  the paired difference over shared seeds, env steps and wall clock
  (:mod:`harness.report.reference`);
* learning curves of held-out (``eval/`` then ``final/``) and training (``rollout/``) success
  against environment steps: the mean over seeds on a common step grid, banded by min-max;
* for group runs, the start policy and the final policy on the same test seeds, greedy and
  sampled, the gain over the start's better decoding (chosen on the validation seeds) as an IQM
  across seeds, and the probability of improvement (:mod:`harness.report.before_after`);
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

**Where things are.** :mod:`harness.report.reading` finds the run folders, reads them and
assigns arms; :mod:`harness.report.statistics` holds the IQM, the bootstrap and the curve bands;
:mod:`harness.report.sections` writes each Markdown section and its figure; :func:`build_report`
below puts them together.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from harness.report.before_after import before_after_section
from harness.report.reading import (
    CURRICULUM_SIGNAL_KEY,
    OLD_SIGNAL_KEY,
    SEED_KEY,
    SIGNAL_KEY,
    TASK_KEYS,
    Arm,
    ReportError,
    RunRecord,
    SkippedRun,
    detector_rates,
    held_out_curve,
    informative_fraction,
    load_runs,
    scan_runs,
    training_curve,
)
from harness.report.reference import DEFAULT_REFERENCE, pick_reference, reference_section
from harness.report.sections import (
    BUDGET_TOLERANCE,
    MIN_RELIABLE_RUNS,
    THRESHOLDS,
    budget_warnings,
    curves_section,
    detector_section,
    final_section,
    overview,
    runs_section,
    signal_section,
    threshold_section,
)
from harness.report.statistics import (
    CONFIDENCE,
    CURVE_POINTS,
    DEFAULT_REPS,
    STATISTICS,
    Band,
    Estimate,
    band_across_runs,
    first_step_reaching,
    interquartile_mean,
    median_steps,
    probability_of_improvement,
    stratified_bootstrap,
)
from harness_common.files import atomic_write_text

__all__ = [
    "BUDGET_TOLERANCE", "CONFIDENCE", "CURRICULUM_SIGNAL_KEY", "CURVE_POINTS", "DEFAULT_REFERENCE",
    "DEFAULT_REPS",
    "MIN_RELIABLE_RUNS", "OLD_SIGNAL_KEY", "SEED_KEY", "SIGNAL_KEY", "STATISTICS", "TASK_KEYS",
    "THRESHOLDS", "Band", "Estimate", "ReportError", "RunRecord", "SkippedRun",
    "band_across_runs", "build_report", "detector_rates", "first_step_reaching",
    "held_out_curve", "informative_fraction", "interquartile_mean", "load_runs",
    "median_steps", "pick_reference", "probability_of_improvement", "reference_section",
    "scan_runs", "stratified_bootstrap",
    "training_curve",
]

log = logging.getLogger(__name__)


def build_report(multirun_dir: str | Path, out_dir: str | Path | None = None,
                 metric: str = "success_rate", allow_mixed_tasks: bool = False,
                 reps: int = DEFAULT_REPS, seed: int = 0, reference: str | None = None,
                 ignore: tuple[str, ...] = ()) -> Path:
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
        reference: The arm every other arm is compared with (probability of improvement,
            paired difference over seeds, env steps and wall clock); ``None`` picks
            ``algo=grpo`` when the sweep has that arm, and otherwise leaves the section out.
        ignore: Settings that never define an arm, e.g. ``algo.start_policy.file`` when each seed's
            arm starts from that seed's saved start (its path differs per seed).

    Returns:
        The path of ``report.md``.

    Raises:
        ReportError: No reportable run (skipped folders listed with reasons), runs of
            several tasks without ``allow_mixed_tasks``, or a ``reference`` naming no arm.
    """
    from harness_common import plots

    root = Path(multirun_dir)
    runs, skipped, found = _checked_runs(root, metric, allow_mixed_tasks, ignore)
    arms: dict[str, Arm] = {}
    for run in runs:
        arms.setdefault(run.arm, Arm(run.arm)).runs.append(run)
    pick_reference(arms, reference)  # a bad name fails before anything is written
    found += budget_warnings(arms)
    for message in found:
        log.warning("%s", message)

    out = Path(out_dir) if out_dir is not None else root
    (out / "plots").mkdir(parents=True, exist_ok=True)
    names = list(arms)
    lines = [f"# Experiment report: `{root.name}`", ""]
    if found:
        lines += [f"> **Warning:** {message}  " for message in found] + [""]
    lines += overview(root, runs, arms, metric)
    lines += final_section(arms, metric, reps, seed, out, plots, names)
    lines += reference_section(arms, reference, metric, reps, seed, out, plots)
    if metric == "success_rate":
        lines += before_after_section(arms, reps, seed, out, plots)
    lines += curves_section(arms, metric, out, plots, names)
    if metric.endswith("success_rate"):
        lines += threshold_section(arms, metric)
    lines += signal_section(arms, reps, seed, out, plots, names)
    lines += detector_section(arms)
    lines += runs_section(runs, metric)
    if skipped:
        lines += ["## Skipped folders", ""]
        lines += [f"* `{_relative(s.path, root)}`: {s.reason}" for s in skipped] + [""]
    report = out / "report.md"
    atomic_write_text(report, "\n".join(lines) + "\n")
    return report


def _checked_runs(root: Path, metric: str, allow_mixed_tasks: bool, ignore: tuple[str, ...]):
    """The runs and skipped folders of :func:`scan_runs`, and the warnings they raise.

    Raises:
        ReportError: No reportable run, or runs of several tasks without ``allow_mixed_tasks``.
    """
    runs, skipped = scan_runs(root, metric, ignore)
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
    return runs, skipped, found


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
