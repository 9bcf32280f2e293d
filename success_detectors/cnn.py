"""The CNN success detector: a learned classifier on camera frames, and its checkpoints.

**Task conditioning: one model per task.** A checkpoint is trained on, and only accepted for, one
task and one camera; the model reads pixels only. This keeps the classifier small (about 40k
parameters, several thousand 84x84 frames/s on one core) and lets each task's detector be trained,
audited and replaced on its own. The price: where the image alone cannot tell the target from a
distractor (``push`` names its cube in the instruction), a distractor pushed onto the target looks
like success; the scripted data of ``scripts/collect_detector_data.py`` labels such frames negative,
so the test metrics count these errors. The network itself is :mod:`success_detectors.network`.

**Checkpoint** (``torch.save`` of plain values, loaded with ``weights_only=True``): ``format``,
``version``, ``task``, ``camera``, ``image_size``, ``threshold``, ``normalisation`` (per-channel
``mean`` and ``std`` in 0..255 units), ``architecture``, ``state_dict``, ``training`` (a summary
of how it was trained) and, when the training data recorded them, ``camera_mounts`` (where each
view's camera was mounted on the frames it learnt from: a list of ``{"camera", "body", "pos",
"quat", "fovy"}``, :meth:`tasks.rendering.Cameras.mounts`; absent in older checkpoints). It is
written to a temporary file and renamed over the target, so a crash never leaves a partial
checkpoint where a good one was.

**Camera mounts.** A detector reads frames of one camera mount: moved, the same camera name shows
another image. :meth:`CNNDetector.check_camera_mounts` refuses an env that mounts the camera
elsewhere than the checkpoint records, and warns when the checkpoint records no mounts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from harness_common.files import atomic_path
from success_detectors.base import SuccessDetector, check_recorded_mounts, check_threshold
from success_detectors.network import Architecture, SpatialSoftmax, SuccessCNN, predict_pixels

__all__ = [  # the detector, its checkpoints, and the network's names this module re-exports
    "CHECKPOINT_FORMAT", "CHECKPOINT_KEYS", "CHECKPOINT_VERSION", "Architecture", "CNNDetector",
    "SpatialSoftmax", "SuccessCNN", "check_pixels", "load_detector", "predict_pixels",
    "save_checkpoint", "write_atomically",
]

CHECKPOINT_FORMAT = "success_detectors.cnn"
CHECKPOINT_VERSION = 1
CHECKPOINT_KEYS = (
    "format", "version", "task", "camera", "image_size", "threshold", "normalisation",
    "architecture", "state_dict",
)


def check_pixels(pixels: Any, image_size: int | None = None, views: int = 1) -> np.ndarray:
    """Validate a batch of frames and return it as a ``uint8 (N, H, W, 3)`` array.

    Args:
        pixels: The frames (numpy array or torch tensor).
        image_size: The side the detector expects, or ``None`` to accept any square size.
        views: Square views side by side in each frame: the width must be ``views`` x the height.

    Raises:
        ValueError: Wrong dtype (e.g. float frames), a single image without a batch axis,
            channel-first layout, a channel count other than 3, or a size the detector was not
            trained at; the message names the problem and the fix.
    """
    if isinstance(pixels, torch.Tensor):
        pixels = pixels.detach().cpu().numpy()
    pixels = np.asarray(pixels)
    shape = tuple(pixels.shape)
    if pixels.dtype != np.uint8:
        raise ValueError(
            f"pixels have dtype {pixels.dtype}; expected uint8 RGB in 0..255 as the cameras "
            "render them (do not scale or normalise frames: the detector does that itself)"
        )
    if pixels.ndim == 3 and shape[-1] == 3:
        raise ValueError(
            f"pixels have shape {shape}, a single image; expected a batch (N, H, W, 3): "
            "pass pixels[None]"
        )
    if pixels.ndim != 4:
        raise ValueError(f"pixels have shape {shape}; expected a batch (N, H, W, 3)")
    if shape[1] in (1, 3, 4) and shape[-1] not in (1, 3, 4):
        raise ValueError(
            f"pixels have shape {shape}, which looks channel-first (N, C, H, W); expected "
            "channel-last (N, H, W, 3): use pixels.transpose(0, 2, 3, 1)"
        )
    if shape[-1] != 3:
        raise ValueError(
            f"pixels have {shape[-1]} channel(s) (shape {shape}); expected RGB with 3 "
            "(drop the alpha channel or convert grey images to RGB)"
        )
    if image_size is not None and shape[1:3] != (image_size, views * image_size):
        what = f"{image_size}x{image_size} frames" if views == 1 else (
            f"{views} {image_size}x{image_size} views side by side ({image_size}x"
            f"{views * image_size}; render_camera with the detector's camera gives them)")
        raise ValueError(f"pixels are {shape[1]}x{shape[2]} (height x width); this detector was "
                         f"trained on {what} (render with image_size={image_size})")
    return pixels


class CNNDetector(SuccessDetector):
    """A learned detector on one camera's frames of one task.

    Args:
        model: The trained network.
        task: Task it was trained for.
        camera: Camera whose frames it reads.
        image_size: Side of the square frames it reads.
        threshold: Probability at or above which a frame counts as success.
        training_summary: How it was trained (plain values, kept in the checkpoint).
        batch_size: Frames per forward pass in :meth:`predict_proba`.
        camera_mounts: Where the camera was mounted on the frames it learnt from
            (``TaskEnv.camera_mounts``), or ``None`` where unknown.
        checkpoint_path: The file it was loaded from, named in errors; ``None`` if not loaded.
    """

    requires: ClassVar[tuple[str, ...]] = ("pixels",)

    def __init__(
        self,
        model: SuccessCNN,
        task: str,
        camera: str,
        image_size: int,
        threshold: float = 0.5,
        training_summary: Mapping[str, Any] | None = None,
        batch_size: int = 256,
        camera_mounts: Sequence[Mapping[str, Any]] | None = None,
        checkpoint_path: str | os.PathLike | None = None,
    ) -> None:
        super().__init__(threshold=threshold, task=task, camera=camera, image_size=int(image_size))
        views = len(camera.split("+"))
        if views != model.architecture.views:
            raise ValueError(f"camera={camera!r} names {views} view(s) but the network reads "
                             f"{model.architecture.views}")
        self.model = model.eval()
        self.training_summary = dict(training_summary or {})
        self.batch_size = int(batch_size)
        self.camera_mounts = None if camera_mounts is None else [dict(m) for m in camera_mounts]
        self.checkpoint_path = None if checkpoint_path is None else Path(checkpoint_path)

    @property
    def origin(self) -> str:
        """How messages name this detector: by its checkpoint file, else its task and camera."""
        if self.checkpoint_path is not None:
            return f"detector checkpoint {self.checkpoint_path}"
        return f"the {self.task} detector on camera {self.camera!r}"

    def check_camera_mounts(self, mounts: Sequence[Mapping[str, Any]]) -> None:
        """Refuse an env that mounts this detector's camera elsewhere than on the frames it was
        trained on; warn when the checkpoint predates recorded mounts.

        Args:
            mounts: ``env.unwrapped.camera_mounts(self.camera)``.

        Raises:
            ValueError: The mounts differ; names the checkpoint, each view and field, and both
                values.
        """
        check_recorded_mounts(
            self.camera_mounts, mounts, source=self.origin, expected_from="this env",
            fix=f"retrain it on frames of this camera (scripts/collect_detector_data.py "
                f"task={self.task} task.camera={self.camera}, then scripts/train_detector.py)",
        )

    def predict_proba(self, batch: Mapping[str, Any]) -> np.ndarray:
        self._require(batch)
        pixels = check_pixels(batch["pixels"], self.image_size, self.model.architecture.views)
        return predict_pixels(self.model, pixels, self.batch_size)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the checkpoint atomically; returns its path."""
        return save_checkpoint(
            path, self.model, task=self.task, camera=self.camera, image_size=self.image_size,
            threshold=self.threshold, training_summary=self.training_summary,
            camera_mounts=self.camera_mounts,
        )


def write_atomically(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(temp_path)`` on a temporary path beside ``path``, then rename it over
    ``path`` (:func:`harness_common.files.atomic_path`): readers see the old file or the new
    one, never a partial write."""
    with atomic_path(path) as temp:
        write(temp)
    return Path(path)


def save_checkpoint(
    path: str | os.PathLike,
    model: SuccessCNN,
    *,
    task: str,
    camera: str,
    image_size: int,
    threshold: float,
    training_summary: Mapping[str, Any] | None = None,
    camera_mounts: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    """Write a CNN detector checkpoint atomically (see the module docstring for its keys);
    ``camera_mounts`` ``None`` (unknown) leaves that key out."""
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "task": str(task),
        "camera": str(camera),
        "image_size": int(image_size),
        "threshold": check_threshold(threshold),
        "normalisation": {
            "mean": [float(v) for v in model.mean.flatten()],
            "std": [float(v) for v in model.std.flatten()],
        },
        "architecture": {**asdict(model.architecture),
                         "channels": list(model.architecture.channels)},
        "state_dict": {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
        "training": dict(training_summary or {}),
    }
    if camera_mounts is not None:
        checkpoint["camera_mounts"] = [dict(m) for m in camera_mounts]
    return write_atomically(path, lambda temp: torch.save(checkpoint, temp))


def load_detector(
    path: str | os.PathLike,
    *,
    task: str | None = None,
    camera: str | None = None,
    threshold: float | None = None,
) -> CNNDetector:
    """Load a CNN detector checkpoint and check it fits the run.

    Args:
        path: The checkpoint file.
        task: The task of the run; ``None`` accepts the checkpoint's.
        camera: The camera of the run; ``None`` accepts the checkpoint's.
        threshold: Overrides the checkpoint's threshold (chosen at training time) when given.

    Raises:
        FileNotFoundError: No file at ``path``.
        ValueError: The file is corrupt or truncated, is not a CNN detector checkpoint, lacks
            keys, or was trained for another task or camera; the message names which.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"detector checkpoint {path} does not exist; train one with "
            "scripts/train_detector.py or point detector.checkpoint at an existing file"
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for damaged files
        raise ValueError(
            f"{path} is not a readable detector checkpoint (it may be truncated or corrupt): "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint)
        raise ValueError(
            f"{path} is not a CNN success-detector checkpoint (format {found!r}, expected "
            f"{CHECKPOINT_FORMAT!r})"
        )
    missing = [key for key in CHECKPOINT_KEYS if key not in checkpoint]
    if missing:
        raise ValueError(f"detector checkpoint {path} lacks key(s) {missing}")
    if checkpoint["version"] > CHECKPOINT_VERSION:
        raise ValueError(
            f"detector checkpoint {path} has version {checkpoint['version']}; this code reads "
            f"up to {CHECKPOINT_VERSION}"
        )
    if task is not None and checkpoint["task"] != task:
        raise ValueError(
            f"detector checkpoint {path} was trained for task {checkpoint['task']!r}, not "
            f"{task!r}; train one per task (the CNN reads no task id)"
        )
    if camera is not None and checkpoint["camera"] != camera:
        raise ValueError(
            f"detector checkpoint {path} was trained on camera {checkpoint['camera']!r}, not "
            f"{camera!r}; set detector.camera={checkpoint['camera']} or train on {camera!r}"
        )
    normalisation = checkpoint["normalisation"]
    model = SuccessCNN(
        Architecture(**checkpoint["architecture"]),
        mean=tuple(normalisation["mean"]), std=tuple(normalisation["std"]),
    )
    try:
        model.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as error:
        raise ValueError(
            f"detector checkpoint {path}: weights do not fit its architecture: {error}"
        ) from error
    return CNNDetector(
        model, task=checkpoint["task"], camera=checkpoint["camera"],
        image_size=checkpoint["image_size"],
        threshold=checkpoint["threshold"] if threshold is None else threshold,
        training_summary=checkpoint.get("training"),
        camera_mounts=checkpoint.get("camera_mounts"), checkpoint_path=path,
    )
