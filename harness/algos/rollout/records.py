"""Named records of the rollout core: what crosses a rollout worker's process boundary.

A worker (a process or a Ray actor, :mod:`harness.algos.rollout.workers`) is built from a spec
(:class:`EngineSpec`: environments and a policy copy; :class:`HostSpec`: environments only),
receives :class:`Call` messages naming one of its methods, and answers with the method's value
(a :class:`~harness.algos.rollout.core.RolloutBatch` or a :class:`HostAnswer`) or a
:class:`RolloutWorkerError`. The attempts it plays are :class:`Job` records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

import tasks


class RolloutWorkerError(RuntimeError):
    """An exception raised inside a rollout worker, with its traceback, or workers that kept
    dying."""


class WorkerDied(RuntimeError):
    """A rollout worker is gone (a killed process or actor, a lost node) before it answered."""


@dataclass(frozen=True)
class Job:
    """One attempt: restored from ``snapshot``, played to its end, scored.

    The G jobs of a group share one snapshot, so its G attempts start from the very same state.

    Attributes:
        snapshot: The start state (``tasks.Snapshot``).
        group: Index of the attempt's group in the call (groups are contiguous).
        difficulty: Difficulty the start state is recorded under.
        options: More reset options of the attempt, e.g. ``imperfections`` (the scales
            automatic domain randomisation chose for the group), ``noise_key`` or
            ``max_episode_steps``; the snapshot is added to them.

    Raises:
        TypeError: ``options`` is not a mapping.
    """

    snapshot: tasks.Snapshot
    group: int
    difficulty: float
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.options, Mapping):
            raise TypeError(f"Job options={self.options!r}; expected a mapping of reset options")


def check_jobs(jobs: list[Job]) -> None:
    """Refuse anything but :class:`Job` records, before a worker sees them.

    Raises:
        TypeError: Naming the first entry that is not a :class:`Job`.
    """
    for i, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise TypeError(f"jobs[{i}] is a {type(job).__name__} ({job!r:.80}); expected a "
                            "harness.algos.rollout.records.Job(snapshot, group, difficulty, "
                            "options)")


def _check_envs(num_envs: int, capture_every: int) -> None:
    if num_envs < 1:
        raise ValueError(f"num_envs={num_envs}; a rollout worker needs >= 1 env")
    if capture_every < 0:
        raise ValueError(f"capture_every={capture_every}; expected >= 0 (0: off)")


@dataclass(frozen=True)
class HostSpec:
    """What a worker holding only environments (an environment host) is built from.

    Attributes:
        task: Task name.
        task_options: Options of ``tasks.make``.
        num_envs: Environments stepped together.
        verifier_view: ``(camera, size)`` of the frame an image detector reads, or ``None``.
        capture_every: When > 0, every this many steps an attempt's state is captured, and an
            attempt that ends reports the captured state closest to success (replay starts);
            0 captures nothing.

    Raises:
        ValueError: ``num_envs`` < 1 or ``capture_every`` < 0.
    """

    task: str
    task_options: Mapping[str, Any]
    num_envs: int
    verifier_view: tuple[str, int] | None = None
    capture_every: int = 0

    def __post_init__(self) -> None:
        _check_envs(self.num_envs, self.capture_every)


@dataclass(frozen=True)
class EngineSpec:
    """What a worker of the ``per_worker`` mode is built from: its environments and a policy
    copy (:class:`~harness.algos.rollout.engine.RolloutEngine`).

    Attributes:
        task: Task name.
        task_options: Options of ``tasks.make``.
        policy: What rebuilds the policy copy, plugins included
            (:func:`harness.policies.saving.policy_record`); its weights arrive with each call.
        num_envs: Environments stepped together (one batched policy call per step).
        verifier_view: See :class:`HostSpec`.
        capture_every: See :class:`HostSpec`.
        image_features: Return the frozen encoder's features in place of the pixels
            (:class:`~harness.algos.rollout.core.PolicyActor`).

    Raises:
        ValueError: ``num_envs`` < 1 or ``capture_every`` < 0.
    """

    task: str
    task_options: Mapping[str, Any]
    policy: Mapping[str, Any]
    num_envs: int
    verifier_view: tuple[str, int] | None = None
    capture_every: int = 0
    image_features: bool = False

    def __post_init__(self) -> None:
        _check_envs(self.num_envs, self.capture_every)

    @property
    def host(self) -> HostSpec:
        """The environments' part, all a worker of the ``batched`` mode holds."""
        return HostSpec(self.task, self.task_options, self.num_envs, self.verifier_view,
                        self.capture_every)


class Call(NamedTuple):
    """A message to a worker: call its method ``method`` with ``args``."""

    method: str
    args: tuple = ()


class Finished(NamedTuple):
    """How an attempt ended.

    Attributes:
        success: Ground-truth success (``info["is_success"]``).
        frame: The verifier view's last frame, or ``None`` without a verifier view.
        closest: Snapshot bytes of the captured state closest to success, or ``None``.
        margin: Metres outside the success region (negative inside), with a verifier view.
        episode_return: The task reward summed over the attempt's steps.
    """

    success: bool
    frame: np.ndarray | None
    closest: bytes | None
    margin: float | None
    episode_return: float


class HostAnswer(NamedTuple):
    """An environment host's answer to ``begin`` or ``step``.

    Attributes:
        observations: The next observation of every attempt still running or just started,
            by job index.
        finished: The attempts that ended, by job index (empty after ``begin``).
        env_time: Seconds spent resetting, stepping and rendering since ``begin``.
    """

    observations: dict[int, dict[str, np.ndarray]]
    finished: dict[int, Finished]
    env_time: float
