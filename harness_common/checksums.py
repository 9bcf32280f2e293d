"""Content checksums of cached HDF5 files (demo caches, detector data sets).

Every dataset of a checksummed file carries the SHA-256 of its contents as its ``sha256``
attribute (:func:`array_sha256` of the array as h5py reads it back), and the file's root carries
``checksums = "sha256"``. A reader verifies each dataset it reads, with the array it already
holds, so nothing is read or hashed twice; a dataset whose bytes changed after it was written
(a flipped bit, an overwrite) is refused with a :class:`ChecksumError` naming the file and the
dataset. A file written before checksums existed (no root marker) is accepted once, unchecked,
and checksums are added to it (:func:`adopt_legacy`: one more read of the whole file, once), so
every later read verifies it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from harness_common.files import atomic_path

log = logging.getLogger(__name__)

CHECKSUM_ATTR = "sha256"  # on each dataset: hex SHA-256 of its contents
MARKER_ATTR = "checksums"  # on the file's root: "sha256" when every dataset carries one
ALGORITHM = "sha256"

_unwritable: set[str] = set()  # legacy files whose checksums could not be added (logged once)


class ChecksumError(ValueError):
    """A cached dataset whose contents do not match the checksum written with them."""


def array_sha256(data: np.ndarray | Sequence[np.ndarray]) -> str:
    """Hex SHA-256 of an array's dtype, shape and bytes (C order).

    Args:
        data: An array, or variable-length rows (a list of arrays, or the object array h5py
            reads from a variable-length dataset), hashed row after row the same way.

    Returns:
        64 hex digits.
    """
    digest = hashlib.sha256()
    rows = [data] if isinstance(data, np.ndarray) and data.dtype != object else data
    for row in rows:
        row = np.ascontiguousarray(row)
        digest.update(f"{row.dtype.str}{row.shape}".encode())
        digest.update(row.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def stamp(dataset: h5py.Dataset, data: np.ndarray | Sequence[np.ndarray]) -> None:
    """Record the checksum of ``data``, just written into ``dataset``, as its ``sha256``
    attribute; ``data`` is taken in the dataset's dtype, as a reader gets it back."""
    if dataset.dtype != object:
        data = np.asarray(data, dtype=dataset.dtype)
    dataset.attrs[CHECKSUM_ATTR] = array_sha256(data)


def mark(file: h5py.File) -> None:
    """Mark ``file`` as one whose every dataset carries a checksum (call after stamping)."""
    file.attrs[MARKER_ATTR] = ALGORITHM


def is_checksummed(file: h5py.File) -> bool:
    """Whether ``file`` records checksums (files written before them do not)."""
    return file.attrs.get(MARKER_ATTR) == ALGORITHM


def verify(dataset: h5py.Dataset, data: np.ndarray, path: str | os.PathLike, fix: str) -> None:
    """Check ``data``, read from ``dataset`` of a checksummed file, against its checksum.

    Args:
        dataset: The dataset it was read from (for its checksum and name).
        data: What was read.
        path: The file, for the message.
        fix: How to rebuild the file, for the message.

    Raises:
        ChecksumError: The checksum is missing or does not match; names the file and dataset.
    """
    stored = dataset.attrs.get(CHECKSUM_ATTR)
    if stored is None:
        raise ChecksumError(
            f"{path}: dataset {dataset.name} carries no {CHECKSUM_ATTR} checksum though the file "
            f"records them (root attribute {MARKER_ATTR}={ALGORITHM!r}): it was replaced or "
            f"damaged after the file was written; {fix}")
    actual = array_sha256(data)
    if actual != str(stored):
        raise ChecksumError(
            f"{path}: the checksum of dataset {dataset.name} does not match its contents (stored "
            f"sha256 {str(stored)[:16]}..., computed {actual[:16]}...): the file is damaged; "
            f"{fix}")


def add_checksums(path: str | os.PathLike) -> None:
    """Give every dataset of the HDF5 file ``path`` its checksum and mark the file, atomically:
    a copy is stamped, then replaces ``path`` (readers holding it open keep the old file)."""
    path = Path(path)
    with atomic_path(path) as temp:
        shutil.copyfile(path, temp)
        with h5py.File(temp, "r+") as file:
            names: list[str] = []

            def collect(name: str, item: h5py.HLObject) -> None:
                if isinstance(item, h5py.Dataset):
                    names.append(name)

            file.visititems(collect)
            for name in names:
                stamp(file[name], file[name][()])
            mark(file)


def adopt_legacy(path: str | os.PathLike, kind: str) -> None:
    """Accept a file written before checksums existed: log it and add them
    (:func:`add_checksums`), so that the next read verifies it. A file that cannot be rewritten
    (a read-only folder, a full disk, a dataset h5py cannot read whole) stays loadable,
    unchecked, with one warning and no further tries in this process.

    Args:
        path: The file.
        kind: What it is, for the log (``"demo file"``).
    """
    if str(path) in _unwritable:
        return
    log.info("%s: a %s written before checksums; accepted unchecked, adding its checksums",
             path, kind)
    try:
        add_checksums(path)
    except Exception as error:  # any failure: a legacy cache must still load
        _unwritable.add(str(path))
        log.warning("%s: could not add checksums (%s); it stays unchecked", path, error)
