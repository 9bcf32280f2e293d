"""Figure of a run with demonstration starts: where groups started and how they fared.

Top: the fraction of the demonstration left at the demo curriculum's frontier
(``starts/demo_remaining``). Bottom: the informative fraction of the groups started along the
demos and from resets (``starts/signal_demo``, ``starts/signal_reset``), training success of all
attempts (``rollout/success_rate``) and held-out validation success from fresh resets
(``eval/success_rate``), against environment steps (``harness_common.plots.start_states_curve``).

usage: python studies/start_states_figure.py <run dir> [--out <file.png>]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness_common.plots import start_states_curve


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: <run dir>/start_states.png")
    args = parser.parse_args(argv)
    try:
        out = start_states_curve(args.run_dir / "metrics.csv",
                                 args.out or args.run_dir / "start_states.png")
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"start_states_figure.py: {error}") from None
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
