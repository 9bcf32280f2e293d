"""Checks of a sweep's launcher before any job starts (``hydra.callbacks.launcher_check``).

Hydra calls :meth:`LauncherCheck.on_multirun_start` once per ``-m`` sweep, before the sweeper
creates the sweep folder, so a launcher that cannot run the sweep stops it with the setting to
change and nothing written:

* SLURM (``hydra/launcher=slurm``, or the plugin's own ``submitit_slurm``) where there is no
  ``sbatch`` to submit with;
* Ray (``hydra/launcher=ray_cluster``, or the plugin's own ``ray``) with a
  ``ray.init.address`` where no Ray cluster answers, a relative ``hydra.sweep.dir`` with a
  cluster (each node would resolve it against its own working directory), or a per-job
  request in ``ray.remote`` (``num_cpus``, ``num_gpus``, ``memory``, ``resources``) that no node
  of the cluster can hold, which Ray would otherwise leave pending for ever.

For Ray the check starts the local Ray (``address: null``) or joins the cluster itself, and the
Ray launcher then finds Ray running and uses it; keys of ``ray.init`` that only a new local Ray
takes (``num_cpus``, ``object_store_memory``, ...) are left out when joining a cluster.

Hydra turns an exception raised in a callback into a warning and carries on, so a failed check
raises :class:`LauncherError`, a ``SystemExit`` carrying the message: the command exits with
status 1 and prints it.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

SLURM_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
RAY_LAUNCHER = "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
# ray.init keys that configure a new local Ray; ray.init refuses them when joining a cluster.
LOCAL_RAY_KEYS = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory",
                  "include_dashboard", "dashboard_host", "dashboard_port", "_system_config")
# ray.remote key -> (Ray resource name, default of a Ray task)
RAY_REQUESTS = {"num_cpus": ("CPU", 1.0), "num_gpus": ("GPU", 0.0), "memory": ("memory", 0.0)}
CONNECT_TIMEOUT_S = 5.0


class LauncherError(SystemExit):
    """A launcher that cannot run the sweep; the message names the setting to change."""


class LauncherCheck(Callback):
    """Hydra callback: refuses a sweep its launcher cannot run (see the module docstring)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if target == SLURM_LAUNCHER:
            check_slurm()
        elif target == RAY_LAUNCHER:
            ray_settings = OmegaConf.to_container(config.hydra.launcher.ray, resolve=True)
            start_or_join_ray(ray_settings, str(config.hydra.sweep.dir))


def check_slurm() -> None:
    """Refuse a SLURM sweep where ``sbatch`` is not on the ``PATH``.

    Raises:
        LauncherError: No ``sbatch``.
    """
    if shutil.which("sbatch") is None:
        raise LauncherError(
            "hydra/launcher=slurm (hydra.launcher._target_=...submitit_launcher.SlurmLauncher) "
            "submits each job with sbatch, which is not on this machine's PATH: start the sweep "
            "on a SLURM login node, or rehearse it here with hydra/launcher=slurm_rehearsal "
            "(the same jobs through submitit, as local processes)"
        )


def start_or_join_ray(ray_settings: Mapping[str, Any], sweep_dir: str) -> None:
    """Start a local Ray or join the cluster at ``ray.init.address``, then check that one job's
    request fits on a node; shuts down a Ray it started or joined when a check fails.

    Args:
        ray_settings: ``hydra.launcher.ray``: ``init`` (keyword arguments of ``ray.init``) and
            ``remote`` (of ``ray.remote``, one job's request).
        sweep_dir: ``hydra.sweep.dir``.

    Raises:
        LauncherError: Nothing answers at the address, a relative sweep folder with a
            cluster, or a request no node can hold.
    """
    import ray

    init = {k: v for k, v in dict(ray_settings.get("init") or {}).items() if v is not None}
    remote = dict(ray_settings.get("remote") or {})
    address = init.get("address")
    joining = address not in (None, "local")
    if joining:
        if not Path(sweep_dir).is_absolute():
            raise LauncherError(
                f"hydra.sweep.dir={sweep_dir!r} is relative, and hydra.launcher.ray.init."
                f"address={address!r} sends the jobs to a Ray cluster, whose workers would "
                "resolve it against their own working directories: pass an absolute "
                "hydra.sweep.dir on a file system every node shares"
            )
        _check_reachable(address)
        ignored = [key for key in LOCAL_RAY_KEYS if key in init]
        if ignored:
            log.info("joining the Ray cluster at %s: ignoring hydra.launcher.ray.init %s, which "
                     "only configure a new local Ray", address, ignored)
        init = {k: v for k, v in init.items() if k not in LOCAL_RAY_KEYS}
    else:  # "local": a new Ray even where RAY_ADDRESS or a `ray start` cluster would be joined
        init["address"] = "local"
    if ray.is_initialized():
        log.info("Ray is already running in this process; the sweep uses it")
    else:
        try:
            ray.init(**init)
        except Exception as error:  # Ray raises bare Exceptions too (a node that fails to start)
            token = (" (a cluster with token authentication, what `ray start` sets up by "
                     "default, also needs RAY_AUTH_MODE=token and its token here)"
                     if joining and "RAY_AUTH_MODE" not in os.environ else "")
            raise LauncherError(
                f"hydra.launcher.ray.init.address={address!r}: could not "
                f"{'join a Ray cluster there' if joining else 'start a local Ray'} ({error})"
                f"{token}; start one with `ray start --head` and pass its address, or set "
                "address=null for a local Ray"
            ) from None
    try:
        _check_request_fits(remote, joining, address)
    except LauncherError:
        ray.shutdown()
        raise


def _check_reachable(address: str) -> None:
    """Refuse a ``host:port`` (or ``ray://host:port``) nothing listens at, in seconds rather
    than after Ray's own connection retries; ``auto`` is left to ``ray.init``."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise LauncherError(
            f"hydra.launcher.ray.init.address={address!r}: expected null (a local Ray), 'auto' "
            "(the cluster this machine belongs to), 'host:port' or 'ray://host:port'"
        )
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise LauncherError(
            f"hydra.launcher.ray.init.address={address!r}: nothing answers at {host}:{port} "
            f"({error.strerror or error}); check that the Ray head is running there "
            "(`ray status --address ...`), or set address=null for a local Ray"
        ) from None


def _check_request_fits(remote: Mapping[str, Any], joining: bool, address: str | None) -> None:
    """Refuse a per-job request (``hydra.launcher.ray.remote``) that no live node can hold."""
    import ray

    request = {resource: float(remote.get(key, default))
               for key, (resource, default) in RAY_REQUESTS.items()}
    request.update({name: float(v) for name, v in dict(remote.get("resources") or {}).items()})
    request = {resource: amount for resource, amount in request.items() if amount > 0}
    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    if any(all(node.get(r, 0.0) >= a for r, a in request.items()) for node in nodes):
        return
    largest = {r: max((node.get(r, 0.0) for node in nodes), default=0.0) for r in request}
    short = [r for r, a in request.items() if a > largest[r]] or list(request)
    names = {resource: key for key, (resource, _) in RAY_REQUESTS.items()}
    settings = ", ".join(
        f"hydra.launcher.ray.remote.{names.get(r, f'resources.{r}')}={_number(request[r])}"
        for r in short
    )
    offered = ", ".join(f"{r}={_number(largest[r])}" for r in short)
    where = f"the Ray cluster at {address}" if joining else "the local Ray"
    advice = ("lower the request, or join a cluster with larger nodes" if joining else
              "lower the request, or give the local Ray more (hydra.launcher.ray.init."
              "num_cpus / num_gpus)")
    raise LauncherError(
        f"{settings}: no node of {where} can hold one job ({len(nodes)} node(s); the most any "
        f"node offers: {offered}), so the jobs would wait for ever; {advice}"
    )


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
