"""Joining or starting Ray for the rollout workers, with clear errors for bad settings.

:class:`RayConnection` is what a pool holds while its workers are Ray actors: Ray joined or
started, the cluster checked for the actors' resources, and shut down again on ``close`` only
if the connection started it. :func:`preflight` runs the same checks before a run starts.
"""

from __future__ import annotations

import os
import socket

import numpy as np

from harness.config.errors import ConfigError

# Keyword arguments of every ray.init here: the run's own logging, no dashboard.
_INIT_OPTIONS = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}


def import_ray():
    """The ``ray`` module.

    Raises:
        ConfigError: Ray is not installed.
    """
    try:
        import ray
    except ImportError as error:
        raise ConfigError("algo.rollout.backend=ray needs Ray: pip install -e '.[cluster]' "
                          f"({error})") from None
    return ray


def _check_reachable(address: str) -> None:
    """Refuse a ``host:port`` nothing listens on, in seconds rather than Ray's long retries."""
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"algo.rollout.ray_address={address!r}; expected null, 'auto', "
                          "'host:port' or 'ray://host:port'")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        raise ConfigError(f"algo.rollout.ray_address={address!r}: no Ray cluster answers there "
                          f"({error}); start one with `ray start --head`, or set "
                          "algo.rollout.ray_address=null for a local instance") from None


def connect_ray(address: str | None, num_cpus: float) -> bool:
    """Connect to (or start) Ray; ``True`` when this call started it (and the caller shuts it
    down).

    Raises:
        ConfigError: Ray is not installed, or no Ray cluster can be joined at ``address``.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address is None:
        ray.init(num_cpus=max(1, int(np.ceil(num_cpus))), **_INIT_OPTIONS)
        return True
    _join(ray, address)
    return False


def _join(ray, address: str) -> None:
    """Join the Ray cluster at ``address`` (``auto`` or ``[ray://]host:port``) as a driver."""
    if address != "auto":
        _check_reachable(address)
    try:
        ray.init(address=address, **_INIT_OPTIONS)
    except (ConnectionError, RuntimeError, ValueError) as error:
        token = (" (a cluster with token authentication, what `ray start` sets up by default, "
                 "also needs RAY_AUTH_MODE=token and its token here)"
                 if "RAY_AUTH_MODE" not in os.environ else "")
        raise ConfigError(f"algo.rollout.ray_address={address!r}: cannot join a Ray cluster "
                          f"({error}){token}") from None


class RayConnection:
    """Ray joined (or started) for ``workers`` actors of ``cpus`` CPUs and ``gpus`` GPUs each.

    Args:
        address: ``None`` (start a local Ray of ``workers * cpus`` CPUs), ``"auto"`` or
            ``"[ray://]host:port"``; an instance already initialised in this process is used
            as it is.
        workers: Actors the pool will start.
        cpus: CPUs each actor reserves.
        gpus: GPUs each actor reserves.

    Raises:
        ConfigError: Ray is not installed, the cluster cannot be joined, or it cannot hold the
            actors (a local instance this started is shut down again first).
    """

    def __init__(self, address: str | None, workers: int, cpus: float, gpus: float) -> None:
        self.ray = import_ray()
        self._started = connect_ray(address, workers * cpus)
        try:
            check_ray_resources(workers, cpus, gpus)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        """Shut Ray down if this connection started it (a joined cluster is left running)."""
        if self._started and self.ray.is_initialized():
            self.ray.shutdown()
        self._started = False


def check_ray_resources(workers: int, cpus: float, gpus: float) -> None:
    """Refuse actor requests the connected cluster can never place.

    Raises:
        ConfigError: No alive node has ``cpus`` CPUs and ``gpus`` GPUs, or the cluster has
            fewer than ``workers`` times that in all (the last actors would wait forever).
    """
    ray = import_ray()
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    fits = [n for n in nodes if n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus]
    request = (f"algo.rollout.cpus_per_worker={cpus}, algo.rollout.gpus_per_worker={gpus}")
    largest = max(((n.get("CPU", 0), n.get("GPU", 0)) for n in nodes), default=(0, 0))
    if not fits:
        raise ConfigError(f"{request}: no node of the Ray cluster has that much (the largest "
                          f"has {largest[0]:g} CPUs and {largest[1]:g} GPUs)")
    total_cpus = sum(n.get("CPU", 0) for n in nodes)
    total_gpus = sum(n.get("GPU", 0) for n in nodes)
    if workers * cpus > total_cpus or workers * gpus > total_gpus:
        raise ConfigError(f"algo.workers={workers} with {request} asks for "
                          f"{workers * cpus:g} CPUs and {workers * gpus:g} GPUs; the Ray cluster "
                          f"has {total_cpus:g} and {total_gpus:g}")


def preflight(rollout, workers: int) -> None:
    """What can be checked of ``algo.rollout`` before a run starts: Ray installed and, with an
    address, its cluster joined and holding ``workers`` times ``cpus_per_worker`` CPUs, so that
    a cluster that does not answer, refuses this driver or is too small stops the run before
    its directory is written. A local Ray (``ray_address: null``) is left for the pool to start;
    GPUs, which only the ``per_worker`` mode asks of the actors, are checked by the pool.

    Raises:
        ConfigError: Naming the setting.
    """
    if rollout.backend != "ray":
        return
    ray = import_ray()
    if rollout.ray_address is not None and not ray.is_initialized():
        _join(ray, rollout.ray_address)
        try:
            check_ray_resources(workers, rollout.cpus_per_worker, 0.0)
        except ConfigError:
            ray.shutdown()  # leaves the cluster; it stops nothing of it
            raise
