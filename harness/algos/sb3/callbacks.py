"""SB3 callbacks and logger output: how the harness plugs into SB3's training loop.

Curriculum updates, verifier error rates, the time guard, periodic evaluation and checkpoints
run as :class:`~stable_baselines3.common.callbacks.BaseCallback` subclasses; the schedules they
follow are the ones every trainer shares (:mod:`harness.algos.hooks`).
"""


from __future__ import annotations

import logging
import sys
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import HumanOutputFormat, KVWriter, Logger

from harness import curriculum as curricula
from harness.algos.hooks import Schedule, TimeGuard
from harness.runs import Run

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------ logging
class RunOutputFormat(KVWriter):
    """SB3 logger output that writes into the run directory (metrics.csv, TensorBoard)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def write(
        self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0
    ) -> None:
        self.run.log(key_values, step)

    def close(self) -> None:
        """The run closes its own files."""


def make_logger(run: Run, console: bool) -> Logger:
    """SB3 logger writing into ``run`` (and a table on stdout with ``console``)."""
    formats: list[KVWriter] = [RunOutputFormat(run)]
    if console:
        formats.append(HumanOutputFormat(sys.stdout))
    return Logger(folder=str(run.dir), output_formats=formats)


# ---------------------------------------------------------------------------------- callbacks
class CurriculumCallback(BaseCallback):
    """Feeds finished episodes to the curriculum and chooses the next difficulty of that env.

    The outcome is the reward's: the verifier's verdict (``info["verifier_success"]``) when a
    verifier gives the reward, else the ground truth ``info["is_success"]``. The vector env has
    already reset the finished env when ``_on_step`` runs, so a choice made here plays from that
    env's following episode: the schedule lags one episode per env.

    Args:
        curriculum: The run's curriculum.
        run: The run (for its metrics).
        outcome_key: The ``info`` key of an episode's outcome.
    """

    def __init__(self, curriculum, run: Run, outcome_key: str = "is_success") -> None:
        super().__init__()
        self.curriculum = curriculum
        self.run = run
        self.outcome_key = outcome_key

    def _on_step(self) -> bool:
        for index, done in enumerate(self.locals["dones"]):
            if not done:
                continue
            info = self.locals["infos"][index]
            if self.outcome_key not in info:
                raise KeyError(f"episode ended without info[{self.outcome_key!r}]; the verifier "
                               "wrapper must score the last step (verifier.when)")
            self.curriculum.update(info["curriculum_difficulty"],
                                   [bool(info[self.outcome_key])])
            difficulty = self.curriculum.sample()
            self.training_env.env_method(
                "set_next_episode", difficulty, self.curriculum.reset_options(difficulty),
                indices=[index],
            )
        return True

    def _on_rollout_end(self) -> None:
        if not isinstance(self.curriculum, curricula.FixedCurriculum):
            self.run.log(self.curriculum.metrics(), self.num_timesteps)


class AdrCallback(BaseCallback):
    """Automatic domain randomisation for SB3: chooses each env's ranges episode by episode
    and feeds ADR the outcomes of the episodes that pinned a boundary.

    As with :class:`CurriculumCallback`, a vector env has already reset a finished env when
    ``_on_step`` runs, so a choice plays from that env's following episode; the callback keeps,
    per env, the episode playing and the one queued. Each env's first episode plays the
    configured randomisation (no ADR episode is queued before training starts).

    Args:
        adr: The run's :class:`~harness.curriculum.AutomaticDomainRandomization`.
        run: The run (for its metrics).
        outcome_key: The ``info`` key of an episode's outcome.
    """

    def __init__(self, adr, run: Run, outcome_key: str = "is_success") -> None:
        super().__init__()
        self.adr, self.run, self.outcome_key = adr, run, outcome_key
        self.playing: list = []
        self.queued: list = []

    def _on_training_start(self) -> None:
        envs = self.training_env.num_envs
        self.playing = [None] * envs
        self.queued = [None] * envs
        for index in range(envs):
            self._queue(index)

    def _queue(self, index: int) -> None:
        self.queued[index] = self.adr.sample()
        self.training_env.env_method("set_next_randomization",
                                     self.adr.reset_options(self.queued[index]), indices=[index])

    def _on_step(self) -> bool:
        for index, done in enumerate(self.locals["dones"]):
            if not done:
                continue
            finished, self.playing[index] = self.playing[index], self.queued[index]
            if finished is not None:
                self.adr.update(finished, [bool(self.locals["infos"][index][self.outcome_key])])
            self._queue(index)
        return True

    def _on_rollout_end(self) -> None:
        self.run.log(self.adr.metrics(), self.num_timesteps)


class LogDumpCallback(BaseCallback):
    """Writes SB3's logged values at the multiples of ``every`` env steps, at the point of a
    rollout where SB3's own ``log_interval`` would. SB3 counts its interval in iterations of the
    current ``learn`` call, so a resumed run would dump on another grid than the run it
    continues; counting in steps keeps one grid across resumes."""

    def __init__(self, every: int, rollout: int) -> None:
        super().__init__()
        self.every, self.rollout = every, rollout
        self.schedule = Schedule(every)

    def _on_training_start(self) -> None:
        if self.num_timesteps:  # a resumed run: its dumps up to here are in metrics.csv
            self.schedule.advance(self.num_timesteps)

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self.schedule.due(self.num_timesteps):
            self.schedule.advance(self.num_timesteps)
            self.model.dump_logs(self.num_timesteps // self.rollout)


class VerifierMetricsCallback(BaseCallback):
    """Logs the verifier's error rates against the ground truth (``detector/...``) over each
    rollout, from the verdict counts of every environment added up."""

    def __init__(self, run: Run) -> None:
        super().__init__()
        self.run = run

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        from success_detectors.wrappers import DetectorCounts

        counts = sum(self.training_env.get_attr("counts"), DetectorCounts())
        self.training_env.env_method("error_rates", reset=True)  # the next rollout counts afresh
        self.run.log(counts.error_rates(), self.num_timesteps)


class TimeLimitCallback(BaseCallback):
    """Stops training when the run's :class:`~harness.algos.hooks.TimeGuard` expires."""

    def __init__(self, guard: TimeGuard) -> None:
        super().__init__()
        self.guard = guard

    def _on_step(self) -> bool:
        return not self.guard.expired(self.num_timesteps)


class EvalCheckpointCallback(BaseCallback):
    """At rollout starts (when every collected step has been trained on): periodic deterministic
    evaluation on held-out seeds (``best`` checkpoint on improvement, a video) and the ``latest``
    checkpoint; both checkpoints carry the curriculum and this callback's state for a resume.

    Args:
        trainer: The ``harness.algos.sb3.run.SB3Run`` whose schedules, evaluation and
            checkpoints it drives.
    """

    def __init__(self, trainer: Any) -> None:
        super().__init__()
        self.trainer = trainer

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        steps = self.num_timesteps
        trainer = self.trainer
        if trainer.evaluation.due(steps):
            trainer.evaluation.advance(steps)
            trainer.periodic_evaluation(steps)
        if trainer.checkpointing.due(steps):
            trainer.checkpointing.advance(steps)
            trainer.save("latest")


