"""The training app: the :class:`Trainer` protocol, the run class of each algorithm, and
``train(config, run_dir)``.

Every algorithm family is a run class that meets :class:`Trainer`:
:class:`harness.algos.sb3.run.SB3Run`
for PPO, A2C and TRPO, :class:`harness.algos.group.run.GroupRun` for the group-relative algorithms.
:func:`train` checks what it can before the run directory is touched (the class's
``preflight``), takes the run directory's lock (:class:`harness.runs.RunLock`: one process
per run directory), checks a resume (``validate_checkpoint``), opens the run directory, builds the
start policy (group algorithms: :mod:`harness.start_policy`), builds the run object around it,
calls its ``train()`` and writes ``summary.json`` with the provenance of the result.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, ClassVar, Protocol

import tasks
from harness.algos.group.run import GroupRun
from harness.algos.sb3.run import SB3Run
from harness.config import GROUP_ALGOS, SB3_ALGOS, TrainConfig
from harness.evaluation import EvaluationResult, PolicyFn
from harness.provenance import git_commit, machine_info, package_versions
from harness.runs import Run, RunLock
from harness.start_policy import StartPolicy, build_start_policy

log = logging.getLogger(__name__)


class Trainer(Protocol):
    """What every run class provides.

    Building one (``cls(config, run, start)``) builds the run's objects around ``start``, the
    start policy the app built first (:func:`harness.start_policy.build_start_policy`, for a
    class that ``takes_start_policy``), or from the latest checkpoint when
    ``run.resume_metadata`` is set.
    """

    has_reference_policy: ClassVar[bool]  # checkpoints also hold the frozen start policy
    takes_start_policy: ClassVar[bool]  # the app builds the start policy before the run

    def __init__(self, config: TrainConfig, run: Run, start: StartPolicy | None = None
                 ) -> None: ...

    @staticmethod
    def preflight(config: TrainConfig) -> None:
        """Checks beyond the config (a cluster to join, a device's dtypes), before any file."""

    @staticmethod
    def validate_checkpoint(checkpoint: Path, metadata: dict[str, Any]) -> None:
        """Load a checkpoint to resume from, safely, before the run directory changes.

        Raises:
            harness.runs.CheckpointError: It cannot be loaded or resumed.
        """

    @staticmethod
    def load_policy(checkpoint: Path, metadata: dict[str, Any], device: str = "cpu",
                    sampled: bool = False, reference: bool = False) -> PolicyFn:
        """The policy function of a checkpoint (:mod:`harness.checkpoints`)."""

    def iteration(self) -> dict[str, float]:
        """One rollout and update; its metrics."""

    def evaluate(self, split: str, sampled: bool = False, videos: int = 0) -> EvaluationResult:
        """The current policy on the ``validation`` or ``test`` seeds."""

    def save(self, name: str) -> Path:
        """Write checkpoint ``name`` (``latest``, ``best``); its path."""

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs: the one home of the checkpoint's format."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""

    def train(self) -> dict[str, Any]:
        """Train the whole budget and evaluate; the run's summary (``env_steps`` included)."""


TRAINERS: dict[str, type[Trainer]] = {
    **{name: SB3Run for name in SB3_ALGOS},
    **{name: GroupRun for name in GROUP_ALGOS},
}


def trainer_class(algo: str) -> type[Trainer]:
    """The run class that trains ``algo`` and reads its checkpoints.

    Raises:
        ValueError: Unknown algorithm (lists the choices).
    """
    if algo not in TRAINERS:
        raise ValueError(f"unknown algo {algo!r}; choose one of {sorted(TRAINERS)}")
    return TRAINERS[algo]


def train(config: TrainConfig, run_dir: str | Path) -> dict[str, Any]:
    """Train ``config`` into ``run_dir`` and write ``summary.json``; the whole app.

    Args:
        config: The validated configuration.
        run_dir: The run directory (Hydra's output dir under ``scripts/train.py``).

    Returns:
        The summary that was written.

    Raises:
        ValueError: Unknown algorithm (before any env starts).
        harness.runs.RunInUseError: Another process is training into ``run_dir``
            (:class:`harness.runs.RunLock`); raised before anything in ``run_dir`` changes.
        harness.runs.CheckpointError: See :meth:`harness.runs.Run.checkpoint_to_resume`, or a
            checkpoint the trainer cannot load; raised before anything in ``run_dir`` changes.
    """
    trainer = trainer_class(config.algo.name)
    trainer.preflight(config)  # e.g. a Ray cluster to reach: fail before any file
    with RunLock(run_dir):  # the first thing in the run directory, held until the run ends
        return _train_locked(trainer, config, Path(run_dir))


def _train_locked(trainer: type[Trainer], config: TrainConfig, run_dir: Path) -> dict[str, Any]:
    """:func:`train` once this process holds the run directory's :class:`RunLock`."""
    resume = Run.checkpoint_to_resume(run_dir, config)
    metadata = None
    if resume is not None:  # every check before anything in the run directory changes
        checkpoint, metadata = resume
        trainer.validate_checkpoint(checkpoint, metadata)
        finished = _finished_summary(run_dir, metadata, config)
        if finished is not None:
            log.info("resume=true: the run in %s already finished its budget (%d env steps); "
                     "nothing to do (raise total_timesteps or algo.iterations to train further)",
                     run_dir, metadata["num_timesteps"])
            return finished
    run = Run(run_dir, config, resume_metadata=metadata)
    try:
        start = None
        if trainer.takes_start_policy and metadata is None:  # demos, pretraining, BC
            start = build_start_policy(config, run.dir)
        result = trainer(config, run, start).train()
        env_steps = int(result.get("env_steps", 0))
        wall_clock = run.elapsed()
        summary = {
            "algo": config.algo.name,
            "task": config.task.name,
            "task_version": tasks.task_version(config.task.name, config.task.suite),
            "seed": config.seed,
            **result,
            "env_steps": env_steps,
            "wall_clock_s": round(wall_clock, 3),
            "fps": round(env_steps / wall_clock, 1) if wall_clock > 0 else None,
            "versions": package_versions(),
            "machine": machine_info(),
            "git": git_commit(),
            "run_dir": str(run.dir.resolve()),
        }
        run.write_summary(summary)
        log.info("summary: success_rate=%.3f [%.3f, %.3f] after %d env steps in %.0f s -> %s",
                 summary.get("success_rate", float("nan")),
                 *summary.get("success_interval", (float("nan"), float("nan"))),
                 env_steps, wall_clock, run.dir / "summary.json")
        return summary
    finally:
        run.close()


def _finished_summary(run_dir: Path, metadata: dict[str, Any],
                      config: TrainConfig) -> dict[str, Any] | None:
    """The summary of a run that already used its whole budget, or ``None``.

    A run is finished when its ``summary.json`` was written from the latest checkpoint and that
    checkpoint reached its family's budget: ``algo.iterations`` for the group algorithms,
    ``total_timesteps`` for SB3.
    """
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a damaged summary: resume rewrites it
    steps = int(metadata["num_timesteps"])
    if config.algo.family == "group":
        done = int(metadata.get("iteration", 0)) >= config.algo.iterations
    else:
        done = steps >= config.total_timesteps
    return summary if done and summary.get("env_steps") == steps else None
