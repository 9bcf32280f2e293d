"""Rollout pools: the group trainer's attempts spread over rollout workers.

A pool splits the jobs of a call into contiguous chunks, one per worker. Attempts are seeded by
their index in the call, not by the worker that plays them, so the result is the same whatever
the number of workers, the backend (``algo.rollout.backend``: worker processes of this machine,
or Ray actors on a local instance or a cluster) and the mode (``algo.rollout.mode``):

* :class:`PerWorkerPool` (``per_worker``): each worker holds its environments and a copy of the
  policy (:class:`~harness.algos.rollout.engine.RolloutEngine`) and plays its chunk alone; weights
  are
  sent only when they changed since a worker last received them.
* :class:`~harness.algos.rollout.batched.BatchedPool` (``batched``): workers hold only
  environments and the learner's own policy makes one batched forward pass per control step.

Both place their workers, replace the dead ones and play their attempts again through
:class:`~harness.algos.rollout.workers.WorkerSet`, so nothing is lost or counted twice; the pool
counts
the restarts.
"""

from __future__ import annotations

import itertools
from typing import Protocol

import torch

from harness.algos.rollout.batched import BatchedPool
from harness.algos.rollout.core import RolloutBatch
from harness.algos.rollout.records import Call, EngineSpec, Job, WorkerDied, check_jobs
from harness.algos.rollout.workers import PoolBase, WorkerSet, chunk_indices
from harness.config.algos import RolloutConfig
from harness.policies import Policy


class RolloutPool(Protocol):
    """What the group trainer asks of a pool (either mode)."""

    restarts: int

    def run(self, policy: Policy, jobs: list[Job], temperature: float,
            seed: int | tuple[int, ...]) -> RolloutBatch: ...

    def worker_pids(self) -> list[int]: ...

    def close(self) -> None: ...


def weights_version(policy: Policy) -> tuple:
    """Changes whenever a parameter or buffer of ``policy`` is written in place (optimiser
    steps, ``load_state_dict``): torch counts every in-place write of a tensor."""
    tensors = itertools.chain(policy.parameters(), policy.buffers())
    return (id(policy), *(tensor._version for tensor in tensors))


def _cpu_state(policy: Policy) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in policy.state_dict().items()}


class PerWorkerPool(PoolBase):
    """``workers`` rollout engines, each with its environments and a policy copy.

    Args:
        spec: What each engine holds.
        workers: Rollout workers; with one and the ``processes`` backend the engine runs in
            the calling process.
        settings: ``algo.rollout``: the backend, the Ray address and resources (its
            ``gpus_per_worker`` puts each actor's policy copy on a GPU), the restart limit.

    Raises:
        ConfigError: Ray is missing, cannot be joined or cannot hold the actors.
    """

    def __init__(self, spec: EngineSpec, workers: int,
                 settings: RolloutConfig | None = None) -> None:
        settings = settings or RolloutConfig()
        self.spec = spec
        self.workers = WorkerSet(spec, workers, settings, gpus=settings.gpus_per_worker)
        self._held: list[tuple | None] = [None] * workers  # weights version each worker has

    def run(self, policy: Policy, jobs: list[Job], temperature: float,
            seed: int | tuple[int, ...]) -> RolloutBatch:
        """Play every job once with ``policy``.

        Returns:
            The attempts, in job order.

        Raises:
            TypeError: An entry of ``jobs`` is not a :class:`~harness.algos.rollout.records.Job`.
            RolloutWorkerError: A worker raised, or workers died too often.
        """
        check_jobs(jobs)
        version = weights_version(policy)
        chunks = chunk_indices(len(jobs), len(self.workers))
        shared: list = []  # the weights, once put where every worker reads them

        def attempt(pending: list[int]) -> tuple[dict[int, RolloutBatch], list[int]]:
            for i in pending:
                weights = None
                if self._held[i] != version:
                    if not shared:
                        shared.append(self.workers.share(_cpu_state(policy)))
                    weights = shared[0]
                self.workers.remotes[i].send(Call("run", (
                    weights, [jobs[j] for j in chunks[i]], temperature, seed, chunks[i])))
                self._held[i] = version
            done, dead = {}, []
            for i in pending:
                try:
                    done[i] = self.workers.remotes[i].receive()
                except WorkerDied:
                    dead.append(i)
                    self._held[i] = None  # its replacement starts without weights
            return done, dead

        used = [i for i, chunk in enumerate(chunks) if chunk]
        results = self.workers.replay_until_done(used, attempt)
        return RolloutBatch.concat([results[i] for i in sorted(results)])


def rollout_mode(rollout: RolloutConfig, preferred: str = "per_worker") -> str:
    """``per_worker`` or ``batched``: ``algo.rollout.mode``, with ``auto`` resolved to the
    policy's ``preferred`` mode (its spec's ``rollout_mode``)."""
    return preferred if rollout.mode == "auto" else rollout.mode


def make_pool(rollout: RolloutConfig, workers: int, spec: EngineSpec,
              preferred: str = "per_worker") -> RolloutPool:
    """The pool ``algo.rollout`` asks for.

    Args:
        rollout: The rollout settings (``algo.rollout``).
        workers: Rollout workers.
        spec: The workers' environments and policy. The batched mode keeps only the
            environments' part (``spec.host``) and no image features: its policy runs in the
            learner, which encodes the frames again if its encoder is frozen.
        preferred: The mode ``algo.rollout.mode=auto`` resolves to (the policy spec's
            ``rollout_mode``: ``batched`` for models of several GB).

    Returns:
        A :class:`PerWorkerPool` or a :class:`~harness.algos.rollout.batched.BatchedPool`.

    Raises:
        TypeError: ``spec`` is not an :class:`~harness.algos.rollout.records.EngineSpec`.
    """
    if not isinstance(spec, EngineSpec):
        raise TypeError(f"spec={spec!r:.80}; expected a harness.algos.rollout.records.EngineSpec")
    if rollout_mode(rollout, preferred) == "batched":
        return BatchedPool(spec.host, workers, rollout)
    return PerWorkerPool(spec, workers, rollout)
