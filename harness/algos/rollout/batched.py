"""Batched rollouts for large policies: environments in workers, one policy in the learner.

A policy of several GB cannot be copied into every rollout worker. In the ``batched`` mode
(``algo.rollout.mode``) the workers hold only environments
(:class:`~harness.algos.rollout.core.EnvHost`) and the learner makes one batched forward pass of
its own policy, on its device, per control step for every attempt of every worker; the actions
go back to the workers, which all step at once. Snapshots still start each group, and attempts
are seeded per attempt exactly as in the ``per_worker`` mode, so both modes, every backend and
every worker count play the same attempts.

A worker that dies is replaced and the call is played again from its snapshots
(:meth:`~harness.algos.rollout.workers.WorkerSet.replay_until_done`: every attempt is a pure
function
of its snapshot, the policy and its seed, so nothing changes but the time).
"""

from __future__ import annotations

from harness.algos.rollout.core import PolicyActor, RolloutBatch, play
from harness.algos.rollout.records import HostSpec, Job, WorkerDied, check_jobs
from harness.algos.rollout.workers import PoolBase, WorkerSet, chunk_indices
from harness.config.algos import RolloutConfig
from harness.policies import Policy


class BatchedPool(PoolBase):
    """``workers`` environment hosts (processes or Ray actors) driven by the learner's policy.

    Args:
        spec: What each host holds.
        workers: Environment hosts; with one and the ``processes`` backend the environments
            live in the calling process.
        settings: ``algo.rollout``: the backend, the Ray address and CPUs per host, the
            restart limit (hosts reserve no GPU: the policy stays in the learner).

    Raises:
        ConfigError: Ray is missing, cannot be joined or cannot hold the hosts.
    """

    def __init__(self, spec: HostSpec, workers: int,
                 settings: RolloutConfig | None = None) -> None:
        self.spec = spec
        self.workers = WorkerSet(spec, workers, settings or RolloutConfig(), gpus=0.0)

    def run(self, policy: Policy, jobs: list[Job], temperature: float,
            seed: int | tuple[int, ...]) -> RolloutBatch:
        """Play every job once with ``policy`` (the learner's own, on its device).

        Returns:
            The attempts, in job order.

        Raises:
            TypeError: An entry of ``jobs`` is not a :class:`~harness.algos.rollout.records.Job`.
            RolloutWorkerError: A host raised, or hosts died too often.
        """
        check_jobs(jobs)
        chunks = chunk_indices(len(jobs), len(self.workers))
        verifier = self.spec.verifier_view is not None
        capture = self.spec.capture_every > 0

        def attempt(_: list[int]) -> tuple[dict[int, RolloutBatch], list[int]]:
            try:
                actor = PolicyActor(policy, temperature, seed)
                return {0: play(actor, self.workers.remotes, chunks, jobs, verifier, capture)}, []
            except WorkerDied:  # the living hosts' next begin resets them
                return {}, self.workers.dead()

        training = policy.training
        policy.eval()
        try:
            return self.workers.replay_until_done([0], attempt)[0]
        finally:
            policy.train(training)
