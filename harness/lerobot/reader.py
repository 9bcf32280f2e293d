"""A LeRobotDataset v3.0 folder back into :class:`harness.demos.Demos`, what behaviour cloning
reads, with LeRobot's features mapped to our observation keys (:mod:`harness.lerobot.layout`).

Videos are decoded whole, then each frame is taken at its episode's ``from_timestamp`` plus its
own ``timestamp``. Folders written by :func:`harness.lerobot.export_lerobot` carry
``meta/vla_rl_harness.json`` (the demos' ``env_args``, seeds, successes and observation keys);
for other LeRobot datasets every episode counts as a success, seeds are -1 and ``env_args`` is
empty.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harness.demos import Demos
from harness.lerobot import layout
from harness.lerobot.checks import (
    contained,
    read_episodes,
    read_info,
    read_json,
    validate_dataset,
)
from harness.lerobot.layout import ACTION, DONE, IMAGES, REWARD
from harness.lerobot.video import decode_video
from tasks.language import MAX_TOKENS, tokenize

# read_info and validate_dataset are the checks the config runs on algo.start_policy.dataset.
__all__ = ["load_lerobot", "read_info", "validate_dataset"]

def load_lerobot(root: str | os.PathLike, keys: list[str] | tuple[str, ...] | None = None,
                 shapes: Mapping[str, tuple[int, ...]] | None = None,
                 camera: str | None = None) -> Demos:
    """Read a LeRobotDataset v3.0 folder as demonstrations, episodes in ``episode_index`` order.

    Args:
        root: The dataset folder.
        keys: Observation keys to read (``proprio``, ``state``, ``pixels``, ``instruction``);
            ``None`` reads those of ``shapes``, else those the export recorded, else all the
            folder has.
        shapes: Key -> the shape one observation must have (e.g. a task's observation space):
            checked against ``meta/info.json`` before anything large is read.
        camera: Camera whose video becomes ``pixels`` (``observation.images.<camera>``); needed
            only when the folder has several.

    Returns:
        The demonstrations (``pixels`` uint8, vectors float32, ``instruction`` int64 tokens).

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: Not a v3.0 dataset, or damaged (:func:`harness.lerobot.checks.validate_dataset`:
            paths leaving the folder, malformed features, columns of the wrong shape,
            non-finite or out-of-bounds values); a feature the keys need is missing; a shape
            differs from ``shapes``; or a task's words are not in the task vocabulary
            (:data:`tasks.language.VOCAB`).
    """
    root = Path(root)
    info = validate_dataset(root)
    features = info["features"]
    extra = _read_extra(root)
    sources = _sources(root, features, camera)
    wanted = list(keys if keys is not None else shapes if shapes is not None
                  else extra.get("observation_keys", sources))
    _check_features(root, features, sources, wanted, shapes or {})

    video = sources["pixels"] if "pixels" in wanted else None
    if video is not None and features[video]["dtype"] != "video":
        video = None  # frames stored as images in the data files
    episodes = read_episodes(root, info)
    columns = [name for name in (ACTION, REWARD, DONE, *(sources[k] for k in wanted
                                                         if k in layout.VECTOR_KEYS))
               if name in features]
    if "pixels" in wanted and video is None:
        columns.append(sources["pixels"])
    frames = _read_frames(root, info, episodes, columns)

    obs = {key: _observation(root, info, key, sources[key], video, episodes, frames)
           for key in wanted}
    episode_ids = frames["episode_index"].to_numpy()
    ends = np.r_[episode_ids[1:] != episode_ids[:-1], True]  # each episode's last frame
    recorded = extra.get("episodes", {})
    count = len(episodes["episode_index"])

    def per_episode(name: str, default: Any) -> list:
        values = recorded.get(name)
        return values if isinstance(values, list) and len(values) == count else [default] * count

    return Demos(
        obs=obs,
        actions=_column(frames[ACTION]).astype(np.float32),
        rewards=(frames[REWARD].to_numpy().astype(np.float32) if REWARD in columns
                 else np.zeros(len(episode_ids), np.float32)),
        dones=(frames[DONE].to_numpy(zero_copy_only=False).astype(bool) if DONE in columns
               else ends),
        episode_ids=np.cumsum(np.r_[False, ends[:-1]]).astype(np.int64),
        successes=np.asarray(per_episode("success", True), dtype=bool),
        seeds=np.asarray(per_episode("seed", -1), dtype=np.int64),
        env_args=extra.get("env_args", {}),
    )


def _observation(root: Path, info: dict[str, Any], key: str, source: str, video: str | None,
                 episodes: dict[str, np.ndarray], frames: pa.Table) -> np.ndarray:
    """The ``(N, ...)`` observations ``key`` of every frame, read from the feature ``source``:
    a vector column, the task texts tokenised, or the images of ``video`` or of the data files.

    Raises:
        ValueError: Images that decode to another shape than ``info.json`` gives.
    """
    if key in layout.VECTOR_KEYS:
        return _column(frames[source]).astype(np.float32)
    if key == "instruction":
        return _instructions(root, frames["task_index"].to_numpy())
    images = (_video_frames(root, info, video, episodes, frames) if video
              else _image_frames(frames[source]))
    shape = tuple(info["features"][source]["shape"])
    if images.shape[1:] != shape:
        raise ValueError(f"{root}: {source} decodes to frames of {images.shape[1:]}; "
                         f"info.json says {shape}")
    return images


def _check_features(root: Path, features: dict[str, Any], sources: dict[str, str],
                    wanted: list[str], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise ``ValueError`` unless ``features`` give every wanted key, in the shape asked for."""
    missing = sorted(set(wanted) - set(sources))
    if missing:
        needs = {"proprio": layout.STATE, "state": layout.ENVIRONMENT_STATE,
                 "pixels": f"{IMAGES}<camera>"}
        raise ValueError(f"{root} lacks the feature(s) {[needs.get(k, k) for k in missing]} for "
                         f"observation key(s) {missing}; it has {sorted(features)}")
    for key in wanted:
        if key not in shapes:
            continue
        shape = (MAX_TOKENS,) if key == "instruction" else tuple(features[sources[key]]["shape"])
        if shape != tuple(shapes[key]):
            raise ValueError(f"{root}: {sources[key]} ({key}) has shape {shape}; the task "
                             f"observes {tuple(shapes[key])}")


def _read_extra(root: Path) -> dict[str, Any]:
    """Our ``meta/vla_rl_harness.json``, or ``{}`` for datasets written by others."""
    path = contained(root, layout.HARNESS_PATH, "the dataset's")
    return read_json(path) if path.is_file() else {}


def _sources(root: Path, features: dict[str, Any], camera: str | None) -> dict[str, str]:
    """Observation key -> the feature it is read from, for the keys this folder can give."""
    sources = {key: name for key, name in layout.VECTOR_KEYS.items() if name in features}
    cameras = layout.camera_features(features)
    if camera is not None:
        if IMAGES + camera not in cameras:
            raise ValueError(f"{root} has no camera {camera!r}; its cameras are {cameras}")
        sources["pixels"] = IMAGES + camera
    elif len(cameras) == 1:
        sources["pixels"] = cameras[0]
    elif cameras:
        raise ValueError(f"{root} has cameras {cameras}; name the one to read as pixels")
    sources["instruction"] = "task_index"
    return sources


def _read_table(root: Path, relative: str, columns: list[str] | None = None) -> pa.Table:
    path = root / relative
    if not path.is_file():
        raise ValueError(f"{root} lacks {relative}")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise ValueError(f"{path} is not a readable parquet file: {error}") from None
    absent = sorted(set(columns or ()) - set(table.column_names))
    if absent:
        raise ValueError(f"{path} lacks the column(s) {absent}")
    return table.select(columns) if columns is not None else table


def _read_frames(root: Path, info: dict[str, Any], episodes: dict[str, np.ndarray],
                 columns: list[str]) -> pa.Table:
    """The listed episodes' frames, in episode then frame order, checked against their lengths."""
    needed = [*columns, "episode_index", "frame_index", "timestamp", "task_index"]
    files = sorted(set(zip(episodes["data/chunk_index"].tolist(),
                           episodes["data/file_index"].tolist(), strict=True)))
    table = pa.concat_tables([
        _read_table(root, info["data_path"].format(chunk_index=chunk, file_index=file), needed)
        for chunk, file in files])
    keep = np.isin(table["episode_index"].to_numpy(), episodes["episode_index"])
    table = table.filter(pa.array(keep))
    order = np.lexsort((table["frame_index"].to_numpy(), table["episode_index"].to_numpy()))
    table = table.take(pa.array(order))
    found = np.bincount(np.searchsorted(episodes["episode_index"],
                                        table["episode_index"].to_numpy()),
                        minlength=len(episodes["length"]))
    if not np.array_equal(found, episodes["length"]):
        bad = int(np.flatnonzero(found != episodes["length"])[0])
        raise ValueError(f"{root}: episode {episodes['episode_index'][bad]} has "
                         f"{found[bad]} frames in its data file; meta/episodes says "
                         f"{episodes['length'][bad]}")
    return table


def _column(column: pa.ChunkedArray) -> np.ndarray:
    """A column of fixed-length lists as an ``(N, D)`` array (``(N,)`` for plain values)."""
    array = column.combine_chunks()
    if pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type):
        return array.flatten().to_numpy(zero_copy_only=False).reshape(len(array), -1)
    return array.to_numpy(zero_copy_only=False)


def _instructions(root: Path, task_index: np.ndarray) -> np.ndarray:
    """``(N, MAX_TOKENS)`` int64 token ids of each frame's task text."""
    table = _read_table(root, layout.TASKS_PATH)
    pandas = json.loads((table.schema.metadata or {}).get(b"pandas", b"{}"))
    text_column = next((name for name in ("task", *pandas.get("index_columns", []))
                        if name in table.column_names), None)
    if text_column is None or "task_index" not in table.column_names:
        raise ValueError(f"{root / layout.TASKS_PATH} has no task text and task_index columns "
                         f"(it has {table.column_names})")
    texts = dict(zip(table["task_index"].to_pylist(), table[text_column].to_pylist(),
                     strict=True))
    tokens = {}
    for index in np.unique(task_index).tolist():
        if index not in texts:
            raise ValueError(f"{root}: frames name task_index {index}, which "
                             f"{layout.TASKS_PATH} lacks")
        try:
            tokens[index] = tokenize(texts[index])
        except ValueError as error:
            raise ValueError(f"{root}: task {texts[index]!r} cannot be an instruction: "
                             f"{error}") from None
    return np.stack([tokens[i] for i in task_index.tolist()])


def _video_frames(root: Path, info: dict[str, Any], feature: str,
                  episodes: dict[str, np.ndarray], frames: pa.Table) -> np.ndarray:
    """Each frame's image, from its episode's video at ``from_timestamp + timestamp``."""
    if not info.get("video_path"):
        raise ValueError(f"{root}: {feature} is a video, but info.json has no video_path")
    decoded: dict[tuple[int, int], np.ndarray] = {}
    timestamps = frames["timestamp"].to_numpy().astype(np.float64)
    rows = np.searchsorted(episodes["episode_index"], frames["episode_index"].to_numpy())
    images = []
    for row in np.unique(rows).tolist():
        where = (int(episodes[f"videos/{feature}/chunk_index"][row]),
                 int(episodes[f"videos/{feature}/file_index"][row]))
        relative = info["video_path"].format(video_key=feature, chunk_index=where[0],
                                             file_index=where[1])
        if where not in decoded:
            if not (root / relative).is_file():
                raise ValueError(f"{root} lacks {relative}")
            decoded[where] = decode_video(root / relative)
        start = episodes[f"videos/{feature}/from_timestamp"][row]
        positions = np.round((start + timestamps[rows == row]) * info["fps"]).astype(np.int64)
        if positions.max() >= len(decoded[where]):
            raise ValueError(f"{root / relative} has {len(decoded[where])} frames; episode "
                             f"{episodes['episode_index'][row]} needs frame {positions.max()}")
        images.append(decoded[where][positions])
    return np.concatenate(images)


def _image_frames(column: pa.ChunkedArray) -> np.ndarray:
    """Frames stored as images in the parquet file (LeRobot's ``image`` dtype: PNG bytes)."""
    images = []
    for item in column.to_pylist():
        data = item.get("bytes") if isinstance(item, dict) else None
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) if data else None
        if image is None:
            raise ValueError("an image feature holds a frame without decodable bytes")
        images.append(cv2.cvtColor(image, cv2.COLOR_BGR2RGB))
    return np.stack(images)
