"""The success-detector interface: a batch in, success probabilities and verdicts out.

A *batch* is a dict. Image detectors read ``batch["pixels"]``, a ``uint8`` array of shape
``(N, H, W, 3)`` (RGB, channel-last, as the environments render them); simulator detectors read
``batch["env"]``, a sequence of ``N`` task environments (wrappers are looked through). A batch may
carry both, so one batch serves every detector.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

import tasks
from tasks.rendering import check_camera_name


def check_names(task: str, camera: str, source: str = "the configuration") -> None:
    """Refuse a task that is not registered, or a camera name that is not ``view[+view...]``
    of plain names (:func:`tasks.rendering.check_camera_name`): they become file names, so they
    are checked wherever they were read from.

    Raises:
        ValueError: Naming the value and where it was read.
    """
    if task not in tasks.TASKS:
        raise ValueError(f"task={task!r} (from {source}) is not a task; choose one of "
                         f"{sorted(tasks.TASKS)}")
    try:
        check_camera_name(camera)
    except ValueError as error:
        raise ValueError(f"{error} (from {source})") from None


MOUNT_FIELDS = ("camera", "body", "pos", "quat", "fovy")
MOUNT_TOLERANCE = 1e-5  # the mounts are rounded to 6 decimals (fovy to 4) when recorded


def mount_differences(recorded: Sequence[Mapping[str, Any]],
                      expected: Sequence[Mapping[str, Any]]) -> list[str]:
    """How camera mounts (``TaskEnv.camera_mounts``, one record per view) differ.

    Numbers agree within :data:`MOUNT_TOLERANCE` (so ``-0.0`` equals ``0.0``); names exactly.

    Returns:
        One ``"view 'wrist': fovy 75.0 recorded, 80.0 expected"`` line per differing field of a
        view, or for a differing number of views; empty when they agree.
    """
    if len(recorded) != len(expected):
        return [f"{len(recorded)} view(s) recorded ({[m.get('camera') for m in recorded]}), "
                f"{len(expected)} expected ({[m.get('camera') for m in expected]})"]
    differences = []
    for was, now in zip(recorded, expected, strict=True):
        for key in MOUNT_FIELDS:
            if not _same(was.get(key), now.get(key)):
                differences.append(f"view {now.get('camera')!r}: {key} {_shown(was.get(key))!r} "
                                   f"recorded, {_shown(now.get(key))!r} expected")
    return differences


def check_recorded_mounts(recorded: Sequence[Mapping[str, Any]] | None,
                          expected: Sequence[Mapping[str, Any]], *, source: str,
                          expected_from: str, fix: str) -> None:
    """Refuse frames, or a detector trained on frames, of cameras mounted elsewhere than where
    they are now: its verdicts would be silently misread.

    Args:
        recorded: The mounts ``source`` records; ``None`` when it predates their recording.
        expected: The mounts to match, e.g. ``env.unwrapped.camera_mounts(camera)``.
        source: What recorded them, for the messages (``"detector checkpoint x.pt"``).
        expected_from: Where ``expected`` comes from (``"this env"``).
        fix: What to do about a mismatch (``"retrain the detector on frames of this camera"``).

    Raises:
        ValueError: The mounts differ; names each view, field and both values.

    Warns:
        UserWarning: ``recorded`` is ``None``: the mounts cannot be checked.
    """
    if recorded is None:
        warnings.warn(f"{source} records no camera mounts (it was made before they were "
                      f"recorded), so they cannot be checked against {expected_from}; if its "
                      f"cameras have moved since, {fix}", stacklevel=3)
        return
    differences = mount_differences(recorded, expected)
    if differences:
        raise ValueError(f"{source} was made with cameras mounted elsewhere than in "
                         f"{expected_from} ({'; '.join(differences)}); {fix}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
            and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=0.0, abs_tol=MOUNT_TOLERANCE)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _shown(value: Any) -> Any:
    """``value`` for a message: ``-0.0`` as ``0.0``, lists as lists."""
    if isinstance(value, float):
        return value + 0.0
    if isinstance(value, (list, tuple)):
        return [_shown(v) for v in value]
    return value


class SuccessDetector:
    """Maps a batch to success probabilities (``predict_proba``) and booleans (``__call__``).

    Subclasses implement :meth:`predict_proba` and list the batch keys they read in ``requires``.

    Attributes:
        requires: Batch keys the detector reads, e.g. ``("pixels",)`` or ``("env",)``.
        threshold: A probability at or above it counts as success.
        task: The task the detector was made for, or ``None`` when it serves every task.
        camera: The camera whose frames it reads, or ``None`` when it reads no images.
        image_size: Side of the square frames it reads, or ``None``.
    """

    requires: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        threshold: float = 0.5,
        task: str | None = None,
        camera: str | None = None,
        image_size: int | None = None,
    ) -> None:
        self.threshold = check_threshold(threshold)
        self.task = task
        self.camera = camera
        self.image_size = image_size

    def predict_proba(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Success probabilities, ``float64`` of shape ``(N,)``."""
        raise NotImplementedError

    def __call__(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Success verdicts, ``bool`` of shape ``(N,)``: probability ``>= threshold``."""
        return self.predict_proba(batch) >= self.threshold

    def check_camera_mounts(self, mounts: Sequence[Mapping[str, Any]]) -> None:
        """Refuse frames of cameras mounted elsewhere than on the frames the detector learnt
        from. This one records no mounts and accepts any; learned detectors override it.

        Args:
            mounts: Where the env mounts the detector's camera
                (``env.unwrapped.camera_mounts(detector.camera)``).
        """

    def _require(self, batch: Mapping[str, Any]) -> None:
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"a detector batch is a dict with keys {list(self.requires)}; got "
                f"{type(batch).__name__}"
            )
        missing = [key for key in self.requires if key not in batch]
        if missing:
            raise ValueError(
                f"{type(self).__name__} needs batch key(s) {missing}; the batch has {sorted(batch)}"
            )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(task={self.task!r}, camera={self.camera!r}, "
            f"threshold={self.threshold:.3f})"
        )


def check_threshold(value: Any) -> float:
    """Validate a probability threshold in [0, 1]."""
    try:
        threshold = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"threshold={value!r}; expected a probability in [0, 1]") from None
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold={value!r}; expected a probability in [0, 1]")
    return threshold
