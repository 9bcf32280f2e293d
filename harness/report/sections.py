"""The sections of ``report.md``: each function returns its Markdown lines and, where the
section has a figure, draws it into ``<out>/plots`` through ``harness_common.plots``."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from harness.report.reading import (
    OLD_SIGNAL_KEY,
    SIGNAL_KEY,
    Arm,
    RunRecord,
    detector_rates,
    held_out_curve,
    informative_fraction,
    training_curve,
)
from harness.report.statistics import (
    CURVE_POINTS,
    Estimate,
    band_across_runs,
    first_step_reaching,
    median_steps,
    stratified_bootstrap,
)

log = logging.getLogger(__name__)

THRESHOLDS: tuple[float, ...] = (0.5, 0.8)
BUDGET_TOLERANCE = 1.1                      # arms whose median env steps differ more: warn
MIN_RELIABLE_RUNS = 5                       # fewer runs in an arm: its bootstrap is unreliable


def budget_warnings(arms: dict[str, Arm]) -> list[str]:
    """Why the arms may not compare on equal terms: budgets (median env steps) more than
    ``BUDGET_TOLERANCE`` apart, different numbers of runs, arms of a single run."""
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


def overview(root: Path, runs: list[RunRecord], arms: dict[str, Arm], metric: str) -> list[str]:
    """The paragraphs under the title: what ran, and what an arm and the final metric are."""
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


def final_section(arms: dict[str, Arm], metric: str, reps: int, seed: int, out: Path,
                  plots: ModuleType, names: list[str]) -> list[str]:
    """Final held-out ``metric`` per arm: IQM and bootstrap interval, as a table and a figure."""
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


def curves_section(arms: dict[str, Arm], metric: str, out: Path, plots: ModuleType,
                   names: list[str]) -> list[str]:
    """Held-out and training learning curves per arm, banded across seeds."""
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


def threshold_section(arms: dict[str, Arm], metric: str) -> list[str]:
    """Median env steps per arm to reach each of ``THRESHOLDS``, held-out and training."""
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


def signal_section(arms: dict[str, Arm], reps: int, seed: int, out: Path, plots: ModuleType,
                   names: list[str]) -> list[str]:
    """The fraction of informative groups per arm, with its interval and a per-iteration
    figure."""
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


def detector_section(arms: dict[str, Arm]) -> list[str]:
    """Mean ``detector/*`` rates per arm; no section when no run logged one."""
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


def runs_section(runs: list[RunRecord], metric: str) -> list[str]:
    """One table row per run, in the order the runs were found."""
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
            _starts(run.summary.get("start_states")),
        ])
    return [
        "## Runs", "",
        _table(["job", "arm", "seed", "algo", "task", metric, "95% Wilson", "env steps",
                "iterations", "wall-clock s", "informative groups", "held-out steps to 50%",
                "training starts"], rows), "",
        "job: the run's folder is the one starting with that number (Hydra's job number), "
        "below the named subfolder when sweeps are pooled. training starts: where training "
        "groups started (`algo.starts.source`, shares per source); held-out evaluation always "
        "starts from fresh resets.", "",
    ]


def _starts(starts: Mapping[str, Any] | None) -> str:
    """``reset`` or e.g. ``demo (reset 0.25, demo 0.75)``."""
    if not starts:
        return "reset"
    shares = ", ".join(f"{k} {v:g}" for k, v in starts.get("weights", {}).items() if v)
    return f"{starts.get('sources', 'reset')} ({shares})" if shares else starts["sources"]


def _num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|"]
                     + [line(row) for row in rows])
