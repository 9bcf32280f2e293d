"""Figure of a run with demonstration starts: where groups started and how they fared.

Top: the fraction of the demonstration left at the demo curriculum's frontier
(``starts/demo_remaining``). Bottom: the informative fraction of the groups started along the
demos and from resets (``starts/signal_demo``, ``starts/signal_reset``), training success of all
attempts (``rollout/success_rate``) and held-out validation success from fresh resets
(``eval/success_rate``), against environment steps.

usage: python scripts/start_states_figure.py <run dir> [--out <file.png>]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from common.files import read_metrics


def smooth(values: np.ndarray, window: int = 10) -> np.ndarray:
    """Trailing moving average (NaNs ignored)."""
    out = np.empty(len(values))
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1): i + 1]
        chunk = chunk[np.isfinite(chunk)]
        out[i] = chunk.mean() if len(chunk) else np.nan
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: <run dir>/start_states.png")
    args = parser.parse_args(argv)
    metrics = read_metrics(args.run_dir / "metrics.csv")
    if "starts/demo_remaining" not in metrics:
        raise SystemExit(f"{args.run_dir / 'metrics.csv'} has no starts/demo_remaining: was the "
                         "run trained with algo.start_states=demo or mix?")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key: str) -> tuple[np.ndarray, np.ndarray]:
        pairs = metrics.get(key, [])
        return (np.array([p[0] for p in pairs], float), np.array([p[1] for p in pairs], float))

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    steps, remaining = series("starts/demo_remaining")
    top.step(steps, remaining, where="post", color="tab:purple")
    top.set_ylabel("demonstration left\nat the frontier")
    top.set_ylim(0, 1.05)
    for key, label, colour in (("starts/signal_demo", "informative, demo starts", "tab:purple"),
                               ("starts/signal_reset", "informative, reset starts", "tab:gray"),
                               ("rollout/success_rate", "training success", "tab:blue")):
        x, y = series(key)
        if len(x):
            bottom.plot(x, smooth(y), label=f"{label} (10-iteration mean)", color=colour)
    x, y = series("eval/success_rate")
    if len(x):
        bottom.plot(x, y, "o-", color="tab:red", label="validation success (fresh resets)")
    bottom.set_xlabel("environment steps")
    bottom.set_ylabel("fraction")
    bottom.set_ylim(0, 1.05)
    bottom.legend(fontsize=8, loc="upper right")
    figure.tight_layout()
    out = args.out or args.run_dir / "start_states.png"
    figure.savefig(out, dpi=110)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
