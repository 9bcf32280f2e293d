"""Demonstrations of an HDF5 demo file (``harness.demos``) into a LeRobotDataset v3.0 folder.

The folder is built in a temporary sibling (``.<name>.<pid>-<hex>.tmp``) and renamed into place
at the end, so a reader, or an export killed half-way, only ever sees no folder or a complete
one; the next export removes the leftovers of killed ones.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tasks
from harness.demos import Demos, load_demos
from harness.lerobot import layout, stats, video
from harness.lerobot.layout import ACTION, DONE, ENVIRONMENT_STATE, IMAGES, REWARD, STATE
from harness_common.files import atomic_dir, sha256_of, to_json
from tasks.base import PROPRIO_DIM
from tasks.language import detokenize

OBSERVATION_KEYS: tuple[str, ...] = ("proprio", "state", "pixels", "instruction")


def export_lerobot(demos_path: str | os.PathLike, out: str | os.PathLike,
                   overwrite: bool = False, pix_fmt: str = "yuv444p") -> dict[str, Any]:
    """Write the demos of ``demos_path`` as a LeRobotDataset v3.0 folder at ``out``.

    Every episode goes into one data file and, per camera, one video, one after the other
    (``meta/episodes`` says where each starts); ``fps`` is the task's control rate. The key
    mapping is :mod:`harness.lerobot.layout`'s.

    Args:
        demos_path: An HDF5 file of ``scripts/collect_demos.py``.
        out: The dataset folder.
        overwrite: Replace ``out`` when it exists and is not empty.
        pix_fmt: Pixel format of the videos (:data:`harness.lerobot.video.PIX_FMTS`).

    Returns:
        ``{"out", "episodes", "frames", "tasks", "features", "fps"}``.

    Raises:
        FileNotFoundError: ``demos_path`` does not exist.
        FileExistsError: ``out`` exists and is not empty, without ``overwrite``.
        ValueError: ``out`` is a file, the demo file is damaged or holds an observation key
            with no LeRobot feature, the task's control rate is not a whole number of frames
            per second, or ``pix_fmt`` cannot hold the frames.
    """
    out = Path(out)
    _check_out(out, overwrite)
    demos = load_demos(demos_path)
    unknown = sorted(set(demos.obs) - set(OBSERVATION_KEYS))
    if unknown or "instruction" not in demos.obs:
        raise ValueError(f"{demos_path}: observation keys {sorted(demos.obs)}; a LeRobot export "
                         f"maps {OBSERVATION_KEYS} and needs 'instruction'")
    fps = control_fps(demos.env_args)
    camera = IMAGES + demos.env_args["env_kwargs"].get("camera", "front")
    if "pixels" in demos.obs:
        video.check_pix_fmt(pix_fmt, *demos.obs["pixels"].shape[1:3])

    texts, task_index = _tasks(demos.obs["instruction"])
    starts = np.flatnonzero(np.diff(demos.episode_ids, prepend=-1))
    columns = _frame_columns(demos, starts, task_index, fps)
    features = _features(demos, camera, pix_fmt, fps)
    bounds = list(zip(starts, [*starts[1:], len(demos)], strict=True))

    with atomic_dir(out) as root:
        if "pixels" in demos.obs:
            path = root / layout.VIDEO_PATH.format(video_key=camera, chunk_index=0,
                                                   file_index=0)
            path.parent.mkdir(parents=True)
            video.encode_video(path, demos.obs["pixels"], fps, pix_fmt)
        _write_parquet(root / layout.DATA_PATH.format(chunk_index=0, file_index=0),
                       _frames_table(columns, features))
        _write_parquet(root / layout.TASKS_PATH, _tasks_table(texts))
        _write_parquet(root / layout.EPISODES_PATH.format(chunk_index=0, file_index=0),
                       _episodes_table(demos, columns, camera, texts, task_index, bounds, fps))
        all_stats = {name: stats.vector_stats(values) for name, values in columns.items()}
        if "pixels" in demos.obs:
            all_stats[camera] = stats.image_stats(demos.obs["pixels"])
        (root / layout.STATS_PATH).write_text(
            json.dumps({name: stats.to_json(s) for name, s in all_stats.items()}, indent=4))
        (root / layout.INFO_PATH).write_text(json.dumps(
            _info(features, fps, len(bounds), len(demos), len(texts)), indent=4))
        (root / layout.HARNESS_PATH).write_text(to_json({
            "observation_keys": sorted(demos.obs),
            "env_args": demos.env_args,
            "episodes": {"seed": demos.seeds, "success": demos.successes},
            "source": {"file": Path(demos_path).name, "sha256": sha256_of(demos_path)},
            "video": {"codec": video.CODEC, "pix_fmt": pix_fmt, "crf": video.CRF,
                      "gop": video.GOP},
        }))
    return {"out": str(out), "episodes": len(bounds), "frames": len(demos),
            "tasks": texts, "features": sorted(features), "fps": fps}


def _check_out(out: Path, overwrite: bool) -> None:
    """Raise unless ``out`` can take the dataset folder (see :func:`export_lerobot`)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"out={out} is a file; a LeRobot dataset is a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"out={out} exists and is not empty; pass overwrite=true to "
                              "replace it")


def _frame_columns(demos: Demos, starts: np.ndarray, task_index: np.ndarray,
                   fps: int) -> dict[str, np.ndarray]:
    """Every per-frame column of the data file: the vectors, then LeRobot's index columns
    (``starts``: each episode's first frame)."""
    frame_index = np.arange(len(demos)) - starts[demos.episode_ids]
    return {
        **_vector_columns(demos),
        "timestamp": (frame_index / fps).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": demos.episode_ids,
        "index": np.arange(len(demos)),
        "task_index": task_index,
    }


def control_fps(env_args: dict[str, Any]) -> int:
    """Frames per second of the demos: the control rate of the task they were recorded in.

    Raises:
        ValueError: ``env_args`` lacks the task, has invalid options, or the rate is not a
            whole number (LeRobot's ``fps`` is an integer).
    """
    try:
        config = tasks.TaskConfig.from_options(env_args["env_name"], env_args["env_kwargs"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"env_args {env_args} do not name the task's options: {error}") from None
    rate = 1.0 / (config.timestep * config.substeps)
    if abs(rate - round(rate)) > 1e-6:
        raise ValueError(f"the control rate is {rate:.4f} Hz (timestep={config.timestep}, "
                         f"substeps={config.substeps}); LeRobot needs whole frames per second")
    return round(rate)


def _tasks(instructions: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Task texts in order of first appearance, and each frame's index into them."""
    texts: dict[tuple[int, ...], int] = {}
    index = np.array([texts.setdefault(tuple(row), len(texts)) for row in instructions.tolist()],
                     dtype=np.int64)
    return [detokenize(np.array(ids)) for ids in texts], index


def _vector_columns(demos: Demos) -> dict[str, np.ndarray]:
    """Observation vectors, action, reward and done, by LeRobot feature name."""
    columns = {}
    if "proprio" in demos.obs:
        columns[STATE] = demos.obs["proprio"]
    elif "state" in demos.obs:
        columns[STATE] = demos.obs["state"][:, :PROPRIO_DIM]
    if "state" in demos.obs:
        columns[ENVIRONMENT_STATE] = demos.obs["state"]
    return {**columns, ACTION: demos.actions, REWARD: demos.rewards, DONE: demos.dones}


def _features(demos: Demos, camera: str, pix_fmt: str, fps: int) -> dict[str, dict[str, Any]]:
    features = {}
    if STATE in _vector_columns(demos):
        features[STATE] = layout.vector_feature(layout.PROPRIO_NAMES)
    if "state" in demos.obs:
        extra = demos.obs["state"].shape[1] - PROPRIO_DIM
        features[ENVIRONMENT_STATE] = layout.vector_feature(
            [*layout.PROPRIO_NAMES, *(f"task_{i}" for i in range(extra))])
    if "pixels" in demos.obs:
        height, width, channels = demos.obs["pixels"].shape[1:]
        features[camera] = {
            "dtype": "video", "shape": [height, width, channels],
            "names": ["height", "width", "channels"],
            "info": {"video.height": height, "video.width": width,
                     "video.codec": video.CODEC_NAME, "video.pix_fmt": pix_fmt,
                     "video.is_depth_map": False, "video.fps": fps,
                     "video.channels": channels, "has_audio": False},
        }
    features[ACTION] = layout.vector_feature(layout.ACTION_NAMES)
    features[REWARD] = layout.scalar_feature("float32")
    features[DONE] = layout.scalar_feature("bool")
    features.update({name: layout.scalar_feature(dtype)
                     for name, dtype in layout.INDEX_FEATURES.items()})
    return features


def _info(features: dict[str, Any], fps: int, episodes: int, frames: int,
          num_tasks: int) -> dict[str, Any]:
    has_video = any(ft["dtype"] == "video" for ft in features.values())
    return {
        "codebase_version": layout.CODEBASE_VERSION,
        "robot_type": layout.ROBOT_TYPE,
        "total_episodes": episodes,
        "total_frames": frames,
        "total_tasks": num_tasks,
        "chunks_size": layout.CHUNKS_SIZE,
        "data_files_size_in_mb": layout.DATA_FILES_SIZE_IN_MB,
        "video_files_size_in_mb": layout.VIDEO_FILES_SIZE_IN_MB,
        "fps": fps,
        "splits": {"train": f"0:{episodes}"},
        "data_path": layout.DATA_PATH,
        "video_path": layout.VIDEO_PATH if has_video else None,
        "features": features,
    }


def _frames_table(columns: dict[str, np.ndarray], features: dict[str, Any]) -> pa.Table:
    """One row per frame, typed as Hugging Face ``datasets`` types LeRobot's features."""
    arrays = []
    for name, values in columns.items():
        values = np.asarray(values, dtype=features[name]["dtype"])
        if layout.is_scalar(features[name]):
            arrays.append(pa.array(values.reshape(-1), type=layout.arrow_type(features[name])))
        else:
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)),
                                                           values.shape[1]))
    hf = {"info": {"features": {name: layout.hf_feature(features[name]) for name in columns}}}
    schema = pa.schema([pa.field(name, array.type) for name, array in zip(columns, arrays,
                                                                          strict=True)],
                       metadata={"huggingface": json.dumps(hf)})
    return pa.Table.from_arrays(arrays, schema=schema)


def _tasks_table(texts: list[str]) -> pa.Table:
    """``task_index`` with the task text as the pandas index, as LeRobot's ``pandas`` writes it
    (its loader looks tasks up by index)."""
    pandas = {
        "index_columns": ["task"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode",
                            "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
             "numpy_type": "int64", "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode",
             "numpy_type": "object", "metadata": None},
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
    }
    schema = pa.schema([("task_index", pa.int64()), ("task", pa.string())],
                       metadata={"pandas": json.dumps(pandas)})
    return pa.table({"task_index": np.arange(len(texts)), "task": texts}, schema=schema)


def _episodes_table(demos: Demos, columns: dict[str, np.ndarray], camera: str,
                    texts: list[str], task_index: np.ndarray,
                    bounds: list[tuple[int, int]], fps: int) -> pa.Table:
    """One row per episode: its tasks, length, rows, stretch of video and statistics."""
    rows: dict[str, list] = {"episode_index": [], "tasks": [], "length": [],
                             "data/chunk_index": [], "data/file_index": [],
                             "dataset_from_index": [], "dataset_to_index": []}
    for episode, (start, stop) in enumerate(bounds):
        for key, value in (("episode_index", episode), ("length", stop - start),
                           ("data/chunk_index", 0), ("data/file_index", 0),
                           ("dataset_from_index", start), ("dataset_to_index", stop)):
            rows[key].append(int(value))
        rows["tasks"].append([texts[i] for i in dict.fromkeys(task_index[start:stop].tolist())])
        if "pixels" in demos.obs:
            for key, value in (("chunk_index", 0), ("file_index", 0),
                               ("from_timestamp", start / fps), ("to_timestamp", stop / fps)):
                rows.setdefault(f"videos/{camera}/{key}", []).append(value)
        episode_stats = {name: stats.vector_stats(values[start:stop])
                         for name, values in columns.items()}
        if "pixels" in demos.obs:
            episode_stats[camera] = stats.image_stats(demos.obs["pixels"][start:stop])
        for name, feature_stats in episode_stats.items():
            for key, value in stats.to_json(feature_stats).items():
                rows.setdefault(f"stats/{name}/{key}", []).append(value)
    rows["meta/episodes/chunk_index"] = [0] * len(bounds)
    rows["meta/episodes/file_index"] = [0] * len(bounds)
    return pa.table(rows)


def _write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="snappy")


