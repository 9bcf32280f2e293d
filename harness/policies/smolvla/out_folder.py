"""Where a SmolVLA checkpoint folder may be written, and which existing folder it may replace.

A folder is written under a temporary name beside its target and renamed into place; the
folder it replaces is renamed away and deleted. So the target may not be the working directory
or a folder above it (``out=.``, ``out=..``: renaming those fails half-way), and the folder
replaced must hold nothing its writer did not write. A folder written by
:meth:`~harness.policies.smolvla.policy.SmolVLAPolicy.write_lerobot_folder` (the exporter's
``format=lerobot``) says so in :data:`MARKER_FILE`, a small JSON naming the writer, the format,
the date and the files written; ``overwrite`` replaces such a folder only, and refuses, without
touching it, any other: a LeRobot download, a folder of notes, one with files added since.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MARKER_FILE = "harness_export.json"
WRITER = "vla_rl_harness SmolVLAPolicy.write_lerobot_folder (scripts/export_policy.py)"


def marker_record(files: Collection[str]) -> dict[str, Any]:
    """The content of :data:`MARKER_FILE` for a folder of ``files``."""
    return {"written_by": WRITER, "format": "lerobot smolvla",
            "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "files": sorted(files)}


def check_out_folder(folder: Path) -> None:
    """Refuse a target that is the working directory or a folder above it.

    Raises:
        ValueError: Naming the folder, where it resolves and the working directory.
    """
    resolved, here = folder.resolve(), Path.cwd().resolve()
    if here.is_relative_to(resolved):
        what = "the working directory" if resolved == here else "a folder above the working " \
            "directory"
        raise ValueError(f"{folder} is {what} ({resolved}); a checkpoint "
                         "folder is replaced by renaming it, so choose one beside or below it, "
                         "e.g. out=smolvla_reach")


def check_replaceable(folder: Path, ours: Collection[str] = (), marked: bool = True) -> None:
    """Refuse to replace ``folder`` unless it holds only files its writer wrote.

    Args:
        folder: The existing target.
        ours: The files the writer writes, for a folder without a marker (``marked=False``).
        marked: The folder must hold :data:`MARKER_FILE` of :data:`WRITER`, and only the files
            it lists.

    Raises:
        FileExistsError: Naming the folder and what it holds that the writer did not write; the
            folder is left as it is.
    """
    leave = "; it is left as it is: move it away yourself, or choose another folder"
    if folder.is_symlink() or not folder.is_dir():
        raise FileExistsError(f"{folder} exists and is not a folder{leave}")
    if marked:
        try:
            marker = json.loads((folder / MARKER_FILE).read_text())
            ours = {*marker["files"], MARKER_FILE} if marker["written_by"] == WRITER else ()
        except (OSError, ValueError, KeyError, TypeError):
            ours = ()
        if not ours:
            raise FileExistsError(
                f"{folder} holds no readable {MARKER_FILE} naming this exporter, so it was not "
                f"written by scripts/export_policy.py format=lerobot (or by a version before "
                f"{MARKER_FILE}); overwrite=true replaces only folders the exporter wrote{leave}")
    foreign = sorted(f"{entry.name}/" if entry.is_dir() else entry.name
                     for entry in folder.iterdir() if entry.name not in ours or entry.is_dir())
    if foreign:
        raise FileExistsError(f"{folder} holds {foreign}, which its writer did not write; "
                              f"overwrite=true replaces only what it wrote{leave}")
