"""Evaluate a saved checkpoint: ``python scripts/evaluate.py checkpoint=<path> episodes=100``.

A Hydra app over ``conf/evaluate.yaml`` (``--help`` lists the keys, ``--cfg job`` prints them,
``-m`` sweeps them). ``checkpoint`` is a run directory (its best checkpoint, else its latest), a
``checkpoints/`` folder, a checkpoint file or its metadata JSON. The metadata's ``algo`` picks the
loader (``harness.checkpoints.evaluate_checkpoint``: SB3 for ppo/a2c/trpo,
``harness.algos.group.run`` otherwise). Prints the success rate with its 95% Wilson interval, the
mean
episode length and a per-difficulty table.

Keys (typed by :class:`EvaluateConfig`): ``episodes`` (per difficulty), ``difficulties=[0.5,1.0]``
(default: the training run's), ``seed`` (default: the training run's held-out evaluation seed),
``video=<file.mp4>`` (records ``video_episodes`` episodes), ``output=<file.json>``, ``device``,
``sampled=true`` (sample actions instead of the greedy ones; group fine-tuning optimises the
sampled policy), ``reference=true`` (group-trainer checkpoints: the frozen start policy, e.g. the
BC policy, stored in the same file), ``domain`` (``trained``: the run's ``task.randomization`` and
``task.imperfections``; ``nominal``: both off), and ``task``: task options over the run's, spelt
as in ``scripts/train.py``, each replacing the run's whole
(:func:`harness.evaluation.override_task_options`): ``+task.max_episode_steps=100`` (default: the
run's ``eval.max_episode_steps``, else its training limit), ``domain=nominal
+task.randomization.enabled=true +task.randomization.friction=[0.3,2.0]
+task.imperfections.action_latency=2`` (a held-out randomised domain, docs/sim_to_real.md). The
options that fix what the policy sees (``obs_mode``, ``camera``, ``image_size``) stay the run's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from harness.apps import conf_file
from harness_common.cli import run_app
from harness_common.files import atomic_write_text, to_json

# Where the world starts from: the training run's task options, or its randomisation and
# imperfections off (the nominal world); ``task`` overrides then apply over either.
DOMAINS = ("trained", "nominal")
NOMINAL = {"randomization": {}, "imperfections": {}}
# Keys this app once had, and the ones that replace them (refused with the new spelling).
RENAMED = {"randomization": "task.randomization", "imperfections": "task.imperfections",
           "max_episode_steps": "task.max_episode_steps"}


@dataclass
class EvaluateConfig:
    """The primary config of this app (``conf/evaluate.yaml``); see the module docstring."""

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
    domain: str = "trained"
    task: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The harness is imported where it is used (here, evaluate()): composing
        # the config (--help, --cfg job) loads neither torch nor the trainers.
        from harness.policies import resolve_device

        if self.episodes < 1:
            raise ValueError(f"episodes={self.episodes}; must be >= 1")
        if self.video_episodes < (1 if self.video else 0):
            raise ValueError(f"video_episodes={self.video_episodes}; must be >= 1 with video=")
        if self.difficulties is not None:
            bad = [d for d in self.difficulties if not 0.0 <= d <= 1.0]
            if not self.difficulties or bad:
                raise ValueError(f"difficulties={list(self.difficulties)}; need values in [0, 1]"
                                 " (null: the training run's)")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed={self.seed}; must be >= 0 or null")
        resolve_device(self.device)
        if self.domain not in DOMAINS:
            raise ValueError(f"domain={self.domain!r}; expected one of {list(DOMAINS)}")

    def task_overrides(self) -> dict[str, Any]:
        """The task options in place of the training run's: ``domain``'s, then ``task``."""
        return {**(NOMINAL if self.domain == "nominal" else {}), **self.task}


ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)


def fail(message: str) -> NoReturn:
    """Print ``message`` as this script's error and exit with status 1."""
    print(f"evaluate.py: {message}", file=sys.stderr)
    raise SystemExit(1)


@hydra.main(version_base="1.3", config_path="pkg://harness.conf", config_name="evaluate")
def evaluate(cfg: DictConfig) -> None:
    """Evaluate ``cfg.checkpoint``, print the table, write the video and the results file."""
    from harness.checkpoints import evaluate_checkpoint
    from harness.runs import CheckpointError, write_video

    try:
        args = OmegaConf.to_object(cfg)
    except MissingMandatoryValue:
        fail("checkpoint=<path> is required: a run dir, a checkpoints/ folder, a checkpoint file"
             " or its metadata JSON")
    except (OmegaConfBaseException, ValueError) as error:
        fail(str(error))
    try:
        result, metadata = evaluate_checkpoint(
            args.checkpoint, args.episodes, args.difficulties, args.seed,
            args.video_episodes if args.video else 0, args.device,
            sampled=args.sampled, reference=args.reference, task_overrides=args.task_overrides(),
        )
    except (CheckpointError, ValueError) as error:
        fail(str(error))
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
                  "task_overrides": args.task_overrides(), **result.summary()}
        atomic_write_text(Path(args.output), to_json(report))
        print(f"results: {args.output}")


def main(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line) and return its exit status: 0, or 1
    after an error (a bad key or value, a key spelt the old way, a missing or corrupt
    checkpoint)."""
    return run_app(evaluate, argv, renamed=RENAMED, help_file=conf_file("evaluate"))


if __name__ == "__main__":
    sys.exit(main())
