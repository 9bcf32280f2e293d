"""Where the group trainer's rollout workers run (``algo.rollout``) and how inexactly its
attempts start (``algo.reset_noise``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.config.bounds import MAX_COUNT, MAX_CPUS_PER_WORKER, MAX_GPUS_PER_WORKER, check_count
from harness.config.errors import check

ROLLOUT_BACKENDS: tuple[str, ...] = ("processes", "ray")
ROLLOUT_MODES: tuple[str, ...] = ("auto", "per_worker", "batched")


@dataclass
class RolloutConfig:
    """Where the group trainer's rollout workers run (``algo.rollout``; see docs/scaling.md).

    Attributes:
        backend: ``processes`` (worker processes of this machine) or ``ray`` (Ray actors, on
            this machine or a cluster). The same seed gives the same attempts with either, and
            with any number of workers.
        mode: ``per_worker``: each worker holds its environments and a copy of the policy
            (small policies); ``batched``: workers hold only environments and the learner runs
            one batched forward pass of its policy, on its device, per control step (large
            policies, which do not fit once per worker); ``auto``: ``batched`` for ``hf_vla``,
            ``per_worker`` otherwise.
        ray_address: ``ray`` only: ``null`` starts a local Ray instance with
            ``algo.workers * cpus_per_worker`` CPUs; ``auto`` joins the cluster this machine
            belongs to; ``host:port`` (or ``ray://host:port``) joins that one.
        cpus_per_worker: ``ray`` only: CPUs each actor reserves, in (0, ``MAX_CPUS_PER_WORKER``
            = 1024].
        gpus_per_worker: ``ray`` only: GPUs (or a fraction of one) each actor reserves, in
            [0, ``MAX_GPUS_PER_WORKER`` = 64]; its policy copy then runs on that GPU.
        max_worker_restarts: Dead workers (killed process or actor, lost node) replaced within
            one iteration before the run gives up (at most ``MAX_COUNT``); their attempts are
            played again.
    """

    backend: str = "processes"
    mode: str = "auto"
    ray_address: str | None = None
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    max_worker_restarts: int = 3

    def __post_init__(self) -> None:
        check(self.backend in ROLLOUT_BACKENDS,
              f"algo.rollout.backend={self.backend!r}; choose one of {ROLLOUT_BACKENDS}")
        check(self.mode in ROLLOUT_MODES,
              f"algo.rollout.mode={self.mode!r}; choose one of {ROLLOUT_MODES}")
        check(0 < self.cpus_per_worker <= MAX_CPUS_PER_WORKER,
              f"algo.rollout.cpus_per_worker={self.cpus_per_worker}; must be in "
              f"(0, {MAX_CPUS_PER_WORKER}]")
        check(0 <= self.gpus_per_worker <= MAX_GPUS_PER_WORKER,
              f"algo.rollout.gpus_per_worker={self.gpus_per_worker}; must be in "
              f"[0, {MAX_GPUS_PER_WORKER}]")
        check_count("algo.rollout.max_worker_restarts", self.max_worker_restarts, 0, MAX_COUNT)
        check(self.backend == "ray" or (self.ray_address is None and self.gpus_per_worker == 0),
              "algo.rollout.ray_address and algo.rollout.gpus_per_worker need "
              f"algo.rollout.backend=ray, not {self.backend!r}")


@dataclass
class ResetNoiseConfig:
    """Inexact resets (``algo.reset_noise``; ``tasks.perturb``): each attempt of a group starts
    from the group's snapshot with the gripper and the task's objects displaced, as a real
    robot that cannot reset exactly would leave them. Evaluation is never perturbed.

    Attributes:
        position_mm: Standard deviation of the displacement, millimetres per axis.
        rotation: Standard deviation of the turn about the vertical, radians.
    """

    position_mm: float = 0.0
    rotation: float = 0.0

    def __post_init__(self) -> None:
        check(self.position_mm >= 0,
              f"algo.reset_noise.position_mm={self.position_mm}; must be >= 0")
        check(0 <= self.rotation <= math.pi,
              f"algo.reset_noise.rotation={self.rotation}; must be in [0, pi] radians")
