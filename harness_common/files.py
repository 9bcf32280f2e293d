"""Crash-safe files, JSON and the long-format metrics CSV.

Every results file (checkpoints, summaries, reports, figures, data sets) is written through a
temporary file in the same folder and ``os.replace``: a reader, or a writer killed half-way, only
ever sees the old complete file or the new complete one.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` by calling ``write`` on an open binary file, atomically (see the module
    docstring)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as file:
        write(file)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`atomic_write` of a UTF-8 text."""
    atomic_write(path, lambda file: file.write(text.encode()))


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """A temporary path beside ``path`` for writers that need a file name (HDF5, video, torch):
    when the block ends without an exception its data are fsynced and it replaces ``path``;
    otherwise it is removed. The folder is created if needed.

    Args:
        path: The final path.
        suffix: Suffix of the temporary name (some writers pick their format from it);
            defaults to ``path``'s own.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix if suffix is None else suffix
    _remove_orphans(path, suffix)
    # A unique name in the same folder: os.replace is atomic only within one file system, and
    # two writers of the same path must not share a temporary file. The writer creates it, so
    # it gets the usual permissions; the writer's pid in the name lets a later writer remove it
    # if the process was killed before it could.
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp{suffix}")
    try:
        yield tmp
        with open(tmp, "rb") as file:
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def contained_path(root: str | os.PathLike, name: str) -> Path:
    """``root / name``, refused when ``name`` would lead outside ``root`` (``..``, an absolute
    path, a link out): output paths built from names read in configs or files stay inside their
    output folder.

    Raises:
        ValueError: Naming ``name`` and ``root``.
    """
    root = Path(root)
    path = root / name
    if Path(name).is_absolute() or not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{name!r} would write outside the output folder {root}")
    return path


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder beside ``path`` that replaces it when the block ends without an
    exception (and is removed otherwise): a reader finds the old complete folder or the new
    one, never a half-written one.

    Every file is flushed to disk, an existing ``path`` is renamed away, the new folder renamed
    in, then the old one deleted. Temporary names carry the writer's pid; folders left by
    writers that were killed (``.tmp``, or ``.old`` when the kill fell between the renames) are
    removed by the next write of the same ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for orphan in path.parent.glob(f".{path.name}.*-*"):
        pid = orphan.name[len(path.name) + 2:].split("-", 1)[0]
        if (orphan.suffix in (".tmp", ".old") and orphan.is_dir() and pid.isdigit()
                and not _alive(int(pid))):
            shutil.rmtree(orphan, ignore_errors=True)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    tmp = path.with_name(f".{path.name}.{tag}.tmp")
    old = path.with_name(f".{path.name}.{tag}.old")
    tmp.mkdir()
    try:
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file():
                with open(file, "rb") as handle:
                    os.fsync(handle.fileno())
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_orphans(path: Path, suffix: str) -> None:
    """Delete temporary files of ``path`` left by writers that were killed (their pid is gone)."""
    for orphan in path.parent.glob(f".{path.stem}.*-*.tmp{suffix}"):
        pid = orphan.name[len(path.stem) + 2:].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            orphan.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sha256_of(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def to_json(value: Any) -> str:
    """JSON text (indented, newline-terminated) with numpy values and paths converted."""
    return json.dumps(value, indent=2, default=_json_default) + "\n"


def write_json(path: str | os.PathLike, value: Any) -> None:
    """:func:`to_json` written atomically."""
    atomic_write_text(path, to_json(value))


def read_metrics(path: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """A run's ``metrics.csv`` (long format ``step,time_s,key,value``) as
    ``{key: [(step, value), ...]}`` in file order."""
    series: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as file:
        for row in csv.DictReader(file):
            series.setdefault(row["key"], []).append((int(row["step"]), float(row["value"])))
    return series


METRICS_HEADER = ("step", "time_s", "key", "value")


def count_metric_rows(path: Path) -> int:
    """Data rows of a ``metrics.csv`` (0 for a missing file or a header alone)."""
    if not path.exists():
        return 0
    with open(path, "rb") as file:
        return max(0, sum(1 for line in file if line.strip()) - 1)


class MetricsWriter:
    """``metrics.csv`` in long format (``step,time_s,key,value``), so that any key can appear at
    any step and the file only ever grows by whole rows: each :meth:`write` is one ``write`` call
    followed by a flush, and a torn last line left by a kill is cut off when the file is opened
    again."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if self.path.exists() and self.path.stat().st_size > 0:
            self._drop_torn_line()
        else:
            self.path.write_text(",".join(METRICS_HEADER) + "\n")
        self.rows = count_metric_rows(self.path)  # data rows in the file, written or found
        self._file = open(self.path, "a", newline="")  # noqa: SIM115 - held for the run

    def _drop_torn_line(self) -> None:
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            with open(self.path, "r+b") as file:
                file.truncate(data.rfind(b"\n") + 1)

    def write(self, metrics: Mapping[str, Any], step: int, time_s: float) -> None:
        """Append one row per finite numeric metric."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        for key, value in metrics.items():
            if isinstance(value, (bool, int, float, np.number)) and math.isfinite(float(value)):
                writer.writerow((int(step), f"{time_s:.3f}", key, repr(float(value))))
        if buffer.tell():
            self._file.write(buffer.getvalue())
            self._file.flush()
            self.rows += buffer.getvalue().count("\n")

    def truncate(self, step: int, rows: int | None = None) -> None:
        """Keep the first ``rows`` data rows (what the file held when a checkpoint was saved),
        or, when ``rows`` is ``None``, the rows logged at or before ``step``: a resumed run logs
        the others again, once."""
        self._file.close()
        with open(self.path, newline="") as file:
            table = [row for row in csv.reader(file) if row]
        kept = table[1:][:rows] if rows is not None else [
            row for row in table[1:] if int(row[0]) <= step]
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows([table[0], *kept])
        atomic_write_text(self.path, buffer.getvalue())
        self.rows = len(kept)
        self._file = open(self.path, "a", newline="")  # noqa: SIM115

    def close(self) -> None:
        self._file.close()
