"""Cached data carry checksums: a demo cache or a detector data file damaged after it was written
(one demo's actions overwritten, ten bits of its states flipped, one split's labels changed) is
refused by name before anything trains on it, and a file written before checksums still loads,
once unchecked, and gains them. Real files written through the normal code paths: reach demos
recorded into a cache folder as a run records them, and a 16 px reach detector collection."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from harness.config import BCConfig, Seeds, StartPolicyConfig
from harness.demos import load_demo_snapshots, load_demos
from harness.policies.mlp import MLPConfig
from harness.start_policy import cloned_start_policy
from harness.start_policy.cloning import start_demonstrations
from harness_common.checksums import ChecksumError
from success_detectors.data import (
    CollectConfig,
    build_dataset,
    camera_mounts,
    read_dataset,
    read_split,
    write_dataset,
)
from success_detectors.training import TrainDetectorConfig, train_detector

TASK_OPTIONS = {"obs_mode": "state", "max_episode_steps": 30}
START = StartPolicyConfig(bc=BCConfig(demos=3, epochs=1, difficulty=1.0))
LEGACY_LOG = "written before checksums"


@pytest.fixture(autouse=True)
def own_data_dir(tmp_path, monkeypatch):
    """Nothing here may read or write the data folder of running experiments."""
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory) -> Path:
    """A demo cache recorded the way a run records its start policy's demos."""
    folder = tmp_path_factory.mktemp("demo_cache")
    start_demonstrations("reach", TASK_OPTIONS, START, Seeds(0, 0), progress=False,
                         demo_dir=folder)
    (path,) = folder.glob("*.hdf5")
    return path


@pytest.fixture
def cached_copy(demo_cache, tmp_path) -> Path:
    """A copy of the demo cache under its own name in a cache folder of its own."""
    target = tmp_path / "cache" / demo_cache.name
    target.parent.mkdir()
    shutil.copy(demo_cache, target)
    return target


@pytest.fixture(scope="module")
def detector_data(tmp_path_factory) -> Path:
    """A detector data file collected and written as scripts/collect_detector_data.py does."""
    config = CollectConfig(task="reach", camera="front", image_size=16, episodes=4, seed=0)
    return write_dataset(tmp_path_factory.mktemp("detector") / "reach.h5",
                         build_dataset(config, progress=False), task="reach", camera="front",
                         camera_mounts=camera_mounts("reach", "front"))


def flip_bits(path: Path, dataset: str, count: int = 10, seed: int = 0) -> None:
    """Flip ``count`` distinct bits of a contiguous dataset's bytes in the file itself, as a
    failing disk would, leaving its ``sha256`` attribute alone."""
    with h5py.File(path, "r") as file:
        offset, size = file[dataset].id.get_offset(), file[dataset].id.get_storage_size()
    bits = np.random.default_rng(seed).choice(8 * size, count, replace=False)
    with open(path, "r+b") as raw:
        for bit in bits:
            raw.seek(offset + bit // 8)
            byte = raw.read(1)[0] ^ (1 << int(bit % 8))
            raw.seek(offset + bit // 8)
            raw.write(bytes([byte]))


def dataset_names(file: h5py.File) -> list[str]:
    names: list[str] = []
    file.visititems(lambda name, item: names.append(name)
                    if isinstance(item, h5py.Dataset) else None)
    return names


def strip_checksums(path: Path) -> None:
    """Make ``path`` what the code before checksums wrote: no root marker, no dataset sums."""
    with h5py.File(path, "r+") as file:
        del file.attrs["checksums"]
        for name in dataset_names(file):
            del file[name].attrs["sha256"]


def dataset_checksums(path: Path) -> dict[str, str]:
    """Each dataset's ``sha256`` attribute (``None`` where it has none)."""
    with h5py.File(path, "r") as file:
        return {name: file[name].attrs.get("sha256") for name in dataset_names(file)}


def test_a_demo_cache_whose_actions_were_overwritten_is_not_trained_on(cached_copy):
    load_demos(cached_copy)  # intact, it loads
    with h5py.File(cached_copy, "r+") as file:
        actions = file["data/demo_1/actions"]
        actions[...] = np.random.default_rng(0).uniform(-1, 1, actions.shape)  # finite, in range

    with pytest.raises(ChecksumError, match="checksum of dataset /data/demo_1/actions does not "
                                            "match") as error:
        cloned_start_policy("reach", TASK_OPTIONS, MLPConfig(hidden=16), START, Seeds(0, 0),
                            progress=False, demo_dir=cached_copy.parent)
    assert str(cached_copy) in str(error.value) and "delete it" in str(error.value)


def test_ten_flipped_bits_in_a_demo_cache_states_are_refused_by_name(cached_copy):
    flip_bits(cached_copy, "data/demo_1/obs/state")

    for load in (lambda: load_demos(cached_copy),
                 lambda: start_demonstrations("reach", TASK_OPTIONS, START, Seeds(0, 0),
                                              progress=False, demo_dir=cached_copy.parent)):
        with pytest.raises(ChecksumError, match="/data/demo_1/obs/state does not match") as error:
            load()
        assert str(cached_copy) in str(error.value)


def test_flipped_bits_in_a_demo_cache_snapshots_are_refused_by_name(cached_copy):
    with h5py.File(cached_copy, "r+") as file:
        snapshots = file["data/demo_2/snapshots"]
        step = snapshots[5].copy()
        step[len(step) // 2] ^= 0b1000
        snapshots[5] = step

    with pytest.raises(ChecksumError, match="/data/demo_2/snapshots does not match"):
        load_demo_snapshots(cached_copy)


@pytest.mark.parametrize("damage", ["overwrite labels", "flip ten bits"])
def test_a_damaged_detector_data_entry_is_refused_by_name(detector_data, tmp_path, damage):
    damaged = tmp_path / "reach.h5"
    shutil.copy(detector_data, damaged)
    if damage == "overwrite labels":
        with h5py.File(damaged, "r+") as file:
            file["train/label"][...] = ~file["train/label"][()]
        column = "label"
    else:
        flip_bits(damaged, "train/difficulty")
        column = "difficulty"

    config = TrainDetectorConfig(data=str(damaged), out_dir=str(tmp_path / "out"))
    with pytest.raises(ChecksumError, match=f"/train/{column} does not match") as error:
        train_detector(config, progress=False)
    assert str(damaged) in str(error.value) and "delete it" in str(error.value)
    assert not (tmp_path / "out").exists()
    read_split(damaged, "val")  # the entries left intact still verify


def test_a_legacy_demo_cache_loads_once_unchecked_and_gains_its_checksums(
        demo_cache, cached_copy, caplog):
    strip_checksums(cached_copy)
    caplog.set_level(logging.INFO, logger="harness_common.checksums")

    snapshots = load_demo_snapshots(cached_copy)  # the group trainer's read: accepted
    demos = load_demos(cached_copy)  # a verified read now: no second log line

    assert [r.message for r in caplog.records if LEGACY_LOG in r.message] == [
        f"{cached_copy}: a demo file {LEGACY_LOG}; accepted unchecked, adding its checksums"]
    # the checksums it gained are the ones the writer gives a fresh cache
    assert dataset_checksums(cached_copy) == dataset_checksums(demo_cache)
    fresh = load_demos(demo_cache)
    np.testing.assert_array_equal(demos.actions, fresh.actions)
    np.testing.assert_array_equal(demos.obs["state"], fresh.obs["state"])
    assert snapshots == load_demo_snapshots(demo_cache)
    flip_bits(cached_copy, "data/demo_0/actions")
    with pytest.raises(ChecksumError, match="/data/demo_0/actions does not match"):
        load_demos(cached_copy)


def test_a_legacy_detector_data_file_loads_once_unchecked_and_gains_its_checksums(
        detector_data, tmp_path, caplog):
    legacy = tmp_path / "reach.h5"
    shutil.copy(detector_data, legacy)
    strip_checksums(legacy)
    caplog.set_level(logging.INFO, logger="harness_common.checksums")

    splits = read_dataset(legacy)
    read_dataset(legacy)

    assert len([r for r in caplog.records if LEGACY_LOG in r.message]) == 1
    assert dataset_checksums(legacy) == dataset_checksums(detector_data)
    for name, part in read_dataset(detector_data).items():
        np.testing.assert_array_equal(splits[name].pixels, part.pixels)
        np.testing.assert_array_equal(splits[name].label, part.label)
