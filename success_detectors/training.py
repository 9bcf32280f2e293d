"""Training and evaluation of the CNN detector: augmentation, early stopping, metrics, threshold.

The loop follows HIL-SERL's reward classifier in spirit (binary cross-entropy on frames labelled
success/failure) with what a verifier for RL needs on top:

1. **Augmentation**: random shift (replicate-pad ``shift`` pixels, random crop back; DrQ) and
   colour jitter (brightness, contrast, per-channel gain), so the classifier keys on the object
   against the goal rather than on exact pixels.
2. **Class balancing**: each class weighs half of the loss whatever its count.
3. **Early stopping** on the validation loss; the best weights are kept.
4. **Threshold** chosen on the validation split as the lowest that reaches ``target_precision``
   (default 0.98, because false positives are what RL learns to exploit), i.e. the most recall
   the target allows (:func:`select_threshold`); by default the 95% lower confidence bound of
   the validation precision must reach it, so that the precision holds on unseen episodes.
5. **Camera mounts**: an HDF5 file's recorded mounts must be where this code mounts the cameras
   (:func:`check_data_mounts`); the checkpoint keeps them, so that the detector is refused
   wherever its camera has moved since.
6. **Metrics** on the held-out test split (:func:`binary_metrics`): accuracy, precision, recall,
   F1, ROC-AUC, expected calibration error and the confusion matrix.

The parts live by job: :mod:`~success_detectors.metrics` (pure functions),
:mod:`~success_detectors.augmentation`, :mod:`~success_detectors.fitting` (the optimisation loop)
and :mod:`~success_detectors.evaluation`; this module runs them in order and writes the run's
files, and re-exports their public names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness_common.files import contained_path, write_json
from success_detectors.augmentation import Augmentation
from success_detectors.base import check_names, check_recorded_mounts
from success_detectors.cnn import CNNDetector
from success_detectors.evaluation import evaluate, worst_errors_figure
from success_detectors.fitting import FitResult, TrainConfig, fit, normalisation_of
from success_detectors.frames import FrameSet
from success_detectors.metrics import (
    MARGIN_BINS_CM,
    ThresholdChoice,
    binary_metrics,
    errors_by_margin,
    expected_calibration_error,
    roc_auc,
    select_threshold,
)
from success_detectors.network import predict_pixels

__all__ = [
    "MARGIN_BINS_CM", "Augmentation", "FitResult", "ThresholdChoice", "TrainConfig",
    "TrainDetectorConfig", "TrainDetectorResult", "binary_metrics", "check_data_mounts",
    "errors_by_margin", "evaluate", "expected_calibration_error", "fit", "load_splits",
    "normalisation_of", "roc_auc", "select_threshold", "train_detector", "worst_errors_figure",
]


@dataclass(frozen=True)
class TrainDetectorConfig:
    """One detector training run (``conf/train_detector.yaml``).

    Attributes:
        data: HDF5 file from ``scripts/collect_detector_data.py``; or ``None`` with ``image_dir``.
        image_dir: Folder of photos (``success/``, ``failure/``); or ``None`` with ``data``.
        task: Task of an image-folder detector (an HDF5 file names its own; must match if given).
        camera: Camera of an image-folder detector (an HDF5 file names its own; likewise).
        image_size: Side the photos are resized to (default 84); an HDF5 file has its own,
            which must match if this is given.
        splits: Train/val/test shares of photos (HDF5 files are split already).
        hard_margin: Metres from success that count as a near-miss in the metrics.
        out_dir: Where the checkpoint, metrics JSON and error figure go.
        train: Optimisation settings.
    """

    data: str | None = None
    image_dir: str | None = None
    task: str | None = None
    camera: str | None = None
    image_size: int | None = None
    splits: tuple[float, float, float] = (0.7, 0.15, 0.15)
    hard_margin: float = 0.03
    out_dir: str = "outputs/detectors"
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if isinstance(self.train, Mapping):
            object.__setattr__(self, "train", TrainConfig(**self.train))
        object.__setattr__(self, "splits", tuple(float(v) for v in self.splits))
        if (self.data is None) == (self.image_dir is None):
            raise ValueError(
                f"data={self.data!r}, image_dir={self.image_dir!r}; give exactly one: an HDF5 "
                "file from scripts/collect_detector_data.py or a folder with success/ and failure/"
            )
        if self.image_dir is not None and (self.task is None or self.camera is None):
            raise ValueError(
                f"image_dir training needs task= and camera= (got task={self.task!r}, "
                f"camera={self.camera!r}); they are written into the checkpoint and checked "
                "when it is loaded"
            )


@dataclass
class TrainDetectorResult:
    """Paths written by :func:`train_detector` and the metrics."""

    detector: CNNDetector
    checkpoint: Path
    metrics_path: Path
    figure: Path
    metrics: dict[str, Any]


def load_splits(config: TrainDetectorConfig) -> tuple[dict[str, FrameSet], str, str, int]:
    """The train/val/test frames of a run, with its task, camera and image size."""
    from success_detectors import data

    if config.data is not None:
        attrs = data.read_attrs(config.data)
        for key in ("task", "camera", "image_size"):
            wanted = getattr(config, key)
            if wanted is not None and wanted != attrs[key]:
                raise ValueError(f"{key}={wanted!r} but {config.data} holds frames with {key}="
                                 f"{attrs[key]!r}; drop {key} or use another file")
        return data.read_dataset(config.data), attrs["task"], attrs["camera"], attrs["image_size"]
    image_size = config.image_size or 84
    frames = data.load_image_folder(config.image_dir, image_size)
    splits = data.split_frames(frames, config.splits, seed=config.train.seed)
    return splits, config.task, config.camera, image_size


def check_data_mounts(path: str | os.PathLike, task: str, camera: str) -> list[dict] | None:
    """The camera mounts a detector data file records, checked against where this code mounts
    ``task``'s ``camera`` (:func:`success_detectors.data.camera_mounts`).

    Returns:
        The recorded mounts, or ``None`` for a file collected before they were recorded.

    Raises:
        ValueError: They differ (the frames show cameras mounted elsewhere); names the file,
            each view and field, and both values.

    Warns:
        UserWarning: The file records none, so they cannot be checked.
    """
    from success_detectors import data

    recorded = data.read_attrs(path)["camera_mounts"]
    check_recorded_mounts(
        recorded, data.camera_mounts(task, camera), source=f"detector data file {path}",
        expected_from="the scene this code builds",
        fix=f"re-collect the data (scripts/collect_detector_data.py task={task} "
            f"task.camera={camera})",
    )
    return recorded


def train_detector(config: TrainDetectorConfig, progress: bool = True) -> TrainDetectorResult:
    """Train, pick the threshold on val, evaluate on test, and write the run's files.

    Writes, in ``out_dir``, ``<task>_<camera>.pt`` (atomically), ``<task>_<camera>_metrics.json``
    (test-split metrics at the top level, plus ``val``, ``training`` and ``config`` sections) and
    ``<task>_<camera>_worst_errors.png``.

    Raises:
        ValueError: An HDF5 file whose camera mounts differ from this code's
            (:func:`check_data_mounts`), or a split without both classes.
    """
    torch.set_num_threads(config.train.threads)
    splits, task, camera, image_size = load_splits(config)
    check_names(task, camera, config.data or "task=/camera=")
    # Photos (image_dir) record no mounts: nothing to check, and the checkpoint keeps none.
    camera_mounts = None if config.data is None else check_data_mounts(config.data, task, camera)
    for name in ("train", "val", "test"):
        counts = splits[name].class_counts()
        if min(counts.values()) == 0:
            raise ValueError(f"the {name} split has {counts}; every split needs both classes "
                             "(collect more episodes or add images)")
    result = fit(splits["train"], splits["val"], config.train, progress)

    val_probs = predict_pixels(result.model, splits["val"].pixels)
    choice = select_threshold(splits["val"].label, val_probs, config.train.target_precision,
                              conservative=config.train.conservative_threshold)
    val_metrics = binary_metrics(splits["val"].label, val_probs, choice.threshold)
    test_metrics, test_probs = evaluate(result.model, splits["test"], choice.threshold,
                                        config.hard_margin)

    summary = {
        "epochs": len(result.history), "best_epoch": result.best_epoch,
        "seconds": round(result.seconds, 1), "stopped": result.stopped,
        "target_precision": config.train.target_precision,
        "val_reached_target": choice.reached,
        "data": config.data or config.image_dir,
        "frames": {name: len(part) for name, part in splits.items()},
    }
    detector = CNNDetector(result.model, task=task, camera=camera, image_size=image_size,
                           threshold=choice.threshold, training_summary=_plain(summary),
                           camera_mounts=camera_mounts)
    out_dir, stem = Path(config.out_dir), f"{task}_{camera}"
    checkpoint = detector.save(contained_path(out_dir, f"{stem}.pt"))
    figure = worst_errors_figure(out_dir / f"{stem}_worst_errors.png", splits["test"],
                                 test_probs, choice.threshold)
    metrics = {
        **test_metrics, "split": "test", "task": task, "camera": camera,
        "image_size": image_size, "checkpoint": str(checkpoint),
        "val": val_metrics, "training": {**summary, "history": result.history},
        "config": _plain(asdict(config)),
    }
    metrics_path = out_dir / f"{stem}_metrics.json"
    write_json(metrics_path, metrics)
    return TrainDetectorResult(detector, checkpoint, metrics_path, figure, metrics)


def _plain(value: Any) -> Any:
    """JSON-ready plain values (tuples as lists, numpy scalars as Python numbers, NaN kept)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value
