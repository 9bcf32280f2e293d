"""Checks of a sweep's launcher before any job starts (``hydra.callbacks.launcher_check``).

Hydra calls :meth:`LauncherCheck.on_multirun_start` once per ``-m`` sweep, before the sweeper
creates the sweep folder, so a launcher that cannot run the sweep stops it with the setting to
change and nothing written:

* SLURM (``hydra/launcher=slurm``, or the plugin's own ``submitit_slurm``) where there is no
  ``sbatch`` to submit with, with a ``partition`` that ``sinfo`` does not list (``sbatch``
  would refuse it only once the sweep folder is written, in a traceback), or with a per-job
  request of CPUs or nodes that no partition it may run in can hold (which SLURM's default
  ``EnforcePartLimits=NO`` accepts and leaves pending for ever);
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
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
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
SINFO_TIMEOUT_S = 30.0


class LauncherError(SystemExit):
    """A launcher that cannot run the sweep; the message names the setting to change."""


class LauncherCheck(Callback):
    """Hydra callback: refuses a sweep its launcher cannot run (see the module docstring)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if target == SLURM_LAUNCHER:
            launcher = OmegaConf.to_container(config.hydra.launcher, resolve=True)
            check_slurm(launcher.get("partition"), launcher.get("cpus_per_task"),
                        launcher.get("tasks_per_node"), launcher.get("nodes"))
        elif target == RAY_LAUNCHER:
            ray_settings = OmegaConf.to_container(config.hydra.launcher.ray, resolve=True)
            start_or_join_ray(ray_settings, str(config.hydra.sweep.dir))


@dataclass(frozen=True)
class SlurmPartition:
    """A partition as ``sinfo`` lists it: its name, whether it is the cluster's default, and
    the CPUs of each of its nodes."""

    name: str
    default: bool
    node_cpus: tuple[int, ...]


def check_slurm(partition: str | None = None, cpus_per_task: int | None = None,
                tasks_per_node: int | None = None, nodes: int | None = None) -> None:
    """Refuse a SLURM sweep that ``sbatch`` cannot submit, or that SLURM would accept and
    never start.

    Args:
        partition: ``hydra.launcher.partition``: one name, or several separated by commas (as
            ``sbatch --partition`` takes them); ``None``: the cluster's default partition.
        cpus_per_task, tasks_per_node, nodes: One job's request (``None``: SLURM's default, 1).

    Raises:
        LauncherError: No ``sbatch`` on the ``PATH``; a partition ``sinfo --all`` does not list
            (``sbatch`` would refuse it only after the sweep folder is written); or a request
            no partition can hold: ``cpus_per_task × tasks_per_node`` CPUs on ``nodes`` nodes
            (a cluster that keeps SLURM's default ``EnforcePartLimits=NO`` accepts such an
            array and leaves it pending, ``Reason=PartitionConfig``, for ever). Where ``sinfo``
            is missing or fails, these are left to ``sbatch``.
    """
    if shutil.which("sbatch") is None:
        raise LauncherError(
            "hydra/launcher=slurm (hydra.launcher._target_=...submitit_launcher.SlurmLauncher) "
            "submits each job with sbatch, which is not on this machine's PATH: start the sweep "
            "on a SLURM login node, or rehearse it here with hydra/launcher=slurm_rehearsal "
            "(the same jobs through submitit, as local processes)"
        )
    partitions = slurm_partitions()
    if partitions is None:
        return
    if partition is None:
        chosen = [p for p in partitions.values() if p.default]
    else:
        names = [name.strip() for name in str(partition).split(",")]
        unknown = [name for name in names if name not in partitions]
        if unknown:
            raise LauncherError(
                f"hydra.launcher.partition={partition!r}: this SLURM cluster has no partition "
                f"{', '.join(repr(name) for name in unknown)} (sinfo lists: "
                f"{', '.join(partitions) or 'none'}); pick one of those, or leave "
                "partition=null for the cluster's default"
            )
        chosen = [partitions[name] for name in names]
    cpus = int(cpus_per_task or 1) * int(tasks_per_node or 1)
    count = int(nodes or 1)
    if (not chosen or any(not p.node_cpus for p in chosen)  # nothing to judge: sbatch's call
            or any(sum(c >= cpus for c in p.node_cpus) >= count for p in chosen)):
        return
    settings = [f"hydra.launcher.cpus_per_task={cpus_per_task}"]
    if int(tasks_per_node or 1) > 1:
        settings.append(f"hydra.launcher.tasks_per_node={tasks_per_node}")
    if count > 1:
        settings.append(f"hydra.launcher.nodes={count}")
    offered = "; ".join(
        f"partition {p.name!r}: {len(p.node_cpus)} node(s), the largest with "
        f"{max(p.node_cpus, default=0)} CPUs"
        + (f", {sum(c >= cpus for c in p.node_cpus)} with {cpus} or more" if count > 1 else "")
        for p in chosen)
    raise LauncherError(
        f"{', '.join(settings)}: one job asks for {cpus} CPU(s) on each of {count} node(s), "
        f"which no partition it may run in can hold ({offered}); SLURM would accept the array and "
        "leave it pending (Reason=PartitionConfig) for ever. Lower the request, or pick a "
        "partition with larger nodes (hydra.launcher.partition)"
    )


def slurm_partitions() -> dict[str, SlurmPartition] | None:
    """The partitions of the SLURM cluster, hidden ones included (``sinfo --all``), by name, in
    ``sinfo``'s order; ``None`` where ``sinfo`` is missing or fails."""
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return None
    try:
        listing = subprocess.run([sinfo, "--all", "--noheader", "--Node", "--format=%P|%N|%c"],
                                 capture_output=True, text=True, timeout=SINFO_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("could not list the SLURM partitions (%s); left to sbatch", error)
        return None
    if listing.returncode != 0:
        log.warning("could not list the SLURM partitions (sinfo: %s); left to sbatch",
                    listing.stderr.strip() or f"exit status {listing.returncode}")
        return None
    defaults: dict[str, bool] = {}
    cpus: dict[str, dict[str, int]] = {}
    for line in listing.stdout.splitlines():
        fields = [field.strip() for field in line.split("|")]
        if len(fields) != 3 or not fields[0]:
            continue
        name = fields[0].rstrip("*")
        defaults[name] = defaults.get(name, False) or fields[0].endswith("*")
        node_cpus = cpus.setdefault(name, {})
        if fields[2].isdigit():
            node_cpus[fields[1]] = int(fields[2])
    return {name: SlurmPartition(name, defaults[name], tuple(cpus[name].values()))
            for name in defaults}


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
