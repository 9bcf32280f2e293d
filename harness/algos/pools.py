"""Rollout pools: the group trainer's attempts spread over worker processes or Ray actors.

A pool splits the jobs of a call into contiguous chunks, one per worker, and each worker plays
its chunk in a :class:`~harness.algos.rollouts.RolloutEngine`. Attempts are seeded by their
index in the call, not by the worker that plays them, so the result is the same whatever the
number of workers and whichever backend (``algo.rollout.backend``) runs them.

* :class:`ProcessPool` (``processes``): worker processes of this machine, fed through pipes;
  with one worker the engine runs in the calling process.
* :class:`RayPool` (``ray``): Ray actors on a local instance or a cluster, each reserving
  ``cpus_per_worker`` CPUs and ``gpus_per_worker`` GPUs; weights go through Ray's object store.

Both send the policy weights only when they changed since a worker last received them, and
replace a worker that dies (a killed process or actor, a lost node): its chunk is played again
by the replacement, so nothing is lost or counted twice, and the pool counts the restarts.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import traceback
from typing import Any

import numpy as np
import torch

from harness.algos.batched_pool import BatchedPool
from harness.algos.engine import RolloutEngine
from harness.algos.ray_cluster import _import_ray, check_ray_resources, connect_ray
from harness.algos.rollouts import RolloutBatch, RolloutWorkerError
from harness.policies import TokenPolicy

log = logging.getLogger(__name__)


def weights_version(policy: TokenPolicy) -> tuple:
    """Changes whenever a parameter or buffer of ``policy`` is written in place (optimiser
    steps, ``load_state_dict``): torch counts every in-place write of a tensor."""
    tensors = itertools.chain(policy.parameters(), policy.buffers())
    return (id(policy), *(tensor._version for tensor in tensors))


def _cpu_state(policy: TokenPolicy) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in policy.state_dict().items()}


def _chunks(jobs: list[tuple], workers: int) -> list[np.ndarray]:
    return [chunk for chunk in np.array_split(np.arange(len(jobs)), workers)]


class _Pool:
    """What both backends share: chunking, weights bookkeeping, replacing dead workers."""

    def __init__(self, workers: int, max_restarts: int) -> None:
        self.workers = workers
        self.max_restarts = max_restarts
        self.restarts = 0  # dead workers replaced since the pool started
        self._held: list[tuple | None] = [None] * workers  # weights version each worker has

    # subclasses: submit a chunk to worker i, collect it (None: the worker died), replace it
    def _submit(self, i: int, state, jobs, temperature, seed, indices) -> None:
        raise NotImplementedError

    def _collect(self, i: int) -> RolloutBatch | None:
        raise NotImplementedError

    def _replace(self, i: int) -> None:
        raise NotImplementedError

    def _weights(self, state: dict[str, torch.Tensor]) -> Any:
        return state

    def run(self, policy: TokenPolicy, jobs: list[tuple], temperature: float,
            seed: int | tuple[int, ...]) -> RolloutBatch:
        """Play every job once with ``policy``; attempts return in job order."""
        version = weights_version(policy)
        payload = None
        chunks = _chunks(jobs, self.workers)
        pending = [i for i, chunk in enumerate(chunks) if len(chunk)]
        results: dict[int, RolloutBatch] = {}
        restarts = 0
        while pending:
            for i in pending:
                send = None
                if self._held[i] != version:
                    if payload is None:
                        payload = self._weights(_cpu_state(policy))
                    send = payload
                chunk = chunks[i]
                self._submit(i, send, [jobs[j] for j in chunk], temperature, seed, chunk.tolist())
                self._held[i] = version
            dead = []
            for i in pending:
                result = self._collect(i)
                if result is None:
                    dead.append(i)
                elif isinstance(result, RolloutWorkerError):
                    raise RolloutWorkerError(f"rollout worker {i} failed: {result}")
                else:
                    results[i] = result
            for i in dead:
                restarts += 1
                if restarts > self.max_restarts:
                    raise RolloutWorkerError(
                        f"rollout workers died {restarts} times in one call, more than "
                        f"algo.rollout.max_worker_restarts={self.max_restarts}")
                log.warning("rollout worker %d died; replacing it and playing its %d attempts "
                            "again", i, len(chunks[i]))
                self._replace(i)
                self._held[i] = None
                self.restarts += 1
            pending = dead
        return RolloutBatch.concat([results[i] for i in sorted(results)])

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------- processes
def _worker_main(connection, engine_args: tuple) -> None:
    # llvmpipe rasterises in this thread (LP_NUM_THREADS=0, set when tasks is imported)
    torch.set_num_threads(1)  # one core per worker; the trainer process keeps its own setting
    engine = RolloutEngine(*engine_args)
    try:
        while True:
            message = connection.recv()
            if message is None:
                break
            try:
                result = engine.run(*message)
            except Exception as error:  # report it to the trainer, which raises it there
                result = RolloutWorkerError(f"{type(error).__name__}: {error}\n"
                                            f"{traceback.format_exc()}")
            connection.send(result)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the trainer is gone (killed or crashed): stop quietly instead of lingering
    finally:
        engine.close()
        connection.close()


class ProcessPool(_Pool):
    """``workers`` rollout processes (or the calling process when ``workers == 1``).

    Args:
        workers: Worker processes.
        engine_args: Arguments of :class:`RolloutEngine` (its policy runs on the CPU).
        max_restarts: Dead workers replaced within one call before giving up.
    """

    def __init__(self, workers: int, engine_args: tuple, max_restarts: int = 3) -> None:
        super().__init__(workers, max_restarts)
        self.engine_args = engine_args
        self._local = RolloutEngine(*engine_args) if workers == 1 else None
        self._context = mp.get_context("spawn")
        self._workers = [self._start() for _ in range(workers)] if workers > 1 else []
        self._outbox: dict[int, tuple] = {}

    def _start(self):
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_worker_main, args=(child, self.engine_args),
                                        daemon=True)
        process.start()
        child.close()  # the worker holds the only child end: its death closes the pipe
        return parent, process

    def _submit(self, i, state, jobs, temperature, seed, indices) -> None:
        self._outbox[i] = (state, jobs, temperature, seed, indices)
        if self._local is not None:
            return
        try:
            self._workers[i][0].send(self._outbox[i])
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # dead: _collect sees it

    def _collect(self, i: int):
        if self._local is not None:
            return self._local.run(*self._outbox.pop(i))
        try:
            return self._workers[i][0].recv()
        except (EOFError, ConnectionResetError, OSError):
            return None

    def _replace(self, i: int) -> None:
        connection, process = self._workers[i]
        connection.close()
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
        self._workers[i] = self._start()

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
        for connection, _ in self._workers:
            try:
                connection.send(None)
            except (BrokenPipeError, OSError):
                pass
        for _, process in self._workers:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
        self._workers = []

    def worker_pids(self) -> list[int]:
        """Process ids of the workers (empty with one worker, which runs in this process)."""
        return [process.pid for _, process in self._workers]


# ---------------------------------------------------------------------------------- ray
class _RayWorker:
    """A Ray actor holding one rollout engine (its envs, renderer and policy copy)."""

    def __init__(self, engine_args: tuple, use_gpu: bool) -> None:
        torch.set_num_threads(1)
        device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        self.engine = RolloutEngine(*engine_args, device=device)

    def run(self, state, jobs, temperature, seed, indices):
        try:
            return self.engine.run(state, jobs, temperature, seed, indices)
        except Exception as error:
            return RolloutWorkerError(f"{type(error).__name__}: {error}\n"
                                      f"{traceback.format_exc()}")

    def pid(self) -> int:
        return os.getpid()


class RayPool(_Pool):
    """``workers`` Ray actors, each with its own rollout engine.

    Args:
        workers: Actors.
        engine_args: Arguments of :class:`RolloutEngine`.
        address: ``None`` (start a local Ray), ``"auto"`` or ``"host:port"``.
        cpus_per_worker: CPUs each actor reserves.
        gpus_per_worker: GPUs each actor reserves; its policy copy then runs on the GPU.
        max_restarts: Dead actors replaced within one call before giving up.
    """

    def __init__(self, workers: int, engine_args: tuple, address: str | None = None,
                 cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0,
                 max_restarts: int = 3) -> None:
        super().__init__(workers, max_restarts)
        self._ray = _import_ray()
        self._started = connect_ray(address, workers * cpus_per_worker)
        try:
            check_ray_resources(workers, cpus_per_worker, gpus_per_worker)
        except Exception:
            self._shutdown()
            raise
        self._actor = self._ray.remote(_RayWorker).options(
            num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, max_restarts=0)
        self._engine_args = engine_args
        self._use_gpu = gpus_per_worker > 0
        self._actors = [self._new_actor() for _ in range(workers)]
        self._futures: dict[int, Any] = {}

    def _new_actor(self):
        return self._actor.remote(self._engine_args, self._use_gpu)

    def _weights(self, state):
        return self._ray.put(state)  # one copy in the object store, shared by every actor

    def _submit(self, i, state, jobs, temperature, seed, indices) -> None:
        self._futures[i] = self._actors[i].run.remote(state, jobs, temperature, seed, indices)

    def _collect(self, i: int):
        try:
            return self._ray.get(self._futures.pop(i))
        except self._ray.exceptions.RayActorError:
            return None

    def _replace(self, i: int) -> None:
        try:
            self._ray.kill(self._actors[i])
        except Exception:  # already gone
            pass
        self._actors[i] = self._new_actor()

    def worker_pids(self) -> list[int]:
        """Process ids of the actors (they run on this machine with a local Ray)."""
        return self._ray.get([actor.pid.remote() for actor in self._actors])

    def close(self) -> None:
        for actor in getattr(self, "_actors", []):
            try:
                self._ray.kill(actor)
            except Exception:
                pass
        self._actors = []
        self._shutdown()

    def _shutdown(self) -> None:
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
            self._started = False


LARGE_POLICIES: tuple[str, ...] = ("hf_vla",)  # played in the batched mode under mode=auto


def rollout_mode(rollout, policy_kind: str) -> str:
    """``per_worker`` or ``batched``: ``algo.rollout.mode``, with ``auto`` resolved by the
    policy's kind."""
    if rollout.mode != "auto":
        return rollout.mode
    return "batched" if policy_kind in LARGE_POLICIES else "per_worker"


def make_pool(rollout, workers: int, engine_args: tuple):
    """The pool ``algo.rollout`` asks for (a :class:`~harness.config.algos.RolloutConfig`).

    Args:
        rollout: The rollout settings.
        workers: Rollout workers.
        engine_args: ``(task, task_options, (policy config, obs shapes), num_envs,
            verifier_view[, capture_every[, image_features]])`` (:class:`RolloutEngine`'s
            first arguments). The batched mode keeps no image features: its policy runs in
            the learner, which encodes the frames again if its encoder is frozen.
    """
    if rollout_mode(rollout, engine_args[2][0].kind) == "batched":
        task, options, _, num_envs, *rest = engine_args
        return BatchedPool(workers, (task, options, num_envs, *rest[:2]), rollout.backend,
                           rollout.ray_address, rollout.cpus_per_worker,
                           rollout.max_worker_restarts)
    if rollout.backend == "ray":
        return RayPool(workers, engine_args, rollout.ray_address, rollout.cpus_per_worker,
                       rollout.gpus_per_worker, rollout.max_worker_restarts)
    return ProcessPool(workers, engine_args, rollout.max_worker_restarts)
