"""The report's before/after section: a group run's start policy and final policy on the same test
seeds, both decodings of each, and the gain over the start's better decoding, across seeds.

Each group run's ``summary.json`` holds its start policy's test success greedy
(``start_success_rate``) and sampled (``start_sampled_success_rate``), the decoding that scored
higher on the validation seeds (``best_start_decoding``), the final policy's greedy
(``success_rate``) and sampled (``sampled_success_rate``) test success, and the paired gains of
the final greedy policy (``improvement``: against the start's greedy decoding;
``improvement_vs_best_start``: against its better one, with a Newcombe interval and an exact
McNemar p over the test episodes). Across runs, each figure gets its IQM with a stratified
bootstrap interval, and the probability of improvement (Agarwal et al. 2021) says how likely a
seed's final greedy policy beats a seed's start at its better decoding. Seeds of a sweep differ
in training randomness and in their demonstrations, so these intervals cover both; the paired
intervals of a single run cover only which test states were drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from harness.report.reading import Arm, RunRecord
from harness.report.statistics import probability_of_improvement, stratified_bootstrap

# (label, how one run's value is read) of the rows of the across-seeds table
START_KEYS = ("start_success_rate", "start_sampled_success_rate", "best_start_decoding")


def better_start(summary: dict[str, Any]) -> float:
    """The start policy's test success at its decoding chosen on the validation seeds (greedy
    when the run chose none)."""
    if summary.get("best_start_decoding") == "sampled":
        return float(summary["start_sampled_success_rate"])
    return float(summary["start_success_rate"])


ROWS: tuple[tuple[str, Any], ...] = (
    ("start, greedy", lambda s: s["start_success_rate"]),
    ("start, sampled", lambda s: s["start_sampled_success_rate"]),
    ("start, better decoding (chosen on validation)", better_start),
    ("final, greedy", lambda s: s["success_rate"]),
    ("final, sampled", lambda s: s.get("sampled_success_rate", float("nan"))),
    ("gain: final greedy - start greedy", lambda s: s["improvement"]),
    ("gain: final greedy - better start", lambda s: s["improvement_vs_best_start"]),
)


def has_start(run: RunRecord) -> bool:
    """Whether the run's summary holds what this section reads (group runs with a start
    policy evaluated on the test seeds, from 2026-12-05 on)."""
    return all(key in run.summary for key in (*START_KEYS, "improvement",
                                              "improvement_vs_best_start"))


def before_after_section(arms: dict[str, Arm], reps: int, seed: int, out: Path,
                         plots: ModuleType) -> list[str]:
    """The section for every arm whose runs all hold a start policy's figures (empty
    otherwise): a table across seeds, one per run, and a figure of each seed's start and final
    policy."""
    kept = {name: arm for name, arm in arms.items()
            if arm.runs and all(has_start(run) for run in arm.runs)}
    if not kept:
        return []
    lines = ["## Before and after fine-tuning, across seeds", ""]
    for name, arm in kept.items():
        lines += _arm_tables(name, arm, reps, seed)
    figure = out / "plots" / "before_after.png"
    plots.before_after(
        {name: [[better_start(r.summary), float(r.summary["success_rate"])] for r in arm.runs]
         for name, arm in kept.items()},
        figure, labels=("start, better decoding", "final, greedy"),
        title="Test success per seed")
    lines += [
        "IQM: interquartile mean over seeds, 95% CI by stratified bootstrap over seeds. "
        "P(final > start): the probability that a seed's final greedy policy scores higher than "
        "a seed's start at its better decoding (ties count half), with a bootstrap interval. "
        "Each run's gain is paired over the same test episodes; its interval (Newcombe) and p "
        "(exact McNemar) cover which test states were drawn, not training randomness.", "",
        "![before and after](plots/before_after.png)", "",
    ]
    return lines


def _arm_tables(name: str, arm: Arm, reps: int, seed: int) -> list[str]:
    """The across-seeds table and the per-run table of one arm."""
    summaries = [run.summary for run in arm.runs]
    rows = []
    for label, read in ROWS:
        values = [float(read(s)) for s in summaries]
        if any(np.isnan(values)):
            continue
        estimate = stratified_bootstrap(arm.strata(dict(enumerate(values))), "iqm", reps, seed)
        rows.append([label, _signed(estimate.point, label),
                     f"[{_signed(estimate.low, label)}, {_signed(estimate.high, label)}]",
                     ", ".join(_signed(v, label) for v in values)])
    finals = [float(s["success_rate"]) for s in summaries]
    starts = [better_start(s) for s in summaries]
    chance = probability_of_improvement(finals, starts, reps, seed)
    rows.append(["P(final greedy > better start)", f"{chance.point:.2f}",
                 f"[{chance.low:.2f}, {chance.high:.2f}]", ""])
    positive = sum(float(s["improvement_vs_best_start"]) > 0 for s in summaries)
    intervals = [s["improvement_vs_best_start_interval"] for s in summaries
                 if "improvement_vs_best_start_interval" in s]
    above = sum(float(low) > 0 for low, _ in intervals)
    below = sum(float(high) < 0 for _, high in intervals)
    per_run = [[run.seed, _pct(s["start_success_rate"]), _pct(s["start_sampled_success_rate"]),
                s["best_start_decoding"], _pct(s["success_rate"]),
                _pct(s.get("sampled_success_rate", float("nan"))),
                _gain(s, "improvement_vs_best_start")]
               for run, s in zip(arm.runs, summaries, strict=True)]
    return [
        f"### `{name}`: {len(arm.runs)} seeds", "",
        _table(["", "IQM", "95% CI", "per seed"], rows), "",
        f"The final greedy policy beats the start's better decoding on {positive} of "
        f"{len(arm.runs)} seeds; its paired interval lies above 0 on {above} and below 0 "
        f"on {below}.", "",
        _table(["seed", "start greedy", "start sampled", "better (validation)", "final greedy",
                "final sampled", "gain vs better start [95% CI], p"], per_run), "",
    ]


def _signed(value: float, label: str) -> str:
    """Success rates as 0.xx, gains as signed points."""
    return f"{100 * value:+.0f}" if label.startswith("gain") else f"{value:.2f}"


def _pct(value: Any) -> str:
    return "-" if value is None or np.isnan(float(value)) else f"{float(value):.2f}"


def _gain(summary: dict[str, Any], key: str) -> str:
    """A paired gain in points with its interval and p, e.g. ``+21 [+8, +33], p = 0.0025``."""
    low, high = summary.get(f"{key}_interval", (float("nan"), float("nan")))
    p_value = summary.get(f"{key}_p_value", float("nan"))
    return (f"{100 * float(summary[key]):+.0f} [{100 * low:+.0f}, {100 * high:+.0f}], "
            f"p = {p_value:.2g}")


def _table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(str(c) for c in header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
