"""How a group-trainer run's policy moved, iteration by iteration: so a collapse is seen.

Reads the ``metrics.csv`` of every run folder given and draws one panel per diagnostic the
trainer logs (``harness.algos.group.update``): training success, the KL to the start per ratio
unit and per decision, the ratio's spread (its standard deviation, minimum and maximum over the
units of each update), the clip fraction, the KL between consecutive policies, the head's noise
scale (a Gaussian's std, a flow's sigma), the entropy and the gradient norm, each against the
iteration, one line per run. Writes ``<out>/training_diagnostics.png`` and
``<out>/training_diagnostics.json`` (each series' first, largest and last value per run).
Usage, from the repository root:

    python studies/training_diagnostics.py RUN_DIR [RUN_DIR ...] [--labels A B ...] [--out DIR]

A run whose KL to the start climbs by orders of magnitude while its training success falls is
the collapse ``algo.ratio``, ``algo.exploration``, ``algo.target_kl`` and ``algo.bc_coef``
exist to prevent (docs/group.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from harness_common.files import read_metrics, write_json
from harness_common.plots import save_figure

# (metric, panel title, log scale)
PANELS: tuple[tuple[str, str, bool], ...] = (
    ("rollout/success_rate", "training success", False),
    ("eval/success_rate", "validation success (greedy)", False),
    ("train/kl_to_reference", "KL to the start, per unit", True),
    ("train/kl_to_reference_decision", "KL to the start, per decision", True),
    ("train/approx_kl", "KL(old || new) per unit", True),
    ("train/clip_fraction", "clip fraction", False),
    ("train/ratio_std", "ratio std over units", False),
    ("train/ratio_max", "largest ratio", True),
    ("train/ratio_min", "smallest ratio", True),
    ("train/std_mean", "noise scale (std / sigma), mean", True),
    ("train/entropy", "entropy per unit", False),
    ("train/grad_norm", "gradient norm (before clipping)", True),
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="group-trainer run folders")
    parser.add_argument("--labels", nargs="+", default=None,
                        help="one legend label per run (default: the folder names)")
    parser.add_argument("--out", type=Path, default=Path("."),
                        help="where the figure and the JSON go (default: here)")
    args = parser.parse_args(argv)
    if args.labels is not None and len(args.labels) != len(args.runs):
        parser.error(f"--labels gives {len(args.labels)} labels for {len(args.runs)} runs")
    for run in args.runs:
        if not (run / "metrics.csv").is_file():
            parser.error(f"{run} has no metrics.csv; give group-trainer run folders")
    return args


def series_of(metrics: Mapping[str, list[tuple[int, float]]], key: str) -> list[float]:
    """The values of ``key`` in the order they were logged (one per iteration for ``train/``
    and ``rollout/``, one per validation for ``eval/``)."""
    return [value for _, value in metrics.get(key, [])]


def summarise(runs: Mapping[str, Mapping[str, list[tuple[int, float]]]]) -> dict:
    """``{run: {metric: {first, largest, last}}}`` of the panels' series (finite values)."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for label, metrics in runs.items():
        table[label] = {}
        for key, _, _ in PANELS:
            values = [v for v in series_of(metrics, key) if math.isfinite(v)]
            if values:
                table[label][key] = {"first": values[0], "largest": max(values),
                                     "last": values[-1]}
    return table


def diagnostics_figure(runs: Mapping[str, Mapping[str, list[tuple[int, float]]]],
                       out: Path) -> Path:
    """Draw the panels that any run logged into ``out`` (a PNG)."""
    shown = [panel for panel in PANELS if any(series_of(m, panel[0]) for m in runs.values())]
    columns = 3
    rows = max(1, math.ceil(len(shown) / columns))
    figure = Figure(figsize=(4.2 * columns, 2.8 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, (key, title, log_scale) in zip(axes, shown, strict=False):
        for label, metrics in runs.items():
            values = series_of(metrics, key)
            if values:
                # a few points (validations) get markers: one point alone draws no line
                ax.plot(range(1, len(values) + 1), values, label=label, linewidth=1.2,
                        marker="o" if len(values) <= 20 else None, markersize=4)
        if log_scale and any(v > 0 for m in runs.values() for v in series_of(m, key)):
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("validation" if key.startswith("eval/") else "iteration", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    if shown:
        axes[0].legend(fontsize=7)
    return save_figure(figure, out)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    labels = args.labels or [run.name for run in args.runs]
    runs = {label: read_metrics(run / "metrics.csv") for label, run in zip(labels, args.runs,
                                                                         strict=True)}
    args.out.mkdir(parents=True, exist_ok=True)
    figure = diagnostics_figure(runs, args.out / "training_diagnostics.png")
    write_json(args.out / "training_diagnostics.json", summarise(runs))
    print(f"wrote {figure} and {args.out / 'training_diagnostics.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
