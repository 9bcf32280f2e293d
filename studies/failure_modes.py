"""How a group-trainer run's start policy and its fine-tuned policy end their test episodes.

For every run folder given, plays the checkpoint's stored start policy (the BC clone, the KL
reference) and the fine-tuned policy of its last iteration (``checkpoints/latest``, what the run's
``summary.json`` scored), greedily, on the run's own test seeds and difficulties, and puts each
episode in one outcome of ``harness.outcomes.OUTCOMES``: success, near miss (within 2 cm of the
success boundary), moved the named object, moved another object only (a distractor pushed instead),
moved nothing; with the paired gain (Newcombe's 95% interval, exact McNemar p), as ``summary.json``
gives it. ``--max-episode-steps`` scores another horizon. Writes ``<out>/failure_modes.json`` and
``<out>/failure_modes.png`` (one pair of stacked bars per run, start and fine-tuned, and the pooled
pair). Usage, from the repository root:

    python studies/failure_modes.py RUN_DIR [RUN_DIR ...] [--episodes 100] \
        [--max-episode-steps N] [--out DIR]

``--episodes`` defaults to 100 per difficulty, the trainer's final evaluation: the success
counts then equal the ones in ``summary.json`` (``success_rate``) and ``start/success_rate``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from harness.checkpoints import evaluate_checkpoint
from harness.outcomes import OUTCOMES, OutcomeRecorder, tally
from harness.runs import CheckpointError, resolve_checkpoint
from harness_common.files import write_json
from harness_common.plots import save_figure
from harness_common.stats import paired_summary

POLICIES = ("start", "fine-tuned")
COLOURS = {"success": "#2ca02c", "near miss": "#98df8a", "moved the named object": "#ff7f0e",
           "moved another object only": "#d62728", "moved nothing": "#7f7f7f",
           "missed": "#c7c7c7"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="group-trainer run folders")
    parser.add_argument("--episodes", type=int, default=100,
                        help="test episodes per difficulty and policy (default 100)")
    parser.add_argument("--max-episode-steps", type=int, default=None,
                        help="each episode's step limit (default: the run's evaluation limit)")
    parser.add_argument("--out", type=Path, default=Path("failure_modes"),
                        help="folder for the JSON and the figure (default ./failure_modes)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes={args.episodes}; must be >= 1")
    if args.max_episode_steps is not None and args.max_episode_steps < 1:
        parser.error(f"--max-episode-steps={args.max_episode_steps}; must be >= 1")
    return args


def play(checkpoint: Path, episodes: int, reference: bool,
         max_episode_steps: int | None = None) -> dict[str, Any]:
    """The outcomes of one policy of ``checkpoint`` on its run's test seeds."""
    recorders: list[OutcomeRecorder] = []

    def wrap(env):
        recorders.append(OutcomeRecorder(env))
        return recorders[-1]

    overrides = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    result, _ = evaluate_checkpoint(checkpoint, episodes, reference=reference, wrap=wrap,
                                    task_overrides=overrides)
    outcomes = [o for recorder in recorders for o in recorder.outcomes]
    if [o.success for o in outcomes] != [e.success for e in result.episodes]:
        raise RuntimeError(f"{checkpoint}: the recorded outcomes disagree with the evaluation")
    return tally(outcomes)


def play_run(run: Path, episodes: int, max_episode_steps: int | None = None
             ) -> dict[str, Any]:
    """Both policies of one run (its last checkpoint), with the run's seed and task.

    Raises:
        harness.runs.CheckpointError: No intact ``checkpoints/latest`` in ``run``.
        ValueError: A checkpoint of an algorithm without a stored start policy (SB3).
    """
    checkpoint, metadata = resolve_checkpoint(run / "checkpoints" / "latest.json")
    policies = {name: play(checkpoint, episodes, name == "start", max_episode_steps)
                for name in POLICIES}
    limit = (max_episode_steps or metadata.get("evaluation", {}).get("max_episode_steps")
             or metadata["task_options"].get("max_episode_steps"))
    paired = paired_summary([r["success"] for r in policies["start"]["records"]],
                            [r["success"] for r in policies["fine-tuned"]["records"]])
    return {"run_dir": str(run), "task": metadata["task"], "algo": metadata["algo"],
            "seed": metadata.get("seed"), "max_episode_steps": limit, "policies": policies,
            **paired}


def points(share: float) -> str:
    """A difference of success rates in signed percentage points (``+0``, never ``-0``)."""
    return f"{round(100 * share):+d}"


def pool(runs: Sequence[Mapping[str, Any]], policy: str) -> dict[str, Any]:
    """One policy's counts and shares added up over runs."""
    counts = {name: sum(r["policies"][policy]["counts"][name] for r in runs) for name in OUTCOMES}
    total = sum(counts.values())
    return {"episodes": total, "counts": counts,
            "shares": {name: counts[name] / total for name in OUTCOMES}}


def figure(runs: Sequence[Mapping[str, Any]], pooled: Mapping[str, Any], out: Path) -> Path:
    """Stacked horizontal bars: per run its start and fine-tuned policy, then the pool."""
    rows = [(f"seed {r['seed']}, {p}", r["policies"][p]["shares"]) for r in runs for p in POLICIES]
    if len(runs) > 1:
        rows += [(f"all {len(runs)} runs, {p}", pooled[p]["shares"]) for p in POLICIES]
    shown = [name for name in OUTCOMES if any(shares[name] > 0 for _, shares in rows)]
    fig = Figure(figsize=(9, 0.32 * len(rows) + 1.6), layout="constrained")
    axis = fig.subplots()
    left = np.zeros(len(rows))
    for name in shown:
        widths = np.array([shares[name] for _, shares in rows])
        axis.barh(range(len(rows)), widths, left=left, color=COLOURS[name], label=name)
        for y, (x, w) in enumerate(zip(left, widths, strict=True)):
            if w >= 0.06:
                axis.text(x + w / 2, y, f"{w:.2f}", ha="center", va="center", fontsize=7)
        left += widths
    axis.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlim(0, 1)
    axis.set_xlabel("share of test episodes (greedy)")
    fig.legend(loc="outside lower center", ncol=len(shown), fontsize=8)
    task, algo = runs[0]["task"], runs[0]["algo"]
    limits = sorted({r["max_episode_steps"] for r in runs if r["max_episode_steps"]})
    steps = f" of {'/'.join(map(str, limits))} steps" if limits else ""
    fig.suptitle(f"{task}, {algo}: how the start policy and the fine-tuned one end their "
                 f"test episodes{steps}", fontsize=10)
    return save_figure(fig, out)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Play every run's two policies, pool them, write the JSON and the figure.

    Raises:
        FileNotFoundError: A run folder that does not exist.
        harness.runs.CheckpointError, ValueError: See :func:`play_run`.
    """
    args = parse_args(argv)
    for run in args.runs:
        if not run.is_dir():
            raise FileNotFoundError(f"{run} is not a folder; pass run folders written by "
                                    "scripts/train.py with a group algorithm")
    runs = []
    for run in args.runs:
        runs.append(play_run(run, args.episodes, args.max_episode_steps))
        shares = {p: runs[-1]["policies"][p]["shares"] for p in POLICIES}
        low, high = runs[-1]["improvement_interval"]
        print(f"{run} (seed {runs[-1]['seed']}, {runs[-1]['max_episode_steps']} steps): " +
              "; ".join(f"{p} success {shares[p]['success']:.2f}" for p in POLICIES) +
              f"; gain {points(runs[-1]['improvement'])} points [{points(low)}, "
              f"{points(high)}], McNemar p = {runs[-1]['improvement_p_value']:.2g}",
              flush=True)
    pooled = {p: pool(runs, p) for p in POLICIES}
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"episodes_per_difficulty": args.episodes, "outcomes": list(OUTCOMES),
              "pooled": pooled, "runs": runs}
    write_json(args.out / "failure_modes.json", result)
    figure(runs, pooled, args.out / "failure_modes.png")
    return result


if __name__ == "__main__":
    try:
        result = main()
    except (FileNotFoundError, CheckpointError, ValueError) as error:
        print(f"failure_modes.py: {error}", file=sys.stderr)
        sys.exit(1)
    width = max(len(name) for name in OUTCOMES)
    print(f"{'outcome':{width}s}  " + "  ".join(f"{p:>10s}" for p in POLICIES))
    for name in OUTCOMES:
        print(f"{name:{width}s}  " + "  ".join(
            f"{result['pooled'][p]['shares'][name]:10.3f}" for p in POLICIES))
