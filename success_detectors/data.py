"""Detector data sets: labelled frames on disk, in HDF5 files or folders of photos.

Frames come from simulator episodes (:mod:`success_detectors.collection`, with the episode
policies of :mod:`success_detectors.episode_policies`), split by episode and class-balanced
(:mod:`success_detectors.frames`). This module re-exports those modules' public names, so
``from success_detectors import data`` gives the whole pipeline.

**HDF5 layout** (one file per task and camera)::

    /            attrs: format, version, task, camera, image_size, policies, config (JSON),
                 mining (JSON list, one record per round of hard-negative mining; absent if none),
                 camera_mounts (JSON list, where each view's camera was mounted when the frames
                 were rendered, ``env.unwrapped.camera_mounts``; absent in older files),
                 checksums ("sha256": every dataset below carries the SHA-256 of its contents
                 as its ``sha256`` attribute; absent in older files)
    /<split>/    train, val, test; datasets with one row per frame:
        pixels      uint8 (N, H, W, 3) RGB
        label       bool  (N,)   scripted success
        episode     int64 (N,)   episode id, unique across splits
        step        int32 (N,)   control step within the episode
        difficulty  float32 (N,) the episode's difficulty
        margin      float32 (N,) metres outside the success region (negative inside)
        policy      int8  (N,)   index into the ``policies`` attribute

Readers verify each split they read against its checksums and refuse a damaged file by name
(:class:`harness_common.checksums.ChecksumError`); a collection takes minutes to hours and mined
rounds cannot be replayed from the file, so it is never rebuilt behind the user's back. A file
written before checksums is accepted unchecked once and given them.

**Image folders** (sim-to-real): ``image_dir/success/*.png|jpg`` and ``image_dir/failure/*``.
Each photo counts as its own episode when splitting, so photos of one take may land in different
splits; put takes in separate folders and train per folder if that matters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from harness_common import checksums
from success_detectors.base import check_names
from success_detectors.collection import (
    NEAR_STEP,
    CollectConfig,
    build_dataset,
    collect_episode,
    collect_frames,
    dataset_summary,
    success_margin,
)
from success_detectors.episode_policies import POLICIES
from success_detectors.frames import (
    COLUMNS,
    FrameSet,
    balance_classes,
    empty_frames,
    split_episodes,
    split_frames,
)

__all__ = [
    "COLUMNS", "DATA_FORMAT", "DATA_VERSION", "IMAGE_SUFFIXES", "NEAR_STEP", "POLICIES", "SPLITS",
    "CollectConfig", "FrameSet", "balance_classes", "build_dataset", "camera_mounts",
    "collect_episode", "collect_frames", "config_dict", "dataset_summary", "empty_frames",
    "load_image_folder",
    "read_attrs", "read_dataset", "read_split", "split_episodes", "split_frames",
    "success_margin", "write_dataset",
]

DATA_FORMAT = "success_detectors.frames"
DATA_VERSION = 1
SPLITS = ("train", "val", "test")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
REBUILD_HINT = ("delete it and collect it again (scripts/collect_detector_data.py, then "
                "scripts/mine_hard_negatives.py for the mining rounds it recorded)")


def write_dataset(
    path: str | os.PathLike, splits: Mapping[str, FrameSet], *, task: str, camera: str,
    config: Mapping[str, Any] | None = None, mining: list[dict[str, Any]] | None = None,
    camera_mounts: list[dict[str, Any]] | None = None,
) -> Path:
    """Write the splits to an HDF5 file atomically (layout in the module docstring).

    ``mining`` lists the rounds of hard-negative mining whose frames the train split holds
    (:mod:`success_detectors.mining`); ``camera_mounts`` records where the frames' cameras were
    mounted (:func:`camera_mounts`). Every dataset carries its checksum
    (:mod:`harness_common.checksums`).
    """
    import h5py

    from success_detectors.cnn import write_atomically

    missing = [name for name in SPLITS if name not in splits]
    if missing:
        raise ValueError(f"write_dataset needs splits {list(SPLITS)}; missing {missing}")
    image_shape = splits["train"].pixels.shape[1:]

    def write(temp: Path) -> None:
        with h5py.File(temp, "w") as file:
            file.attrs.update({
                "format": DATA_FORMAT, "version": DATA_VERSION, "task": task, "camera": camera,
                "image_size": int(image_shape[0]), "policies": json.dumps(list(POLICIES)),
                "config": json.dumps(dict(config or {})),
            })
            if mining:
                file.attrs["mining"] = json.dumps(list(mining))
            if camera_mounts is not None:
                file.attrs["camera_mounts"] = json.dumps(list(camera_mounts))
            for name in SPLITS:
                part, group = splits[name], file.create_group(name)
                if len(part):
                    pixels = group.create_dataset("pixels", data=part.pixels, compression="lzf",
                                                  chunks=(min(64, len(part)), *image_shape))
                else:
                    pixels = group.create_dataset("pixels", data=part.pixels)
                checksums.stamp(pixels, part.pixels)
                for column in COLUMNS:
                    values = getattr(part, column)
                    checksums.stamp(group.create_dataset(column, data=values), values)
            checksums.mark(file)

    return write_atomically(path, write)


def camera_mounts(task: str, camera: str) -> list[dict[str, Any]]:
    """Where the task's scene mounts each view of ``camera``, as this code builds it (one
    ``{"camera", "body", "pos", "quat", "fovy"}`` per view; ``TaskEnv.camera_mounts``)."""
    import tasks

    env = tasks.make(task, obs_mode="state")
    try:
        return env.unwrapped.camera_mounts(camera)
    finally:
        env.close()


def read_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """The root attributes of a detector HDF5 file (task, camera, image_size, ...)."""
    import h5py

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"detector dataset {path} does not exist; collect one with "
                                "scripts/collect_detector_data.py")
    try:
        with h5py.File(path, "r") as file:
            attrs = dict(file.attrs)
    except OSError as error:
        raise ValueError(f"{path} is not a readable HDF5 file: {error}") from error
    if attrs.get("format") != DATA_FORMAT:
        raise ValueError(f"{path} is not a detector dataset (format {attrs.get('format')!r}, "
                         f"expected {DATA_FORMAT!r})")
    missing = [key for key in ("task", "camera", "image_size") if key not in attrs]
    if missing:
        raise ValueError(f"{path}: the detector dataset lacks the root attribute(s) {missing}")
    try:
        attrs["config"] = json.loads(attrs.get("config", "{}"))
        attrs["policies"] = json.loads(attrs.get("policies", "[]"))
        attrs["mining"] = json.loads(attrs.get("mining", "[]"))
        attrs["camera_mounts"] = (json.loads(attrs["camera_mounts"])
                                  if "camera_mounts" in attrs else None)
        mounts = attrs["camera_mounts"]
        if mounts is not None and not (isinstance(mounts, list) and all(
                isinstance(m, dict) and {"camera", "body", "pos", "quat", "fovy"} <= set(m)
                for m in mounts)):
            raise ValueError(f"camera_mounts={mounts!r}; expected a list of "
                             "{camera, body, pos, quat, fovy} records, one per view")
        attrs["image_size"] = int(attrs["image_size"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: a malformed root attribute ({error})") from None
    check_names(str(attrs["task"]), str(attrs["camera"]), source=str(path))
    return attrs


def read_split(path: str | os.PathLike, split: str) -> FrameSet:
    """Load one split (``train``, ``val`` or ``test``) of a detector HDF5 file into memory,
    each dataset verified against its checksum (a file written before checksums is accepted
    unchecked once and given them: :func:`harness_common.checksums.adopt_legacy`).

    Raises:
        ValueError: Not a detector dataset, no such split, a column missing or of another
            length, or (:class:`~harness_common.checksums.ChecksumError`) a dataset that does
            not match its checksum; the file and dataset are named.
    """
    import h5py

    read_attrs(path)
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; expected one of {list(SPLITS)}")
    with h5py.File(path, "r") as file:
        if split not in file:
            raise ValueError(f"{path} has no split {split!r}; it has {sorted(file)}")
        group = file[split]
        missing = [f"{split}/{key}" for key in ("pixels", *COLUMNS) if key not in group]
        if missing:
            raise ValueError(f"{path}: the detector dataset lacks {missing}")
        try:
            arrays = {name: group[name][()] for name in ("pixels", *COLUMNS)}
        except OSError as error:  # a chunk that no longer decompresses
            raise ValueError(f"{path}: split {split!r} is damaged ({error}); "
                             f"{REBUILD_HINT}") from error
        lengths = {len(array) for array in arrays.values()}
        if len(lengths) != 1:
            raise ValueError(f"{path}: the columns of split {split!r} disagree in length "
                             f"({sorted(lengths)})")
        checked = checksums.is_checksummed(file)
        if checked:
            for name, array in arrays.items():
                checksums.verify(group[name], array, path, REBUILD_HINT)
    if not checked:
        checksums.adopt_legacy(path, "detector data file")
    return FrameSet(**arrays)


def read_dataset(path: str | os.PathLike) -> dict[str, FrameSet]:
    """All three splits of a detector HDF5 file."""
    return {split: read_split(path, split) for split in SPLITS}


# ---------------------------------------------------------------------------- image folders
def load_image_folder(image_dir: str | os.PathLike, image_size: int) -> FrameSet:
    """Photos from ``image_dir/success/`` and ``image_dir/failure/`` as labelled RGB frames.

    Each photo is centre-cropped to a square and resized to ``image_size`` (area averaging).
    Files that are not ``.png``, ``.jpg`` or ``.jpeg`` are ignored, as are hidden files.

    Raises:
        FileNotFoundError: ``image_dir`` does not exist.
        ValueError: A class folder is missing or holds no images (one class only), no images at
            all, or an image file cannot be decoded (the file is named).
    """
    import cv2

    root = Path(image_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"image_dir {root} does not exist")
    files: dict[str, list[Path]] = {}
    ignored = 0
    for label in ("success", "failure"):
        folder = root / label
        entries = sorted(folder.iterdir()) if folder.is_dir() else []
        files[label] = [p for p in entries if p.is_file() and not p.name.startswith(".")
                        and p.suffix.lower() in IMAGE_SUFFIXES]
        ignored += sum(1 for p in entries if p.is_file()) - len(files[label])
    counts = {label: len(paths) for label, paths in files.items()}
    if sum(counts.values()) == 0:
        raise ValueError(
            f"image_dir {root} holds no images: expected {root}/success/*.png|jpg and "
            f"{root}/failure/*.png|jpg ({ignored} file(s) with other extensions ignored)"
        )
    empty = [label for label, n in counts.items() if n == 0]
    if empty:
        raise ValueError(
            f"image_dir {root} has one class only ({counts}); a detector needs images in both "
            f"{root}/success/ and {root}/failure/ (missing or empty: {empty})"
        )
    pixels, labels, names = [], [], []
    for label, paths in files.items():
        for path in paths:
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is None:
                raise ValueError(f"cannot read image {path}: not a decodable PNG/JPEG file")
            pixels.append(_square_resize(cv2.cvtColor(image, cv2.COLOR_BGR2RGB), image_size))
            labels.append(label == "success")
            names.append(f"{label}/{path.name}")
    n = len(pixels)
    return FrameSet(
        pixels=np.stack(pixels).astype(np.uint8), label=np.array(labels, dtype=bool),
        episode=np.arange(n, dtype=np.int64), step=np.zeros(n, np.int32),
        difficulty=np.full(n, np.nan, np.float32), margin=np.full(n, np.nan, np.float32),
        policy=np.full(n, -1, np.int8), names=names,
    )


def _square_resize(image: np.ndarray, size: int) -> np.ndarray:
    import cv2

    height, width = image.shape[:2]
    side = min(height, width)
    top, left = (height - side) // 2, (width - side) // 2
    crop = image[top:top + side, left:left + side]
    interpolation = cv2.INTER_AREA if side > size else cv2.INTER_LINEAR
    return cv2.resize(crop, (size, size), interpolation=interpolation)


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as plain values (tuples as lists) for JSON and HDF5 attributes."""
    return json.loads(json.dumps(asdict(config)))
