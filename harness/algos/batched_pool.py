"""Batched rollouts for large policies: environments in workers, one policy in the learner.

A policy of several GB cannot be copied into every rollout worker. In the ``batched`` mode
(``algo.rollout.mode``) the workers hold only environments (:class:`EnvHost`) and the learner
makes one batched forward pass of its own policy, on its device, per control step for every
attempt of every worker; the actions go back to the workers, which all step at once. Snapshots
still start each group, and attempts are seeded per attempt exactly as in the ``per_worker``
mode, so both modes, every backend and every worker count play the same attempts.

A worker that dies is replaced and the call is played again from its snapshots (every attempt
is a pure function of its snapshot, the policy and its seed, so nothing changes but the time).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import traceback

import numpy as np
import torch

from harness.algos.engine import LocalHost
from harness.algos.ray_cluster import _import_ray, check_ray_resources, connect_ray
from harness.algos.rollouts import (
    EnvHost,
    PolicyActor,
    RolloutBatch,
    RolloutWorkerError,
    play,
)
from harness.policies import TokenPolicy

log = logging.getLogger(__name__)


class HostDied(RuntimeError):
    """A worker holding environments is gone."""


def _host_main(connection, host_args: tuple) -> None:
    torch.set_num_threads(1)
    host = EnvHost(*host_args)
    try:
        while True:
            message = connection.recv()
            if message is None:
                break
            kind, payload = message
            try:
                answer = host.begin(*payload) if kind == "begin" else host.step(payload)
                connection.send((answer, host.env_time))
            except Exception as error:
                connection.send((RolloutWorkerError(f"{type(error).__name__}: {error}\n"
                                                    f"{traceback.format_exc()}"), 0.0))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass
    finally:
        host.close()
        connection.close()


class _ProcessHost:
    """An :class:`EnvHost` in a worker process, behind ``send_*``/``receive``."""

    def __init__(self, context, host_args: tuple) -> None:
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_host_main, args=(child, host_args), daemon=True)
        self.process.start()
        child.close()
        self.env_time = 0.0

    def _send(self, message) -> None:
        try:
            self.connection.send(message)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # receive() reports it

    def send_begin(self, jobs, indices) -> None:
        self._send(("begin", (jobs, indices)))

    def send_step(self, actions) -> None:
        self._send(("step", actions))

    def receive(self):
        try:
            answer, self.env_time = self.connection.recv()
        except (EOFError, ConnectionResetError, OSError):
            raise HostDied() from None
        if isinstance(answer, RolloutWorkerError):
            raise RolloutWorkerError(f"a rollout worker failed: {answer}")
        return answer

    def env_time_total(self) -> float:
        return self.env_time

    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        self._send(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
        self.connection.close()


class _RayEnvHost:
    """Ray actor holding an :class:`EnvHost`."""

    def __init__(self, host_args: tuple) -> None:
        torch.set_num_threads(1)
        self.host = EnvHost(*host_args)

    def begin(self, jobs, indices):
        return self.host.begin(jobs, indices), self.host.env_time

    def step(self, actions):
        return self.host.step(actions), self.host.env_time

    def pid(self) -> int:
        return os.getpid()


class _RayHost:
    """A :class:`_RayEnvHost` actor behind ``send_*``/``receive``."""

    def __init__(self, ray, actor_class, host_args: tuple) -> None:
        self.ray = ray
        self.actor = actor_class.remote(host_args)
        self.future = None
        self.env_time = 0.0

    def send_begin(self, jobs, indices) -> None:
        self.future = self.actor.begin.remote(jobs, indices)

    def send_step(self, actions) -> None:
        self.future = self.actor.step.remote(actions)

    def receive(self):
        try:
            answer, self.env_time = self.ray.get(self.future)
        except self.ray.exceptions.RayActorError:
            raise HostDied() from None
        return answer

    def env_time_total(self) -> float:
        return self.env_time

    def pid(self) -> int:
        return self.ray.get(self.actor.pid.remote())

    def close(self) -> None:
        try:
            self.ray.kill(self.actor)
        except Exception:  # already gone
            pass


class BatchedPool:
    """``workers`` environment hosts (processes or Ray actors) driven by the learner's policy.

    Args:
        workers: Environment hosts; with one and the ``processes`` backend the environments
            live in the calling process.
        host_args: ``(task, task_options, num_envs, verifier_view[, capture_every])`` of each
            :class:`EnvHost`.
        backend: ``processes`` or ``ray``.
        address: ``ray`` only: ``None`` (start a local Ray), ``"auto"`` or ``"host:port"``.
        cpus_per_worker: ``ray`` only: CPUs each host reserves.
        max_restarts: Dead hosts replaced within one call before giving up.
    """

    def __init__(self, workers: int, host_args: tuple, backend: str = "processes",
                 address: str | None = None, cpus_per_worker: float = 1.0,
                 max_restarts: int = 3) -> None:
        self.workers = workers
        self.host_args = host_args
        self.backend = backend
        self.max_restarts = max_restarts
        self.restarts = 0
        self._started_ray = False
        if backend == "ray":
            self._ray = _import_ray()
            self._started_ray = connect_ray(address, workers * cpus_per_worker)
            try:
                check_ray_resources(workers, cpus_per_worker, 0.0)
            except Exception:
                self._shutdown()
                raise
            self._actor = self._ray.remote(_RayEnvHost).options(num_cpus=cpus_per_worker,
                                                                max_restarts=0)
        else:
            self._context = mp.get_context("spawn")
        self.hosts = [self._new_host() for _ in range(workers)]

    def _new_host(self):
        if self.backend == "ray":
            return _RayHost(self._ray, self._actor, self.host_args)
        if self.workers == 1:
            return LocalHost(EnvHost(*self.host_args))
        return _ProcessHost(self._context, self.host_args)

    def run(self, policy: TokenPolicy, jobs: list[tuple], temperature: float,
            seed: int | tuple[int, ...]) -> RolloutBatch:
        """Play every job once with ``policy`` (the learner's own, on its device)."""
        chunks = [chunk.tolist() for chunk in np.array_split(np.arange(len(jobs)), self.workers)]
        verifier = self.host_args[3] is not None
        capture = len(self.host_args) > 4 and self.host_args[4] > 0
        training = policy.training
        policy.eval()
        try:
            for attempt in range(self.max_restarts + 1):
                try:
                    return play(PolicyActor(policy, temperature, seed), self.hosts, chunks, jobs,
                                verifier, capture)
                except HostDied:
                    if attempt == self.max_restarts:
                        raise RolloutWorkerError(
                            f"environment workers died {attempt + 1} times in one call, more "
                            f"than algo.rollout.max_worker_restarts={self.max_restarts}"
                        ) from None
                    self._replace_dead()
        finally:
            policy.train(training)
        raise AssertionError("unreachable")

    def _replace_dead(self) -> None:
        """Replace every host that died; restart the others' calls by replacing none of them
        (their next ``begin`` resets them)."""
        for h, host in enumerate(self.hosts):
            alive = True
            if isinstance(host, _ProcessHost):
                alive = host.process.is_alive()
                if alive:  # drain a reply the interrupted call left in the pipe
                    while host.connection.poll(0.5):
                        try:
                            host.connection.recv()
                        except (EOFError, OSError):
                            alive = False
                            break
            elif isinstance(host, _RayHost):
                try:
                    self._ray.get(host.actor.pid.remote(), timeout=30)
                except Exception:
                    alive = False
            if not alive:
                log.warning("environment worker %d died; replacing it and playing the "
                            "iteration's attempts again", h)
                host.close()
                self.hosts[h] = self._new_host()
                self.restarts += 1

    def worker_pids(self) -> list[int]:
        """Process ids of the hosts that run in their own process."""
        return [host.pid() for host in self.hosts if hasattr(host, "pid")]

    def close(self) -> None:
        for host in self.hosts:
            if isinstance(host, LocalHost):
                host.host.close()
            else:
                host.close()
        self.hosts = []
        self._shutdown()

    def _shutdown(self) -> None:
        if self._started_ray and self._ray.is_initialized():
            self._ray.shutdown()
            self._started_ray = False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
