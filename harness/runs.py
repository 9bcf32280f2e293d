"""Run directories: what a training run writes, and its crash-safe checkpoints.

A run directory (Hydra's output dir) holds::

    config.yaml          the resolved TrainConfig
    metrics.csv          step,time_s,key,value rows (long format), appended and flushed per call
    tensorboard/         TensorBoard events of the same metrics
    checkpoints/         latest.<ext> + latest.json, best.<ext> + best.json (crash-safe pairs)
    videos/              H.264 mp4 of evaluation episodes (``logger.videos``)
    summary.json         final evaluation (success_rate, its 95% Wilson interval, ...), env steps,
                         wall-clock, fps, versions, git commit
    run.lock             while a process trains into the folder: its PID and host (:class:`RunLock`)

**Checkpoint metadata** (``<name>.json`` next to ``<name>.<ext>``) is how every tool finds out what
a checkpoint holds without loading it: ``{"format": 1, "algo", "task", "task_options", "policy",
"file", "sha256", "num_timesteps", "wall_clock_s", ...}`` plus whatever trainer state the algorithm
adds. ``scripts/evaluate.py`` dispatches on ``algo``; the sha256 catches a corrupt file.

Trainers (``harness.trainers``) write into a :class:`Run`; ``harness.trainers.train`` adds the
bookkeeping and writes ``summary.json``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from omegaconf import OmegaConf

from harness.config import TrainConfig, to_yaml
from harness.wandb_run import WandbRun
from harness_common.files import (
    MetricsWriter,
    atomic_path,
    atomic_write,
    atomic_write_text,
    count_metric_rows,
    sha256_of,
    to_json,
)

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1
PENDING = ".next"  # infix of a checkpoint pair being committed (see write_checkpoint)
LOCK_FILE = "run.lock"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable, corrupt or of another run."""


# ------------------------------------------------------------------------------ checkpoints
def write_checkpoint(
    directory: Path,
    name: str,
    suffix: str,
    save: Callable[[BinaryIO], None],
    metadata: Mapping[str, Any],
) -> Path:
    """Write ``<name><suffix>`` and its ``<name>.json`` metadata as one crash-safe pair.

    The pair is committed through a journal, so that a kill at any instant leaves a pair that
    :func:`resolve_checkpoint` reads whole (the old one or the new one, never a new file with old
    metadata): both are first written complete as ``<name>.next<suffix>`` and
    ``<name>.next.json``; then the file is renamed into place, then the metadata. A kill between
    the two renames leaves ``<name>.next.json`` describing the file in place, and
    :func:`resolve_checkpoint` finishes the commit.

    Args:
        directory: The ``checkpoints/`` folder.
        name: ``latest``, ``best`` or another label.
        suffix: File extension with its dot (``.zip`` for SB3, ``.pt`` for torch).
        save: Writes the checkpoint's bytes to an open binary file.
        metadata: JSON-able fields; ``algo``, ``task`` and ``task_options`` are required.

    Returns:
        The checkpoint file's path.
    """
    missing = [key for key in ("algo", "task", "task_options") if key not in metadata]
    if missing:
        raise ValueError(f"checkpoint metadata lacks {missing}; it needs algo, task, task_options")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}{suffix}"
    pending_file = directory / f"{name}{PENDING}{suffix}"
    pending_meta = directory / f"{name}{PENDING}.json"
    atomic_write(pending_file, save)
    record = {"format": CHECKPOINT_FORMAT, **metadata, "file": path.name,
              "sha256": sha256_of(pending_file)}
    atomic_write_text(pending_meta, to_json(record))
    os.replace(pending_file, path)
    os.replace(pending_meta, directory / f"{name}.json")
    return path


def _finish_interrupted_commit(meta_path: Path) -> None:
    """Complete a :func:`write_checkpoint` killed between its two renames: when
    ``<name>.next.json`` describes the file now in place, it becomes ``<name>.json``."""
    pending = meta_path.with_name(f"{meta_path.stem}{PENDING}.json")
    if not pending.exists():
        return
    try:
        record = json.loads(pending.read_text())
        file = meta_path.with_name(record["file"])
        if not file.exists() or sha256_of(file) != record["sha256"]:
            return  # killed before the file's rename: the committed pair is still whole
        os.replace(pending, meta_path)
    except (OSError, ValueError, KeyError, TypeError):
        return  # a torn journal entry is never used; the committed pair stands


def resolve_checkpoint(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """Find a checkpoint and its metadata, and check that the file is intact.

    Args:
        path: A run directory (its ``checkpoints/best``, else ``latest``), a ``checkpoints/``
            folder, a metadata ``.json``, or the checkpoint file itself.

    Returns:
        ``(checkpoint file, metadata)``.

    Raises:
        CheckpointError: Nothing there, unreadable metadata, or a file whose SHA-256 differs
            from the one recorded (a corrupt or half-written checkpoint).
    """
    path = Path(path)
    if path.is_dir():
        folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        candidates = [folder / "best.json", folder / "latest.json"]
        for candidate in candidates:
            _finish_interrupted_commit(candidate)
        meta_path = next((c for c in candidates if c.exists()), None)
        if meta_path is None:
            raise CheckpointError(f"no checkpoint in {path}: neither {candidates[0]} nor "
                                  f"{candidates[1]} exists")
    else:
        meta_path = path if path.suffix == ".json" else path.with_suffix(".json")
        if meta_path is not path and not path.exists():
            raise CheckpointError(f"checkpoint {path} does not exist")
        _finish_interrupted_commit(meta_path)
    if not meta_path.exists():
        raise CheckpointError(
            f"checkpoint metadata {meta_path} does not exist; every checkpoint needs a JSON next "
            "to it with at least {\"algo\", \"task\", \"task_options\"}"
        )
    try:
        metadata = json.loads(meta_path.read_text())
        file = meta_path.with_name(metadata["file"])
        recorded = metadata["sha256"]
        for key in ("algo", "task", "task_options"):
            metadata[key]  # noqa: B018 - presence check
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"checkpoint metadata {meta_path} is corrupt: {error!r}") from None
    if not file.exists():
        raise CheckpointError(f"checkpoint {file} (named by {meta_path}) does not exist")
    actual = sha256_of(file)
    if actual != recorded:
        raise CheckpointError(
            f"checkpoint {file} is corrupt: its SHA-256 is {actual[:12]}..., the metadata "
            f"{meta_path.name} recorded {recorded[:12]}... (a truncated or half-written file?)"
        )
    return file, metadata


# ----------------------------------------------------------------------------------- metrics
def earlier_run_files(directory: Path) -> list[Path]:
    """What an earlier run left in ``directory`` that a fresh start would overwrite: logged
    metrics, a summary, checkpoints, a saved start policy (Hydra's ``.hydra/`` and log are not)."""
    found = [directory / name for name in ("summary.json", "start_policy.pt")
             if (directory / name).exists()]
    if count_metric_rows(directory / "metrics.csv"):
        found.append(directory / "metrics.csv")
    checkpoints = directory / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        found.append(checkpoints)
    return found


def move_aside(directory: Path) -> Path:
    """Move the files of an earlier run in ``directory`` to ``replaced/<time>/`` inside it
    (``overwrite=true``): a fresh start never deletes or truncates what a run wrote."""
    target = directory / "replaced" / time.strftime("%Y-%m-%d_%H-%M-%S")
    while target.exists():
        target = target.with_name(target.name + "_")
    target.mkdir(parents=True)
    for name in ("summary.json", "start_policy.pt", "metrics.csv", "config.yaml", "checkpoints",
                 "tensorboard", "videos", "detector_refresh", "learning_curve.png"):
        if (directory / name).exists():
            os.replace(directory / name, target / name)
    log.warning("overwrite=true: the earlier run's files in %s were moved to %s", directory,
                target)
    return target


# ------------------------------------------------------------------------------------ lock
class RunInUseError(RuntimeError):
    """A run directory that another live process is training into (see :class:`RunLock`)."""


class RunLock:
    """Ownership of a run directory by one process at a time.

    An advisory ``fcntl.flock`` on ``<run dir>/run.lock``, which holds the owner's PID and host.
    The kernel drops the lock when its process dies, however it dies (``kill -9`` included), so a
    lock file left behind by a dead run is free: the next run takes it over, logs whose it was,
    and a resume after a kill works as before. :meth:`release` deletes the file (an ended run
    leaves none). ``fcntl.flock`` locks an open file, so two ``RunLock`` of one folder exclude
    each other inside one process too; the descriptor is not inherited by spawned processes
    (rollout workers), and every job of a sweep locks its own folder.

    Use it as a context manager (released on exit, also on exceptions)::

        with RunLock(run_dir):
            ...  # the only process writing into run_dir

    Args:
        directory: The run directory (created if missing: the lock is the first thing in it).
    """

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.path = self.dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, before anything else is written into the directory.

        Raises:
            RunInUseError: Another live process holds it; names the folder and that process's
                PID and host. Nothing in the directory changes.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _lock_owner(fd)
                os.close(fd)
                raise self._in_use(owner) from None
            if _is_file_at(fd, self.path):
                break
            os.close(fd)  # its owner released (deleted) the file between our open and flock
        previous = _lock_owner(fd)
        if previous:
            log.warning("run dir %s: taking over the lock of %s, which no longer holds it (it "
                        "ended without releasing %s: killed?)", self.dir, previous, self.path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, to_json({"pid": os.getpid(), "host": socket.gethostname(),
                               "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        self._fd = fd

    def refuse_if_held(self) -> None:
        """Refuse a run into the directory while another process holds its lock, without taking
        the lock (a look must not make a run that is starting find it taken): the kernel's
        table of locks, ``/proc/locks``, is read (Linux; elsewhere this checks nothing, and
        :meth:`acquire` still refuses).

        Raises:
            RunInUseError: As :meth:`acquire`.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return  # no lock file: no run holds the folder
        try:
            stat = os.fstat(fd)
            inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
            try:
                table = Path("/proc/locks").read_text().splitlines()
            except OSError:
                return
            # "1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF"; "1: -> ..." waits
            if any(line.split()[1:2] == ["FLOCK"] and inode in line.split() for line in table):
                raise self._in_use(_lock_owner(fd))
        finally:
            os.close(fd)

    def _in_use(self, owner: str) -> RunInUseError:
        return RunInUseError(
            f"run dir {self.dir} is in use by {owner or 'another process'} (it holds "
            f"{self.path}); two runs into one folder would corrupt it: wait for that run to "
            "end, or choose another hydra.run.dir")

    def release(self) -> None:
        """Delete the lock file and drop the lock (nothing when it is not held)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)  # while still locked: no one can take a deleted file
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _lock_owner(fd: int) -> str:
    """``PID <pid> on <host> (since <time>)`` from an open lock file, ``""`` when it holds none."""
    text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    if not text:
        return ""
    try:
        owner = json.loads(text)
        return f"PID {owner['pid']} on {owner['host']} (since {owner['since']})"
    except (ValueError, KeyError, TypeError):
        return f"an unreadable owner record {text[:80]!r}"


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the one at ``path`` (not deleted or replaced)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


# ------------------------------------------------------------------------------------- run
class Run:
    """One run directory and everything written into it.

    Check a resume first with :meth:`checkpoint_to_resume`, which writes nothing: building a
    ``Run`` writes ``config.yaml`` and, when resuming (``resume_metadata`` holds the latest
    checkpoint's metadata), drops the metrics logged after that checkpoint, so that the clock,
    the metrics and the TensorBoard events continue from it.

    Args:
        directory: The run directory.
        config: The run's configuration.
        resume_metadata: Metadata of the checkpoint to continue from, or ``None``.
    """

    def __init__(
        self, directory: Path, config: TrainConfig, resume_metadata: dict[str, Any] | None = None
    ) -> None:
        self.dir = Path(directory)
        self.config = config
        self.resume_metadata = resume_metadata
        self.checkpoints_dir = self.dir / "checkpoints"
        self.videos_dir = self.dir / "videos"
        self.tensorboard_dir = self.dir / "tensorboard"
        if resume_metadata is None and config.overwrite and earlier_run_files(self.dir):
            move_aside(self.dir)
        for folder in (self.dir, self.checkpoints_dir):  # videos/ with the first video
            folder.mkdir(parents=True, exist_ok=True)
        self._elapsed_before = float((resume_metadata or {}).get("wall_clock_s", 0.0))
        self._started = time.perf_counter()
        atomic_write_text(self.dir / "config.yaml", to_yaml(config))
        self.metrics = MetricsWriter(self.dir / "metrics.csv")
        if resume_metadata is not None:  # drop what was logged after the checkpoint was saved
            self.metrics.truncate(self.start_step, resume_metadata.get("metrics_rows"))
        self._tensorboard = None
        if config.logger.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(
                str(self.tensorboard_dir), flush_secs=10,
                purge_step=self.start_step,
            )
        self._wandb = WandbRun.open(self.dir, config, resuming=resume_metadata is not None)

    @staticmethod
    def checkpoint_to_resume(directory: str | Path,
                             config: TrainConfig) -> tuple[Path, dict[str, Any]] | None:
        """The checkpoint a run in ``directory`` continues from, checked without writing
        anything in the directory; ``None`` for a fresh run, which ``resume=true`` also starts
        where no checkpoint was ever saved (a job of a re-launched sweep that had not begun).

        Raises:
            CheckpointError: ``resume=true`` with an unreadable or corrupt
                ``checkpoints/latest``, or one of another algorithm, task or policy; a fresh
                run in a directory that already holds a resumable one; or, without
                ``overwrite=true``, a directory holding an earlier run that cannot be resumed
                (metrics, a summary or checkpoints, but no ``checkpoints/latest``).
        """
        directory = Path(directory)
        latest = directory / "checkpoints" / "latest.json"
        _finish_interrupted_commit(latest)
        if latest.exists() and not config.resume:
            raise CheckpointError(
                f"run dir {directory} already holds a run ({latest}); pass resume=true to "
                "continue it, or choose another hydra.run.dir")
        if not latest.exists():
            earlier = earlier_run_files(directory)
            if earlier and not config.overwrite:
                finished = " a finished run (summary.json) whose" if (
                    directory / "summary.json").exists() else " an earlier run whose"
                raise CheckpointError(
                    f"run dir {directory} holds{finished} checkpoints/latest is missing, so it "
                    f"cannot be resumed ({', '.join(p.name for p in earlier)}); pass "
                    "overwrite=true to move its files to replaced/<time>/ and start afresh, or "
                    "choose another hydra.run.dir")
            if config.resume:  # a job of a re-launched sweep that had not begun
                log.warning("resume=true but %s holds no checkpoint (%s does not exist): "
                            "starting a fresh run there", directory, latest)
            return None
        file, metadata = resolve_checkpoint(latest)
        expected = {
            "algo": config.algo.name, "task": config.task.name, "policy": config.policy.name,
        }
        found = {"algo": metadata["algo"], "task": metadata["task"],
                 "policy": metadata.get("policy", {}).get("name")}
        if found != expected:
            raise CheckpointError(
                f"cannot resume {latest}: it was written by {found}, this run asks for {expected}"
            )
        return file, metadata

    # ------------------------------------------------------------------------- bookkeeping
    @property
    def start_step(self) -> int:
        """Environment steps done before this process (0 for a fresh run)."""
        return int((self.resume_metadata or {}).get("num_timesteps", 0))

    def elapsed(self) -> float:
        """Wall-clock seconds of the run, earlier sessions of a resumed run included."""
        return self._elapsed_before + time.perf_counter() - self._started

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Write numeric metrics (namespaced keys, e.g. ``eval/success_rate``) at ``step``."""
        self.metrics.write(metrics, step, self.elapsed())
        if self._tensorboard is not None:
            for key, value in metrics.items():
                if isinstance(value, (bool, int, float, np.number)):
                    self._tensorboard.add_scalar(key, float(value), step)
        if self._wandb is not None:
            self._wandb.log(metrics, step)

    def checkpoint_metadata(self, num_timesteps: int, **extra: Any) -> dict[str, Any]:
        """The metadata fields every checkpoint of this run carries, plus ``extra``."""
        config = self.config
        return {
            "algo": config.algo.name,
            "task": config.task.name,
            "task_options": config.task.env_options(),
            "policy": OmegaConf.to_container(OmegaConf.structured(config.policy)),
            "num_timesteps": int(num_timesteps),
            "wall_clock_s": self.elapsed(),
            "seed": config.seed,
            "run_dir": str(self.dir.resolve()),
            "metrics_rows": self.metrics.rows,  # a resume drops the rows logged after this
            **extra,
        }

    def save_checkpoint(
        self, name: str, suffix: str, save: Callable[[BinaryIO], None], metadata: dict[str, Any]
    ) -> Path:
        """:func:`write_checkpoint` into this run's ``checkpoints/``."""
        return write_checkpoint(self.checkpoints_dir, name, suffix, save, metadata)

    def write_video(self, name: str, frames: list[np.ndarray], fps: int = 25) -> Path | None:
        """Encode RGB frames as H.264 ``videos/<name>.mp4``; nothing when there are no frames."""
        if not frames:
            return None
        self.videos_dir.mkdir(exist_ok=True)
        path = self.videos_dir / f"{name}.mp4"
        write_video(path, frames, fps)
        return path

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """Write ``summary.json`` atomically."""
        path = self.dir / "summary.json"
        atomic_write_text(path, to_json(dict(summary)))
        return path

    def close(self) -> None:
        self.metrics.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.close()


def write_video(path: Path, frames: list[np.ndarray], fps: int = 25) -> None:
    """Encode RGB uint8 frames to an H.264 mp4 with imageio-ffmpeg, atomically."""
    import imageio.v2 as imageio

    with atomic_path(path) as tmp, imageio.get_writer(
            tmp, format="FFMPEG", mode="I", fps=fps, codec="libx264", pixelformat="yuv420p",
            macro_block_size=8) as writer:
        for frame in frames:
            writer.append_data(np.asarray(frame, dtype=np.uint8))
