"""The LeRobotDataset v3.0 layout: its paths, its features, and how our observation keys map to
them.

A dataset folder::

    meta/info.json                              codebase_version "v3.0", fps, features, totals,
                                                path templates, chunk and file size limits
    meta/stats.json                             per feature: min, max, mean, std, count, q01 ... q99
    meta/tasks.parquet                          task text (the pandas index) -> task_index
    meta/episodes/chunk-000/file-000.parquet    one row per episode: its frames' rows, its stretch
                                                of each camera's video, its statistics
    data/chunk-000/file-000.parquet             one row per frame: vectors, indices, timestamp
    videos/<camera feature>/chunk-000/file-000.mp4   the frames of every episode, one after another
    meta/vla_rl_harness.json                    ours, ignored by LeRobot: env_args, seeds, successes

Our keys and LeRobot's features (LeRobot's names: ``observation.state`` is the robot's own state,
``observation.environment_state`` what it senses of the world):

==============  ==================================  ============================================
ours            LeRobot feature                     content
==============  ==================================  ============================================
``proprio``     ``observation.state``               (8,) float32: end effector position and
                                                    velocity, finger opening, gripper command
``state``       ``observation.environment_state``   (8 + task,) float32: the above, then the
                                                    task's object poses and goal
``pixels``      ``observation.images.<camera>``     (H, W, 3) video
``instruction`` ``task`` (``meta/tasks.parquet``)   text; token ids rebuilt by
                                                    ``tasks.language.tokenize``
actions         ``action``                          (4,) float32: dx, dy, dz, gripper
rewards         ``next.reward``                     float32, the reward the action earned
dones           ``next.done``                       bool, true on each episode's last frame
==============  ==================================  ============================================

In ``state`` mode, where the demos have no ``proprio``, ``observation.state`` is the proprio part
of ``state`` (its first 8 values), so LeRobot policies find the robot's state where they look.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000  # files per chunk folder, LeRobot's default
DATA_FILES_SIZE_IN_MB = 100  # LeRobot's limits per file; the writer keeps one file of each
VIDEO_FILES_SIZE_IN_MB = 200

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
HARNESS_PATH = "meta/vla_rl_harness.json"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"

ROBOT_TYPE = "floating_gripper"  # a parallel-jaw gripper on a mocap target (tasks/scene.py)
STATE = "observation.state"
ENVIRONMENT_STATE = "observation.environment_state"
IMAGES = "observation.images."  # + camera name
ACTION = "action"
REWARD = "next.reward"
DONE = "next.done"
# Every LeRobot frame carries these, in this order, after the dataset's own features.
INDEX_FEATURES: dict[str, str] = {
    "timestamp": "float32",
    "frame_index": "int64",
    "episode_index": "int64",
    "index": "int64",
    "task_index": "int64",
}
VECTOR_KEYS: dict[str, str] = {"proprio": STATE, "state": ENVIRONMENT_STATE}

PROPRIO_NAMES: tuple[str, ...] = ("ee_x", "ee_y", "ee_z", "ee_vx", "ee_vy", "ee_vz",
                                  "finger_opening", "gripper_command")
ACTION_NAMES: tuple[str, ...] = ("dx", "dy", "dz", "gripper")
QUANTILES: tuple[float, ...] = (0.01, 0.10, 0.50, 0.90, 0.99)


def vector_feature(names: list[str] | tuple[str, ...], dtype: str = "float32") -> dict[str, Any]:
    """The ``info.json`` entry of a 1-D feature whose entries are ``names``."""
    return {"dtype": dtype, "shape": [len(names)], "names": list(names)}


def scalar_feature(dtype: str) -> dict[str, Any]:
    """The ``info.json`` entry of a one-value feature (LeRobot's shape ``[1]``)."""
    return {"dtype": dtype, "shape": [1], "names": None}


def is_scalar(feature: dict[str, Any]) -> bool:
    return list(feature["shape"]) == [1]


def arrow_type(feature: dict[str, Any]) -> pa.DataType:
    """The column type of a 1-D or one-value feature in the frames' parquet files, as
    Hugging Face ``datasets`` writes it: a value, or a fixed-size list of values."""
    value = pa.from_numpy_dtype(np.dtype(feature["dtype"]))
    return value if is_scalar(feature) else pa.list_(value, int(feature["shape"][0]))


def hf_feature(feature: dict[str, Any]) -> dict[str, Any]:
    """The feature's entry in the ``huggingface`` schema metadata of a parquet file (``Value``,
    or a fixed-length ``List`` of them), so ``datasets`` reads the columns as LeRobot typed them."""
    value = {"dtype": feature["dtype"], "_type": "Value"}
    if is_scalar(feature):
        return value
    return {"feature": value, "length": int(feature["shape"][0]), "_type": "List"}


def camera_features(features: dict[str, dict[str, Any]]) -> list[str]:
    """Names of the camera features (stored as ``video`` or as ``image``)."""
    return [name for name, ft in features.items() if ft.get("dtype") in ("video", "image")]
