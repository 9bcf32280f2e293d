"""A rollout worker's engine in the ``per_worker`` mode: the environments of one worker and a
copy of the policy (:mod:`harness.algos.rollout.core` has the jobs, the seeding and the lock-step
loop; :mod:`harness.algos.rollout.workers` serves an engine from a process or a Ray actor)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.algos.rollout.core import EnvHost, InProcess, PolicyActor, RolloutBatch, play
from harness.algos.rollout.records import EngineSpec, Job
from harness.policies.saving import policy_from_record


class RolloutEngine:
    """Runs attempts from snapshots in ``spec.num_envs`` environments of one process, in
    lock-step, with its own copy of the policy (a rollout worker of the ``per_worker`` mode).

    Args:
        spec: The environments, the policy copy and what the attempts report
            (:class:`~harness.algos.rollout.records.EngineSpec`).
        device: Where the local policy copy runs.
    """

    def __init__(self, spec: EngineSpec, device: str = "cpu") -> None:
        torch.set_flush_denormal(True)  # see harness.algos.group.run.train
        self.host = EnvHost(spec.host)
        self.policy = policy_from_record(dict(spec.policy), None).to(torch.device(device))
        self.policy.eval()
        self.image_features = bool(spec.image_features)

    def run(self, state_dict: dict[str, torch.Tensor] | None, jobs: list[Job],
            temperature: float, seed: int | Sequence[int],
            indices: Sequence[int] | None = None) -> RolloutBatch:
        """Play every job once; attempts return in job order.

        Args:
            state_dict: Policy weights to load first; ``None`` keeps the loaded ones.
            jobs: The attempts to play.
            temperature: Sampling temperature.
            seed: The call's seed; with ``indices`` it seeds each attempt's generator.
            indices: Index of each job among all the jobs of the call (a pool sends each
                worker a slice); default ``0, 1, ...``.

        Returns:
            The attempts, in job order.
        """
        if state_dict is not None:
            self.policy.load_state_dict(state_dict)
        actor = PolicyActor(self.policy, temperature, seed, keys=indices,
                            image_features=self.image_features)
        return play(actor, [InProcess(self.host)], [range(len(jobs))], jobs,
                    self.host.verifier_view is not None, self.host.capture_every > 0)

    def close(self) -> None:
        self.host.close()
