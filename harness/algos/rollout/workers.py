"""The rollout core's workers: one worker loop, one remote surface, one restart-and-replay.

A worker serves one object built from a spec (:func:`open_worker`): a
:class:`~harness.algos.rollout.engine.RolloutEngine` for an
:class:`~harness.algos.rollout.records.EngineSpec`
(``per_worker`` mode: environments and a policy copy), an
:class:`~harness.algos.rollout.core.EnvHost` for a :class:`~harness.algos.rollout.records.HostSpec`
(``batched`` mode: environments only). It answers :class:`~harness.algos.rollout.records.Call`
messages by calling the named method. Three placements meet one surface, ``send(call)`` then
``receive()``, ``settle()``, ``pid()``, ``close()``:

* :class:`~harness.algos.rollout.core.InProcess`: the object in the calling process (one worker
  with the ``processes`` backend);
* :class:`ProcessWorker`: a spawned process running :func:`serve` over a pipe;
* :class:`RayWorker`: a Ray actor (:class:`_RayServer`) through Ray's object store.

:class:`WorkerSet` starts ``workers`` of them where ``algo.rollout`` places them, and replays
what dead workers left undone (:meth:`WorkerSet.replay_until_done`): each dead worker is
replaced, counted, and the run gives up after ``algo.rollout.max_worker_restarts`` in one call.
Every attempt is a pure function of its snapshot, the policy and its seed, so a replay changes
nothing but the time.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import numpy as np
import torch

from harness.algos.rollout.core import EnvHost, InProcess
from harness.algos.rollout.engine import RolloutEngine
from harness.algos.rollout.ray_cluster import RayConnection
from harness.algos.rollout.records import Call, EngineSpec, HostSpec, RolloutWorkerError, WorkerDied
from harness.config.algos import RolloutConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


def chunk_indices(count: int, workers: int) -> list[list[int]]:
    """Contiguous, near-equal chunks of ``range(count)``, one per worker (some maybe empty)."""
    return [chunk.tolist() for chunk in np.array_split(np.arange(count), workers)]


def open_worker(spec: EngineSpec | HostSpec, device: str = "cpu") -> RolloutEngine | EnvHost:
    """The object a worker serves: an engine for an :class:`EngineSpec`, an environment host
    for a :class:`HostSpec`.

    Args:
        spec: What to build.
        device: Where an engine's policy copy runs (a host has no policy).

    Raises:
        TypeError: ``spec`` is neither.
    """
    if isinstance(spec, EngineSpec):
        return RolloutEngine(spec, device=device)
    if isinstance(spec, HostSpec):
        return EnvHost(spec)
    raise TypeError(f"spec={spec!r:.80}; expected an EngineSpec or a HostSpec "
                    "(harness.algos.rollout.records)")


def answer(worker: Any, call: Call) -> Any:
    """``worker``'s answer to ``call``: the method's value, or the exception it raised as a
    :class:`RolloutWorkerError` with its traceback (the caller raises it on its side)."""
    try:
        return getattr(worker, call.method)(*call.args)
    except Exception as error:
        return RolloutWorkerError(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")


def serve(connection: Connection, spec: EngineSpec | HostSpec) -> None:
    """The worker loop of a worker process: answer each :class:`Call` until ``None`` arrives
    or the other end is gone."""
    # llvmpipe rasterises in this thread (LP_NUM_THREADS=0, set when tasks is imported)
    torch.set_num_threads(1)  # one core per worker; the trainer process keeps its own setting
    worker = open_worker(spec)
    try:
        while (call := connection.recv()) is not None:
            connection.send(answer(worker, call))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the trainer is gone (killed or crashed): stop quietly instead of lingering
    finally:
        worker.close()
        connection.close()


def _raise_failure(name: str, reply: Any) -> Any:
    if isinstance(reply, RolloutWorkerError):
        raise RolloutWorkerError(f"{name} failed: {reply}")
    return reply


class ProcessWorker:
    """A spawned process serving the object of ``spec`` (:func:`serve`) through a pipe.

    Args:
        spec: What the process builds.
        name: How errors name it (``rollout worker 1``).
    """

    def __init__(self, spec: EngineSpec | HostSpec, name: str) -> None:
        if mp.get_start_method(allow_none=True) not in (None, *mp.get_all_start_methods()):
            # In a job of Hydra's joblib launcher the global method is loky's, which a spawned
            # child cannot resolve when it reads its parent's: name one it can.
            mp.set_start_method("spawn", force=True)
        context = mp.get_context("spawn")
        self.name = name
        self.connection, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, spec), daemon=True)
        self.process.start()
        child.close()  # the worker holds the only child end: its death closes the pipe
        self._waiting = False  # a call was sent and its answer not read
        self._dead = False

    def send(self, call: Call) -> None:
        self._waiting = True
        try:
            self.connection.send(call)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # dead: receive() reports it

    def receive(self) -> Any:
        """The answer to the last call.

        Raises:
            WorkerDied: The process is gone.
            RolloutWorkerError: The call raised an exception in the worker.
        """
        self._waiting = False
        try:
            reply = self.connection.recv()
        except (EOFError, ConnectionResetError, OSError):
            self._dead = True
            raise WorkerDied(self.name) from None
        return _raise_failure(self.name, reply)

    def settle(self) -> bool:
        """Read and drop the answer an interrupted call left in the pipe; whether the process
        is alive."""
        if self._waiting and not self._dead:
            try:
                self.receive()
            except (WorkerDied, RolloutWorkerError):
                pass  # a death is recorded; an error is an answer
        return not self._dead and self.process.is_alive()

    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        try:
            self.connection.send(None)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
        self.connection.close()


class _RayServer:
    """The Ray actor of a :class:`RayWorker`: the object of ``spec``, answering calls."""

    def __init__(self, spec: EngineSpec | HostSpec, use_gpu: bool) -> None:
        torch.set_num_threads(1)
        device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        self.worker = open_worker(spec, device)

    def call(self, method: str, *args: Any) -> Any:
        return answer(self.worker, Call(method, args))

    def pid(self) -> int:
        return os.getpid()


class RayWorker:
    """A Ray actor serving the object of ``spec``.

    Args:
        ray: The ``ray`` module.
        actor_class: ``ray.remote(_RayServer)`` with the actors' resource options.
        spec: What the actor builds.
        use_gpu: Whether an engine's policy copy runs on the actor's GPU.
        name: How errors name it.
    """

    def __init__(self, ray, actor_class, spec: EngineSpec | HostSpec, use_gpu: bool,
                 name: str) -> None:
        self.ray = ray
        self.name = name
        self.actor = actor_class.remote(spec, use_gpu)
        self._future = None

    def send(self, call: Call) -> None:
        # top-level arguments: Ray resolves object-store references (the weights) only there
        self._future = self.actor.call.remote(call.method, *call.args)

    def receive(self) -> Any:
        """The answer to the last call.

        Raises:
            WorkerDied: The actor is gone.
            RolloutWorkerError: The call raised an exception in the actor.
        """
        future, self._future = self._future, None
        try:
            reply = self.ray.get(future)
        except self.ray.exceptions.RayActorError:
            raise WorkerDied(self.name) from None
        return _raise_failure(self.name, reply)

    def settle(self) -> bool:
        """Wait for and drop an unread answer; whether the actor answers."""
        if self._future is not None:
            try:
                self.receive()
            except (WorkerDied, RolloutWorkerError):
                pass
        try:
            self.ray.get(self.actor.pid.remote(), timeout=30)
        except Exception:  # RayActorError, or a lost node's timeout
            return False
        return True

    def pid(self) -> int:
        return self.ray.get(self.actor.pid.remote())

    def close(self) -> None:
        try:
            self.ray.kill(self.actor)
        except Exception:  # already gone
            pass


class WorkerSet:
    """``workers`` workers serving ``spec``, placed as ``settings`` (``algo.rollout``) says.

    With the ``processes`` backend one worker runs in the calling process and more run in
    spawned processes; with ``ray`` each is an actor reserving ``settings.cpus_per_worker``
    CPUs and ``gpus`` GPUs.

    Args:
        spec: What each worker builds.
        workers: How many.
        settings: The backend, the Ray address and resources, ``max_worker_restarts``.
        gpus: GPUs each Ray actor reserves (an engine's policy copy then runs there).

    Raises:
        ConfigError: Ray is missing, cannot be joined or cannot hold the actors.
    """

    def __init__(self, spec: EngineSpec | HostSpec, workers: int, settings: RolloutConfig,
                 gpus: float = 0.0) -> None:
        self.spec = spec
        self.max_restarts = settings.max_worker_restarts
        self.restarts = 0  # dead workers replaced since the set started
        self.ray: RayConnection | None = None
        if settings.backend == "ray":
            self.ray = RayConnection(settings.ray_address, workers, settings.cpus_per_worker,
                                     gpus)
            self._actor = self.ray.ray.remote(_RayServer).options(
                num_cpus=settings.cpus_per_worker, num_gpus=gpus, max_restarts=0)
            self._use_gpu = gpus > 0
        self.remotes = [self._start(i, workers) for i in range(workers)]

    def _start(self, i: int, workers: int):
        name = f"rollout worker {i}"
        if self.ray is not None:
            return RayWorker(self.ray.ray, self._actor, self.spec, self._use_gpu, name)
        if workers == 1:
            return InProcess(open_worker(self.spec))
        return ProcessWorker(self.spec, name)

    def share(self, payload: Any) -> Any:
        """``payload`` as it best travels to every worker: with Ray, one copy in the object
        store that all actors read."""
        return payload if self.ray is None else self.ray.ray.put(payload)

    def dead(self) -> list[int]:
        """Indices of the workers that died, once the answers of an interrupted call are read
        and dropped from the living."""
        return [i for i, remote in enumerate(self.remotes) if not remote.settle()]

    def replay_until_done(self, parts: list[int],
                          attempt: Callable[[list[int]], tuple[dict[int, T], list[int]]]
                          ) -> dict[int, T]:
        """Run ``attempt`` on the ``parts`` of a call not done yet until all are, replacing
        the workers that died meanwhile.

        Args:
            parts: What the call is made of (a pool's worker indices, or one part for a call
                played by all workers together).
            attempt: Plays the given parts; returns the results of those it finished, by
                part, and the indices of the workers that died (the rest is played again).

        Returns:
            Every part's result.

        Raises:
            RolloutWorkerError: Workers died more than ``max_worker_restarts`` times in the
                call.
        """
        results: dict[int, T] = {}
        deaths = 0
        while parts:
            done, dead = attempt(parts)
            if not done and not dead:  # would loop forever: a death no worker owns up to
                raise RolloutWorkerError("a rollout call failed but every worker answers")
            results.update(done)
            for i in dead:
                deaths += 1
                if deaths > self.max_restarts:
                    raise RolloutWorkerError(
                        f"rollout workers died {deaths} times in one call, more than "
                        f"algo.rollout.max_worker_restarts={self.max_restarts}")
                log.warning("rollout worker %d died; replacing it and playing its attempts "
                            "again", i)
                self.remotes[i].close()
                self.remotes[i] = self._start(i, len(self.remotes))
                self.restarts += 1
            parts = [part for part in parts if part not in done]
        return results

    def __len__(self) -> int:
        return len(self.remotes)

    def pids(self) -> list[int]:
        """Process ids of the workers that run in their own process."""
        return [pid for remote in self.remotes if (pid := remote.pid()) is not None]

    def close(self) -> None:
        for remote in self.remotes:
            remote.close()
        self.remotes = []
        if self.ray is not None:
            self.ray.close()


class PoolBase:
    """What both pools share over their :class:`WorkerSet` (``self.workers``): the restart
    count, the workers' process ids, closing, and use as a context manager."""

    workers: WorkerSet

    @property
    def restarts(self) -> int:
        """Dead workers replaced since the pool started."""
        return self.workers.restarts

    def worker_pids(self) -> list[int]:
        """Process ids of the workers that run in their own process (none in this one)."""
        return self.workers.pids()

    def close(self) -> None:
        self.workers.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
