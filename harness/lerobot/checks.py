"""Checks of a LeRobotDataset v3.0 folder before anything trains on it (:func:`validate_dataset`).

A dataset is input from outside: every path it names must resolve inside its folder (no
absolute templates, no ``..``, no symlink leading out), its path templates may hold only
LeRobot's fields with modest widths, its features must be well formed, and every column of
every data file must have the shape ``meta/info.json`` gives it, no nulls and finite values,
actions within our tasks' action bounds and vectors within the ``min``/``max`` that
``meta/stats.json`` declares. Each error names the file and the field.
"""

from __future__ import annotations

import json
import math
import os
import re
import string
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.demos import ACTION_DIM
from harness.lerobot import layout
from harness.lerobot.layout import ACTION

REQUIRED_INFO: tuple[str, ...] = ("fps", "features", "data_path", "total_episodes",
                                  "total_frames")
# The fields LeRobot's templates fill, and a format spec of at most MAX_WIDTH digits: a
# template such as {chunk_index:300000000d} would build a path of that many characters.
TEMPLATE_FIELDS: dict[str, tuple[str, ...]] = {
    "data_path": ("chunk_index", "file_index"),
    "video_path": ("video_key", "chunk_index", "file_index"),
}
MAX_WIDTH = 20
INDEX_SPEC = re.compile(r"0?(\d{1,2})?d?")
NUMERIC_DTYPES: tuple[str, ...] = ("bool", "int8", "int16", "int32", "int64", "uint8",
                                   "uint16", "uint32", "uint64", "float16", "float32",
                                   "float64")
CAMERA_DTYPES: tuple[str, ...] = ("video", "image")
FEATURE_DTYPES: tuple[str, ...] = (*NUMERIC_DTYPES, *CAMERA_DTYPES, "string")
MAX_FEATURE_SIDE = 4096  # entries along one axis of a feature (a 4096-pixel-wide frame)
MAX_FPS = 1000
FRAME_COLUMNS: tuple[str, ...] = ("episode_index", "frame_index", "timestamp", "task_index")
EPISODE_COLUMNS: tuple[str, ...] = ("episode_index", "length", "data/chunk_index",
                                    "data/file_index")
ACTION_BOUND = 1.0  # our tasks' actions are Box(-1, 1, (4,))


def contained(root: Path, relative: str, what: str) -> Path:
    """``root / relative``, refused unless it resolves inside ``root``.

    Args:
        root: The dataset folder.
        relative: A path relative to it, as the dataset names it.
        what: What names the path (``meta/info.json data_path``), for the message.

    Returns:
        The path (not resolved: a symlink inside the folder stays one).

    Raises:
        ValueError: ``relative`` is absolute, holds ``..``, or leads out through a symlink.
    """
    parts = PurePosixPath(relative.replace("\\", "/")).parts
    if os.path.isabs(relative) or relative.startswith(("/", "\\")) or ".." in parts:
        raise ValueError(f"{root}: {what} names {relative!r}; a dataset's paths are relative "
                         "to its folder, without '..'")
    path = root / relative
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ValueError(f"{root}: {what} {relative!r} leads outside the dataset folder "
                         f"(to {resolved}); a symlink out of the folder is not followed")
    return path


def read_info(root: str | os.PathLike) -> dict[str, Any]:
    """The ``meta/info.json`` of a LeRobot dataset folder, checked to be of v3.0.

    Args:
        root: The dataset folder.

    Returns:
        The parsed ``info.json``.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: No readable ``meta/info.json`` inside the folder, another
            ``codebase_version`` than v3.0, or a key LeRobot needs is missing.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no LeRobot dataset folder at {root}")
    path = contained(root, layout.INFO_PATH, "the dataset's")
    if not path.is_file():
        raise ValueError(f"{root} is not a LeRobot dataset: it has no {layout.INFO_PATH}")
    info = read_json(path)
    version = info.get("codebase_version") if isinstance(info, dict) else None
    if version != layout.CODEBASE_VERSION:
        raise ValueError(
            f"{root} is a LeRobot dataset of codebase_version={version!r}; only "
            f"{layout.CODEBASE_VERSION!r} is read (LeRobot's convert_dataset_v21_to_v30 "
            "converts v2.1 folders)")
    missing = [key for key in REQUIRED_INFO if key not in info]
    if missing:
        raise ValueError(f"{path} lacks {missing}")
    return info


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or ``ValueError`` naming the file."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path} is not readable JSON: {error}") from None


def validate_dataset(root: str | os.PathLike) -> dict[str, Any]:
    """Check a whole LeRobotDataset v3.0 folder, every data file read, before training on it.

    Args:
        root: The dataset folder.

    Returns:
        Its ``meta/info.json``, checked.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: Naming the file and the field: a path leaving the folder, a bad template,
            a malformed feature, a missing file or column, a column of another shape than
            ``info.json`` gives, nulls, non-finite values, actions outside [-1, 1], values
            outside ``stats.json``'s bounds, or frames that disagree with the episode table.
    """
    root = Path(root)
    info = read_info(root)
    where = root / layout.INFO_PATH
    check_info(where, info)
    episodes = read_episodes(root, info)
    read_table(root, contained(root, layout.TASKS_PATH, "the dataset's"), ("task_index",))
    extra = contained(root, layout.HARNESS_PATH, "the dataset's")
    if extra.is_file() and not isinstance(read_json(extra), dict):
        raise ValueError(f"{extra} holds no JSON object")
    bounds = declared_bounds(root, info["features"])
    found: dict[int, int] = {}
    files = sorted(set(zip(episodes["data/chunk_index"].tolist(),
                           episodes["data/file_index"].tolist(), strict=True)))
    for chunk, file in files:
        relative = info["data_path"].format(chunk_index=chunk, file_index=file)
        table = read_table(root, contained(root, relative, f"{where} data_path"))
        _check_frames(root / relative, table, info["features"], bounds, found)
    for index, length in zip(episodes["episode_index"].tolist(), episodes["length"].tolist(),
                             strict=True):
        if found.get(index, 0) != length:
            raise ValueError(f"{root}: episode {index} has {found.get(index, 0)} frames in its "
                             f"data files; meta/episodes says length={length}")
    for feature in [n for n, ft in info["features"].items() if ft["dtype"] == "video"]:
        _check_videos(root, info, feature, episodes)
    return info


def check_info(path: Path, info: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the field of ``info.json`` (at ``path``) that is malformed:
    totals, fps, path templates and features."""
    for key in ("total_episodes", "total_frames"):
        value = info[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{path}: {key}={value!r}; expected a count >= 0")
    fps = info["fps"]
    if (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps)
            or not 0 < fps <= MAX_FPS):
        raise ValueError(f"{path}: fps={fps!r}; expected a number in (0, {MAX_FPS}]")
    check_template(path, "data_path", info["data_path"])
    if info.get("video_path") is not None:
        check_template(path, "video_path", info["video_path"])
    features = info["features"]
    if not isinstance(features, dict) or not features:
        raise ValueError(f"{path}: features={features!r}; expected a mapping of feature name "
                         "to {dtype, shape, names}")
    for name, feature in features.items():
        check_feature(path, name, feature)
    action = features.get(ACTION)
    if action is None or list(action["shape"]) != [ACTION_DIM]:
        raise ValueError(f"{path}: feature {ACTION!r} is {action}; our tasks take "
                         f"{ACTION_DIM} values (dx, dy, dz, gripper)")
    if any(ft["dtype"] == "video" for ft in features.values()) and not info.get("video_path"):
        raise ValueError(f"{path}: a feature is a video, but video_path="
                         f"{info.get('video_path')!r}")


def check_template(path: Path, key: str, template: Any) -> None:
    """Raise ``ValueError`` unless ``template`` (``info.json``'s ``key``) is a relative path
    whose fields are LeRobot's (:data:`TEMPLATE_FIELDS`) with integer widths of at most
    :data:`MAX_WIDTH`."""
    if not isinstance(template, str) or not template:
        raise ValueError(f"{path}: {key}={template!r}; expected a path template such as "
                         f"{layout.DATA_PATH!r}")
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(f"{path}: {key}={template!r} is not a format template: {error}") from None
    allowed = TEMPLATE_FIELDS[key]
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in allowed or conversion is not None:
            raise ValueError(f"{path}: {key}={template!r} has the field {{{name}}}; expected "
                             f"only {list(allowed)}, without conversions")
        match = INDEX_SPEC.fullmatch(spec or "") if name != "video_key" else None
        width = int(match.group(1) or 0) if match else None
        if (spec and name == "video_key") or (name != "video_key" and width is None) or (
                width is not None and width > MAX_WIDTH):
            raise ValueError(f"{path}: {key}={template!r} formats {{{name}}} as {spec!r}; "
                             f"expected an integer format of width <= {MAX_WIDTH} such as '03d'")
    contained(path.parent.parent, template.replace("{", "").replace("}", ""), f"{path} {key}")


def check_feature(path: Path, name: Any, feature: Any) -> None:
    """Raise ``ValueError`` unless ``feature`` is ``{dtype, shape, ...}`` with a known dtype and
    a shape of 1 to 3 positive sides (3 for a camera: height, width, channels)."""
    if not isinstance(name, str) or not isinstance(feature, dict):
        raise ValueError(f"{path}: features[{name!r}]={feature!r}; expected a mapping with "
                         "dtype and shape")
    dtype, shape = feature.get("dtype"), feature.get("shape")
    if dtype not in FEATURE_DTYPES:
        raise ValueError(f"{path}: features[{name!r}].dtype={dtype!r}; expected one of "
                         f"{FEATURE_DTYPES}")
    sides = 3 if dtype in CAMERA_DTYPES else None
    if (not isinstance(shape, list) or not 1 <= len(shape) <= 3
            or (sides is not None and len(shape) != sides)
            or not all(isinstance(s, int) and not isinstance(s, bool)
                       and 1 <= s <= MAX_FEATURE_SIDE for s in shape)):
        raise ValueError(f"{path}: features[{name!r}].shape={shape!r}; expected a list of "
                         f"{sides or '1 to 3'} integer sides in [1, {MAX_FEATURE_SIDE}]")


def read_table(root: Path, path: Path, columns: tuple[str, ...] = ()) -> pa.Table:
    """A parquet file of the dataset with ``columns`` present; ``ValueError`` naming it."""
    if not path.is_file():
        raise ValueError(f"{root} lacks {path.relative_to(root)}")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise ValueError(f"{path} is not a readable parquet file: {error}") from None
    absent = sorted(set(columns) - set(table.column_names))
    if absent:
        raise ValueError(f"{path} lacks the column(s) {absent}")
    return table


def read_episodes(root: Path, info: dict[str, Any]) -> dict[str, np.ndarray]:
    """The episode table's columns (with where each video feature's frames are), each file
    checked: integer indices without nulls, lengths >= 1, unique episodes; sorted by
    ``episode_index``.

    Raises:
        ValueError: Naming the file and the column.
    """
    videos = [name for name, ft in info["features"].items() if ft["dtype"] == "video"]
    columns = [*EPISODE_COLUMNS, *(f"videos/{video}/{key}" for video in videos
                                   for key in ("chunk_index", "file_index", "from_timestamp"))]
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise ValueError(f"{root} lacks {layout.EPISODES_PATH.format(chunk_index=0, file_index=0)}"
                         " (no episode table)")
    tables = []
    for file in files:
        path = contained(root, str(file.relative_to(root)), "the episode table")
        table = read_table(root, path, tuple(columns)).select(columns)
        for name in columns:
            expected = "numbers" if name.endswith("from_timestamp") else "integers"
            values = numeric_column(path, name, table[name], [1])[:, 0]
            low = 1 if name == "length" else 0
            if values.dtype.kind not in ("f" if expected == "numbers" else "iu") or (
                    values < low).any():
                raise ValueError(f"{path}: column {name!r} holds {values.dtype} values down to "
                                 f"{values.min()}; expected {expected} >= {low}")
        tables.append(table)
    try:
        table = pa.concat_tables(tables)
    except pa.ArrowException as error:
        raise ValueError(f"{root}: the episode table's files disagree: {error}") from None
    episodes = {name: table[name].to_numpy() for name in columns}
    if not len(episodes["episode_index"]):
        raise ValueError(f"{root} holds no episodes")
    unique, counts = np.unique(episodes["episode_index"], return_counts=True)
    if len(unique) < len(counts) or (counts > 1).any():
        raise ValueError(f"{root}: the episode table lists episode "
                         f"{int(unique[counts > 1][0])} more than once")
    order = np.argsort(episodes["episode_index"], kind="stable")
    return {name: values[order] for name, values in episodes.items()}


def numeric_column(path: Path, name: str, column: pa.ChunkedArray,
                   shape: list[int]) -> np.ndarray:
    """A column of numbers as ``(N, prod(shape))``, checked against the feature's shape: every
    row a (nested) list of exactly ``shape`` values (a value for shape ``[1]``), no nulls, no
    NaN or infinity.

    Raises:
        ValueError: Naming the file, the column and the first bad row.
    """
    array = column.combine_chunks()
    nested = pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type) or \
        pa.types.is_large_list(array.type)
    for size in shape if nested or list(shape) != [1] else []:
        if not (pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type)
                or pa.types.is_large_list(array.type)) or array.null_count:
            raise ValueError(f"{path}: column {name!r} holds {array.type} with "
                             f"{array.null_count} nulls; meta/info.json gives the shape {shape}")
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
        if (lengths != size).any():
            row = int(np.flatnonzero(lengths != size)[0])
            raise ValueError(f"{path}: column {name!r} has a row of {lengths[row]} values "
                             f"(row {row}); meta/info.json gives the shape {shape}")
        array = array.flatten()
    kind = array.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
            or pa.types.is_boolean(kind)) or array.null_count:
        raise ValueError(f"{path}: column {name!r} holds {kind} with {array.null_count} nulls; "
                         f"expected numbers of shape {shape}")
    values = array.to_numpy(zero_copy_only=False).reshape(len(column), -1)
    finite = np.isfinite(values).all(axis=1) if values.dtype.kind == "f" else None
    if finite is not None and not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"{path}: column {name!r} holds non-finite values "
                         f"({values[row].tolist()} in row {row}); expected finite numbers")
    return values


def declared_bounds(root: Path, features: dict[str, Any]) -> dict[str, tuple[np.ndarray,
                                                                              np.ndarray]]:
    """Feature -> the ``(min, max)`` that ``meta/stats.json`` declares, for the float features
    it lists (none when the file is absent); the action also within our tasks' [-1, 1].

    Raises:
        ValueError: A ``stats.json`` outside the folder, unreadable, or whose ``min``/``max``
            of a feature are not finite numbers of the feature's size.
    """
    bounds = {ACTION: (np.full(ACTION_DIM, -ACTION_BOUND), np.full(ACTION_DIM, ACTION_BOUND))}
    path = contained(root, layout.STATS_PATH, "the dataset's")
    if not path.is_file():
        return bounds
    stats = read_json(path)
    if not isinstance(stats, dict):
        raise ValueError(f"{path} holds {type(stats).__name__}; expected feature -> statistics")
    for name, feature in features.items():
        entry = stats.get(name)
        if not feature["dtype"].startswith("float") or not isinstance(entry, dict):
            continue
        size = int(np.prod(feature["shape"]))
        try:
            low, high = (np.asarray(entry[key], dtype=np.float64).reshape(size)
                         for key in ("min", "max"))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: {name}.min and .max must be {size} numbers each") from None
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(f"{path}: {name}.min/.max are not finite")
        if name in bounds:
            low, high = np.maximum(low, bounds[name][0]), np.minimum(high, bounds[name][1])
        bounds[name] = (low, high)
    return bounds


def _check_frames(path: Path, table: pa.Table, features: dict[str, Any],
                  bounds: dict[str, tuple[np.ndarray, np.ndarray]],
                  found: dict[int, int]) -> None:
    """Check one data file's columns against the features and bounds; count its frames per
    episode into ``found``."""
    names = [name for name, ft in features.items() if ft["dtype"] != "video"]
    absent = sorted(set([*names, *FRAME_COLUMNS]) - set(table.column_names))
    if absent:
        raise ValueError(f"{path} lacks the column(s) {absent} (meta/info.json's features and "
                         "LeRobot's index columns)")
    numeric = [n for n in names if features[n]["dtype"] in NUMERIC_DTYPES]
    for name in dict.fromkeys([*numeric, *FRAME_COLUMNS]):
        shape = features[name]["shape"] if name in features else [1]
        values = numeric_column(path, name, table[name], shape)
        if name in FRAME_COLUMNS and (values.dtype.kind not in ("f" if name == "timestamp"
                                                                 else "iu")
                                      or (values < 0).any()):
            raise ValueError(f"{path}: column {name!r} holds {values.dtype} values down to "
                             f"{values.min()}; expected a non-negative index or time")
        if name in bounds:
            _check_bounds(path, name, values, *bounds[name])
    episode_ids, counts = np.unique(table["episode_index"].to_numpy(), return_counts=True)
    for index, count in zip(episode_ids.tolist(), counts.tolist(), strict=True):
        found[index] = found.get(index, 0) + count


def _check_bounds(path: Path, name: str, values: np.ndarray, low: np.ndarray,
                  high: np.ndarray) -> None:
    """Raise ``ValueError`` naming the first row of ``values`` outside ``[low, high]``."""
    slack = 1e-6 * np.maximum(1.0, np.maximum(np.abs(low), np.abs(high)))
    outside = ((values < low - slack) | (values > high + slack)).any(axis=1)
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        source = "our tasks' action bounds" if name == ACTION else layout.STATS_PATH
        raise ValueError(f"{path}: column {name!r} row {row} is {values[row].tolist()}, outside "
                         f"[{low.tolist()}, {high.tolist()}] ({source})")


def _check_videos(root: Path, info: dict[str, Any], feature: str,
                  episodes: dict[str, np.ndarray]) -> None:
    """Raise ``ValueError`` unless every video file of ``feature`` is a file in the folder."""
    files = sorted(set(zip(episodes[f"videos/{feature}/chunk_index"].tolist(),
                           episodes[f"videos/{feature}/file_index"].tolist(), strict=True)))
    for chunk, file in files:
        relative = info["video_path"].format(video_key=feature, chunk_index=chunk,
                                             file_index=file)
        if not contained(root, relative, f"{root / layout.INFO_PATH} video_path").is_file():
            raise ValueError(f"{root} lacks {relative}")
