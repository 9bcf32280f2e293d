"""Evaluate a saved checkpoint: ``python scripts/evaluate.py checkpoint=<path> episodes=100``.

``checkpoint`` is a run directory (its best checkpoint, else its latest), a ``checkpoints/``
folder, a checkpoint file or its metadata JSON. The metadata's ``algo`` picks the loader (SB3 for
ppo/a2c/trpo, ``harness.algos.group`` otherwise). Prints the success rate with its 95% Wilson
interval, the mean episode length and a per-difficulty table.

Options (``key=value``, typed by :class:`EvaluateConfig`): ``episodes`` (per difficulty),
``difficulties=[0.5,1.0]`` (default: the training run's), ``seed`` (default: the training run's
held-out evaluation seed), ``video=<file.mp4>`` (records ``video_episodes`` episodes),
``output=<file.json>``, ``device``, ``sampled=true`` (sample actions instead of the greedy ones;
group fine-tuning optimises the sampled policy), ``reference=true`` (group-trainer checkpoints:
the frozen start policy, e.g. the BC policy, stored in the same file).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.evaluation import evaluate_checkpoint
from harness.runs import CheckpointError, atomic_write_text, to_json, write_video


@dataclass
class EvaluateConfig:
    checkpoint: str = MISSING
    episodes: int = 100
    difficulties: list[float] | None = None
    seed: int | None = None
    video: str | None = None
    video_episodes: int = 1
    output: str | None = None
    device: str = "cpu"
    sampled: bool = False
    reference: bool = False


def parse(argv: list[str]) -> EvaluateConfig:
    """``key=value`` arguments into an :class:`EvaluateConfig` (unknown keys name themselves)."""
    cfg = OmegaConf.merge(OmegaConf.structured(EvaluateConfig), OmegaConf.from_dotlist(argv))
    return OmegaConf.to_object(cfg)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(list(sys.argv[1:] if argv is None else argv))
    except OmegaConfBaseException as error:
        print(f"evaluate.py: {error}\n{__doc__}", file=sys.stderr)
        return 2
    try:
        result, metadata = evaluate_checkpoint(
            args.checkpoint, args.episodes, args.difficulties, args.seed,
            args.video_episodes if args.video else 0, args.device,
            sampled=args.sampled, reference=args.reference,
        )
    except (CheckpointError, ValueError) as error:
        print(f"evaluate.py: {error}", file=sys.stderr)
        return 1
    low, high = result.success_interval
    which = ("start (reference) policy of " if args.reference else "") + metadata["algo"]
    mode = "sampled" if args.sampled else "greedy"
    print(f"{which} ({mode}) on {metadata['task']} at {metadata.get('num_timesteps')} steps: "
          f"success {result.success_rate:.3f} [{low:.3f}, {high:.3f}] (95% Wilson) over "
          f"{len(result.episodes)} episodes, mean length {result.mean_length:.1f}")
    print(result.table())
    if args.video:
        frames = [frame for episode in result.videos for frame in episode]
        write_video(Path(args.video), frames)
        print(f"video: {args.video}")
    if args.output:
        report = {"checkpoint": args.checkpoint, "algo": metadata["algo"],
                  "task": metadata["task"], "num_timesteps": metadata.get("num_timesteps"),
                  "sampled": args.sampled, "reference": args.reference,
                  **result.summary()}
        atomic_write_text(Path(args.output), to_json(report))
        print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
