"""Figures people would rather look at than read: learning curves of a run, and the curves and
interval estimates of several runs per arm (the report)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import EngFormatter  # noqa: E402

from harness_common.files import atomic_write, read_metrics  # noqa: E402


def save_figure(figure, path: str | Path, **savefig_kwargs) -> Path:
    """Save ``figure`` atomically (format from the suffix) and close it; a kill mid-save leaves
    the previous file, never a truncated image."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image_format = path.suffix.lstrip(".") or "png"
    atomic_write(path, lambda file: figure.savefig(file, format=image_format, **savefig_kwargs))
    plt.close(figure)
    return path


def learning_curve(metrics_csv: str | Path, out: str | Path, baseline: float | None = None,
                   title: str = "learning curve") -> Path:
    """Plot training success (per iteration), evaluation success and an optional baseline.

    Args:
        metrics_csv: A run's ``metrics.csv``.
        out: PNG path to write.
        baseline: A success rate drawn as a dashed line (e.g. the BC policy's).
        title: Figure title.

    Returns:
        The PNG path.
    """
    series = read_metrics(metrics_csv)
    figure, axis = plt.subplots(figsize=(7, 4), dpi=110)
    for key, label, style in (
        ("rollout/success_rate", "training attempts (sampled)", "-"),
        ("rollout/signal_fraction", "groups with signal", ":"),
        ("eval/success_rate", "validation seeds (greedy)", "o-"),
        ("final/success_rate", "test seeds, final (greedy)", "s"),
    ):
        if key in series:
            steps, values = zip(*series[key], strict=True)
            axis.plot(steps, values, style, label=label, markersize=5)
    if baseline is not None:
        axis.axhline(baseline, color="grey", linestyle="--", label=f"BC policy ({baseline:.2f})")
    axis.set_xlabel("environment steps")
    axis.set_ylabel("success rate / fraction")
    axis.set_ylim(-0.02, 1.02)
    axis.grid(alpha=0.3)
    axis.legend(loc="best", fontsize=8)
    axis.set_title(title)
    figure.tight_layout()
    return save_figure(figure, out)


def _steps_and_values(series: Mapping[str, list[tuple[int, float]]],
                      key: str) -> tuple[np.ndarray, np.ndarray]:
    """One metric of :func:`harness_common.files.read_metrics`'s series as (steps, values) arrays;
    empty when the run never logged it."""
    pairs = series.get(key, [])
    return np.array([p[0] for p in pairs], float), np.array([p[1] for p in pairs], float)


def start_states_curve(metrics_csv: str | Path, out: str | Path) -> Path:
    """Plot a run with demonstration starts: the fraction of the demonstration left at the demo
    curriculum's frontier (top); the informative fraction of demo- and reset-started groups,
    training success (10-iteration means) and validation success (bottom).

    Raises:
        ValueError: The run logged no ``starts/demo_remaining`` (no demo starts).
    """
    series = read_metrics(metrics_csv)
    if "starts/demo_remaining" not in series:
        raise ValueError(f"{metrics_csv} has no starts/demo_remaining: was the run trained with "
                         "algo.starts.source=demo or mix?")

    def curve(key: str) -> tuple[np.ndarray, np.ndarray]:
        return _steps_and_values(series, key)

    def mean_of_last(values: np.ndarray, window: int = 10) -> np.ndarray:
        return np.array([np.nanmean(values[max(0, i - window + 1): i + 1])
                         if np.isfinite(values[max(0, i - window + 1): i + 1]).any() else np.nan
                         for i in range(len(values))])

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, dpi=110)
    steps, remaining = curve("starts/demo_remaining")
    top.step(steps, remaining, where="post", color="tab:purple")
    top.set_ylabel("demonstration left\nat the frontier")
    top.set_ylim(0, 1.05)
    for key, label, colour in (("starts/signal_demo", "informative, demo starts", "tab:purple"),
                               ("starts/signal_reset", "informative, reset starts", "tab:gray"),
                               ("rollout/success_rate", "training success", "tab:blue")):
        x, y = curve(key)
        if len(x):
            bottom.plot(x, mean_of_last(y), label=f"{label} (10-iteration mean)", color=colour)
    x, y = curve("eval/success_rate")
    if len(x):
        bottom.plot(x, y, "o-", color="tab:red", label="validation success (fresh resets)")
    bottom.set_xlabel("environment steps")
    bottom.xaxis.set_major_formatter(EngFormatter())
    bottom.set_ylabel("fraction")
    bottom.set_ylim(0, 1.05)
    bottom.legend(fontsize=8, loc="upper right")
    figure.tight_layout()
    return save_figure(figure, out)


def verifier_audit_curve(metrics_csv: str | Path, out: str | Path, fp_target: float,
                         reference_csv: str | Path | None = None,
                         baseline_csv: str | Path | None = None,
                         baseline_label: str = "without the refresh") -> Path:
    """Plot a run scored by a learned verifier against the scripted truth, per iteration: the
    attempts' true and detected success (and the true success of a ``reference`` run scored by
    the scripted verifier), top; the detector's false-positive and false-negative rates on the
    policy's own attempts with the false-positive target, bottom, with a faint line at each
    refresh of the detector (``detector_refresh``). A ``baseline`` run (the same run scored by
    the same detector, not refreshed, or as ``baseline_label`` says) adds its true success and
    false-positive rate, dotted.

    Raises:
        ValueError: The run logged no ``detector/false_positive_rate`` (no learned verifier).
    """
    series = read_metrics(metrics_csv)
    if "detector/false_positive_rate" not in series:
        raise ValueError(f"{metrics_csv} has no detector/false_positive_rate: was the run trained "
                         "with reward=verifier detector=cnn?")

    curve = _steps_and_values
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, dpi=110)
    for key, label, style in (("rollout/success_rate", "true success (scripted check)", "-"),
                              ("rollout/verifier_success_rate", "success the detector saw",
                               "--")):
        top.plot(*curve(series, key), style, color="tab:blue", label=label)
    if reference_csv is not None:
        top.plot(*curve(read_metrics(reference_csv), "rollout/success_rate"), color="tab:gray",
                 label="true success, run with the scripted verifier")
    baseline = read_metrics(baseline_csv) if baseline_csv is not None else None
    if baseline is not None:
        top.plot(*curve(baseline, "rollout/success_rate"), ":", color="tab:purple",
                 label=f"true success, run {baseline_label}")
    top.set_ylabel("training attempts'\nsuccess")
    top.set_ylim(0, 1.05)
    top.legend(fontsize=8, loc="best")
    bottom.plot(*curve(series, "detector/false_positive_rate"), color="tab:red",
                label="false-positive rate (of true failures)")
    bottom.plot(*curve(series, "detector/false_negative_rate"), color="tab:orange",
                label="false-negative rate (of true successes)")
    if baseline is not None:
        bottom.plot(*curve(baseline, "detector/false_positive_rate"), ":", color="tab:purple",
                    label=f"false-positive rate, run {baseline_label}")
    bottom.axhline(fp_target, color="tab:red", linestyle=":", label=f"target {fp_target:g}")
    refreshed = [step for step, value in series.get("detector/refresh_skipped", []) if value == 0]
    for i, step in enumerate(refreshed):  # detector_refresh: the detector was fine-tuned here
        bottom.axvline(step, color="tab:green", alpha=0.25, linewidth=0.8,
                       label="detector refreshed" if i == 0 else None)
    bottom.set_xlabel("environment steps")
    bottom.xaxis.set_major_formatter(EngFormatter())
    bottom.set_ylabel("detector error rate")
    bottom.set_ylim(0, 1.05)
    bottom.legend(fontsize=8, loc="best")
    figure.tight_layout()
    return save_figure(figure, out)


# ------------------------------------------------------------------- several runs (reports)
def _arm_colours(arms: Sequence[str]) -> dict[str, str]:
    """One colour per arm, the same in every figure of a report."""
    return {arm: f"C{i % 10}" for i, arm in enumerate(arms)}


def interval_estimates(estimates: Mapping[str, tuple[float, float, float]],
                       points: Mapping[str, Sequence[float]], out: str | Path,
                       arms: Sequence[str] | None = None, xlabel: str = "score",
                       title: str = "") -> Path:
    """One row per arm: the point estimate with its interval, and each run's score as a dot.

    Args:
        estimates: ``{arm: (point, low, high)}``.
        points: ``{arm: run scores}``.
        out: PNG path to write.
        arms: Arm order (top to bottom) and colours; defaults to ``estimates``' order.
        xlabel: Axis label.
        title: Figure title.

    Returns:
        The PNG path.
    """
    arms = list(arms or estimates)
    colours = _arm_colours(arms)
    shown = [arm for arm in arms if arm in estimates]
    figure, axis = plt.subplots(figsize=(7, 1.2 + 0.6 * len(shown)), dpi=110)
    for row, arm in enumerate(reversed(shown)):
        point, low, high = estimates[arm]
        axis.plot([low, high], [row, row], color=colours[arm], linewidth=6, alpha=0.35,
                  solid_capstyle="butt")
        axis.plot([point], [row], "|", color=colours[arm], markersize=18, markeredgewidth=2.5)
        axis.plot(points.get(arm, []), [row] * len(points.get(arm, [])), "o",
                  color=colours[arm], markersize=4, markerfacecolor="white")
    axis.set_yticks(range(len(shown)), list(reversed(shown)), fontsize=8)
    axis.set_ylim(-0.6, len(shown) - 0.4)
    if all(0.0 <= min([low, *points.get(arm, [])]) and max([high, *points.get(arm, [])]) <= 1.0
           for arm, (_, low, high) in estimates.items()):
        axis.set_xlim(-0.02, 1.02)
    axis.set_xlabel(xlabel)
    axis.grid(axis="x", alpha=0.3)
    axis.set_title(title, fontsize=10)
    figure.tight_layout()
    return save_figure(figure, out)


def band_curves(panels: Mapping[str, Mapping[str, tuple[Sequence[float], ...]]],
                out: str | Path, arms: Sequence[str] | None = None, ylabel: str = "",
                title: str = "") -> Path:
    """Curves with bands against environment steps, one panel per entry of ``panels``.

    Args:
        panels: ``{panel title: {arm: (steps, centre, low, high)}}``; an arm with a single step
            is drawn as a point with an error bar.
        out: PNG path to write.
        arms: Arm order and colours; defaults to the order of first appearance.
        ylabel: Axis label of the values.
        title: Figure title.

    Returns:
        The PNG path.
    """
    arms = list(arms or dict.fromkeys(arm for curves in panels.values() for arm in curves))
    colours = _arm_colours(arms)
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), dpi=110,
                                squeeze=False, sharey=True)
    rates = all(0.0 <= np.min(c[2]) and np.max(c[3]) <= 1.0
                for curves in panels.values() for c in curves.values())
    for axis, (panel, curves) in zip(axes[0], panels.items(), strict=True):
        for arm in arms:
            if arm not in curves:
                continue
            steps, centre, low, high = (np.asarray(v, dtype=float) for v in curves[arm])
            if len(steps) == 1:
                axis.errorbar(steps, centre, yerr=[centre - low, high - centre], fmt="o",
                              capsize=4, color=colours[arm], label=arm)
                continue
            axis.plot(steps, centre, color=colours[arm], label=arm)
            axis.fill_between(steps, low, high, color=colours[arm], alpha=0.2, linewidth=0)
        axis.set_title(panel, fontsize=10)
        axis.set_xlabel("environment steps")
        axis.xaxis.set_major_formatter(EngFormatter(sep=""))
        axis.grid(alpha=0.3)
        if rates:
            axis.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(loc="best", fontsize=7)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    return save_figure(figure, out)


def before_after(pairs: Mapping[str, Sequence[Sequence[float]]], out: str | Path,
                 labels: Sequence[str] = ("before", "after"), title: str = "") -> Path:
    """One panel per arm: each run as a line from its ``before`` to its ``after`` score (a rise
    green, a fall red), with the median of each side as a bar.

    Args:
        pairs: ``{arm: [[before, after], ...]}``, one pair per run.
        out: PNG path to write.
        labels: The two sides' names.
        title: Figure title.

    Returns:
        The PNG path.
    """
    figure, axes = plt.subplots(1, len(pairs), figsize=(3.6 * len(pairs) + 0.8, 4.2), dpi=110,
                                squeeze=False, sharey=True)
    for axis, (arm, runs) in zip(axes[0], pairs.items(), strict=True):
        values = np.asarray(runs, dtype=float).reshape(-1, 2)
        for before, after in values:
            axis.plot([0, 1], [before, after], "o-", markersize=5, alpha=0.8,
                      color="tab:green" if after > before else "tab:red")
        for side in (0, 1):
            median = float(np.median(values[:, side]))
            axis.plot([side - 0.15, side + 0.15], [median, median], color="black", linewidth=3)
        axis.set_xticks([0, 1], list(labels), fontsize=8)
        axis.set_xlim(-0.4, 1.4)
        axis.set_title(f"{arm} ({len(values)} runs)", fontsize=9)
        axis.grid(axis="y", alpha=0.3)
    if np.all((0 <= np.concatenate([np.ravel(v) for v in pairs.values()]))
              & (np.concatenate([np.ravel(v) for v in pairs.values()]) <= 1)):
        axes[0][0].set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("success rate")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    return save_figure(figure, out)
