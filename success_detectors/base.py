"""The success-detector interface: a batch in, success probabilities and verdicts out.

A *batch* is a dict. Image detectors read ``batch["pixels"]``, a ``uint8`` array of shape
``(N, H, W, 3)`` (RGB, channel-last, as the environments render them); simulator detectors read
``batch["env"]``, a sequence of ``N`` task environments (wrappers are looked through). A batch may
carry both, so one batch serves every detector.
"""

from __future__ import annotations

from collections.abc import Mapping
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
