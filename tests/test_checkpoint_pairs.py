"""A checkpoint and its metadata change together: a kill at any rename of
:func:`harness.runs.write_checkpoint` leaves a pair that :func:`harness.runs.resolve_checkpoint`
reads whole, the old one or the new one.

The kill is simulated by making the k-th ``os.replace`` of a save raise; every file the save
wrote before it stays on disk, as after ``kill -9`` (only the ``.tmp`` scratch files differ).
"""

from __future__ import annotations

import json

import pytest

from harness import runs
from harness.runs import CheckpointError, resolve_checkpoint, write_checkpoint

META = {"algo": "ppo", "task": "reach", "task_options": {}}
RENAMES_PER_SAVE = 4  # checkpoint bytes -> .next, metadata -> .next, .next file -> name, .next json


class Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so no handler in the code under test eats it."""


def save(directory, payload: bytes, kill_at: int | None = None, monkeypatch=None) -> None:
    """``write_checkpoint`` of ``payload``, killed just before its ``kill_at``-th rename."""
    if kill_at is not None:
        real_replace = runs.os.replace
        calls = []

        def replace(src, dst):
            calls.append((src, dst))
            if len(calls) == kill_at:
                raise Killed
            real_replace(src, dst)

        monkeypatch.setattr(runs.os, "replace", replace)
    try:
        write_checkpoint(directory, "latest", ".zip", lambda f: f.write(payload),
                         {**META, "num_timesteps": len(payload)})
    except Killed:
        pass
    finally:
        if kill_at is not None:
            monkeypatch.undo()


@pytest.mark.parametrize("kill_at", range(1, RENAMES_PER_SAVE + 1))
def test_a_killed_save_leaves_a_whole_pair(tmp_path, monkeypatch, kill_at):
    old, new = b"old checkpoint", b"the new, longer checkpoint"
    save(tmp_path, old)
    save(tmp_path, new, kill_at, monkeypatch)

    file, metadata = resolve_checkpoint(tmp_path / "latest.json")
    # Killed before the file's rename: the old pair; between the renames: the new one, finished.
    expected = new if kill_at == RENAMES_PER_SAVE else old
    assert file.read_bytes() == expected
    assert metadata["num_timesteps"] == len(expected)
    assert json.loads((tmp_path / "latest.json").read_text())["num_timesteps"] == len(expected)

    newest = b"saved after the kill"
    save(tmp_path, newest)
    file, metadata = resolve_checkpoint(tmp_path)
    assert file.read_bytes() == newest and metadata["num_timesteps"] == len(newest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "latest.zip"]


@pytest.mark.parametrize("kill_at", range(1, RENAMES_PER_SAVE + 1))
def test_a_killed_first_save_is_all_or_nothing(tmp_path, monkeypatch, kill_at):
    save(tmp_path, b"first", kill_at, monkeypatch)
    if kill_at < RENAMES_PER_SAVE:
        with pytest.raises(CheckpointError, match="no checkpoint in"):
            resolve_checkpoint(tmp_path)
    else:
        file, _ = resolve_checkpoint(tmp_path / "latest.zip")
        assert file.read_bytes() == b"first"


def test_a_torn_journal_entry_is_ignored(tmp_path):
    save(tmp_path, b"committed")
    (tmp_path / "latest.next.json").write_text('{"file": "latest.zip", "sha2')
    file, _ = resolve_checkpoint(tmp_path)
    assert file.read_bytes() == b"committed"


def test_a_corrupt_file_is_still_reported(tmp_path):
    """The journal never hides real damage: bytes that match neither record are an error."""
    save(tmp_path, b"committed")
    (tmp_path / "latest.zip").write_bytes(b"commi")
    with pytest.raises(CheckpointError, match="is corrupt: its SHA-256"):
        resolve_checkpoint(tmp_path)
