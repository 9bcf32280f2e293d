"""Figure: how often a group carries no signal, and what each estimator makes of one group.

Left: probability that a group of G Bernoulli(p) attempts is all-equal (no GRPO signal),
``p**G + (1 - p)**G``, against p for G = 2, 4, 8, 16. Right: one sampled group at the chosen p
(resampled until it holds a success) and the advantage of each attempt under GRPO
((r - mean) / std), Dr. GRPO (r - mean) and a critic baseline that knows p (r - p).

Usage, from the repository root:
    python -m studies.signal_figure --out signal_figure.png --p 0.05 --group-size 8 --seed 0
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.curriculum import no_signal_probability
from harness.objectives import group_advantages
from harness_common.plots import save_figure

GROUP_SIZES = (2, 4, 8, 16)
ESTIMATOR_LABELS = {
    "grpo": "GRPO: (r - mean) / std",
    "dr_grpo": "Dr. GRPO: r - mean",
    "critic": "critic baseline: r - p",
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("signal_figure.png"), help="PNG path")
    parser.add_argument("--p", type=float, default=0.05, help="success probability, in (0, 1]")
    parser.add_argument("--group-size", type=int, default=8, help="attempts per group, >= 2")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled group")
    args = parser.parse_args(argv)
    if not 0.0 < args.p <= 1.0:
        parser.error(f"--p must be in (0, 1] so that a group can hold a success, got {args.p}")
    if args.group_size < 2:
        parser.error(f"--group-size must be >= 2, got {args.group_size}")
    return args


def main(argv: Sequence[str] | None = None) -> Path:
    """Draw the figure and save it.

    Args:
        argv: Command-line arguments; ``None`` reads ``sys.argv``.

    Returns:
        Path of the written PNG.
    """
    args = parse_args(argv)
    p, group_size = args.p, args.group_size

    # One group of G attempts, redrawn until it holds a success so that the bars are not all 0.
    rng = np.random.default_rng(args.seed)
    draws = 1
    outcomes = rng.random(group_size) < p
    while not outcomes.any():
        outcomes = rng.random(group_size) < p
        draws += 1
    rewards = torch.as_tensor(outcomes, dtype=torch.float64)
    values = torch.full_like(rewards, p)
    advantages = {
        name: group_advantages(rewards, group_size, estimator=name, values=values).numpy()
        for name in ESTIMATOR_LABELS
    }

    # A bare Figure on the Agg canvas: no pyplot state, no display needed.
    fig = Figure(figsize=(13, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_signal, ax_adv = fig.subplots(1, 2)

    p_grid = np.linspace(0.0, 1.0, 401)
    for g in GROUP_SIZES:
        ax_signal.plot(p_grid, no_signal_probability(p_grid, g), label=f"G = {g}", lw=2)
    chosen = no_signal_probability(p, group_size)
    ax_signal.axvline(p, color="grey", ls="--", lw=1)
    ax_signal.plot([p], [chosen], "ko")
    ax_signal.annotate(
        f"p = {p:g}, G = {group_size}\nP(no signal) = {chosen:.4f}",
        xy=(p, chosen),
        xytext=(0.12, 0.88),
        arrowprops={"arrowstyle": "->", "color": "black"},
        bbox={"boxstyle": "round", "fc": "white", "ec": "grey"},
    )
    ax_signal.set(
        xlabel="success probability p of one attempt",
        ylabel=r"P(no signal) = $p^G + (1-p)^G$",
        title="Groups with all-equal outcomes give zero advantage",
        xlim=(0, 1),
        ylim=(0, 1.02),
    )
    ax_signal.grid(alpha=0.3)
    ax_signal.legend(loc="upper center", bbox_to_anchor=(0.58, 1.0))

    attempts = np.arange(group_size)
    width = 0.8 / len(advantages)
    for k, (name, adv) in enumerate(advantages.items()):
        offset = (k - (len(advantages) - 1) / 2) * width
        ax_adv.bar(attempts + offset, adv, width, label=ESTIMATOR_LABELS[name])
    ax_adv.axhline(0.0, color="black", lw=0.8)
    ax_adv.set_xticks(
        attempts, [f"{i + 1}\n{'success' if s else 'fail'}" for i, s in enumerate(outcomes)]
    )
    ax_adv.set(
        xlabel="attempt",
        ylabel="advantage",
        title=(
            f"One group, p = {p:g}, G = {group_size}, seed {args.seed}\n"
            f"(groups resampled until one held a success: draw {draws})"
        ),
    )
    ax_adv.grid(axis="y", alpha=0.3)
    ax_adv.legend()

    return save_figure(fig, args.out, dpi=120)


if __name__ == "__main__":
    print(main())
