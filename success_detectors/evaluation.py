"""Evaluation of a trained CNN detector on held-out frames: metrics and the worst errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from success_detectors.frames import FrameSet
from success_detectors.metrics import (
    ThresholdChoice,
    binary_metrics,
    errors_by_margin,
    ratio_or_nan,
    select_threshold,
)
from success_detectors.network import SuccessCNN, predict_pixels


def evaluate(model: SuccessCNN, frames: FrameSet, threshold: float,
             hard_margin: float | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """Metrics of ``model`` on ``frames`` at ``threshold``, and the probabilities.

    With known margins (simulator frames), adds ``errors_by_margin`` (see that function); with
    ``hard_margin`` too, ``near_miss_negatives`` and ``near_miss_false_positive_rate``
    (negatives within ``hard_margin`` of success).
    """
    probs = predict_pixels(model, frames.pixels)
    metrics = binary_metrics(frames.label, probs, threshold)
    if np.isfinite(frames.margin).any():
        metrics["errors_by_margin"] = errors_by_margin(frames.label, probs, frames.margin,
                                                       threshold)
        if hard_margin is not None:
            near = ~frames.label & (frames.margin < hard_margin)
            metrics["near_miss_negatives"] = int(near.sum())
            metrics["near_miss_false_positive_rate"] = ratio_or_nan(
                float(np.sum(probs[near] >= threshold)), float(near.sum())
            )
    return metrics, probs


def worst_errors_figure(
    path: str | os.PathLike, frames: FrameSet, probs: np.ndarray, threshold: float,
    per_row: int = 8,
) -> Path:
    """PNG grid: the most confident false positives (top row) and false negatives (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from harness_common.plots import save_figure

    predicted = probs >= threshold
    false_pos = np.flatnonzero(predicted & ~frames.label)
    false_neg = np.flatnonzero(~predicted & frames.label)
    rows = (
        ("false positive", false_pos[np.argsort(-probs[false_pos])][:per_row]),
        ("false negative", false_neg[np.argsort(probs[false_neg])][:per_row]),
    )
    figure, axes = plt.subplots(2, per_row, figsize=(1.6 * per_row, 4.0), squeeze=False)
    for row, (kind, indices) in enumerate(rows):
        for column in range(per_row):
            axis = axes[row, column]
            axis.axis("off")
            if column >= len(indices):
                if column == 0:
                    axis.text(0.5, 0.5, f"no {kind}s", ha="center", va="center", fontsize=8)
                continue
            i = indices[column]
            axis.imshow(frames.pixels[i])
            where = (frames.names[i] if frames.names is not None
                     else f"ep {frames.episode[i]} t {frames.step[i]}")
            margin = frames.margin[i]
            margin = "" if np.isnan(margin) else f"\nmargin {100 * margin:.1f} cm"
            axis.set_title(f"{kind}\np={probs[i]:.2f} {where}{margin}", fontsize=6)
    figure.suptitle(f"Worst test errors at threshold {threshold:.3f}", fontsize=9)
    figure.tight_layout()
    return save_figure(figure, path, dpi=120)


DROP_KEYS = ("accuracy", "precision", "recall", "roc_auc")


def fitting_attrs(detector, path: str | os.PathLike) -> dict[str, Any]:
    """The root attributes of a detector data file whose frames ``detector`` reads.

    Raises:
        ValueError: The file's task, camera or image size differ from the detector's.
    """
    from success_detectors.data import read_attrs

    attrs = read_attrs(path)
    for key in ("task", "camera", "image_size"):
        if attrs[key] != getattr(detector, key):
            raise ValueError(f"{path} holds frames with {key}={attrs[key]!r}; the detector "
                             f"reads {key}={getattr(detector, key)!r}")
    return attrs


def evaluate_on_file(detector, path: str | os.PathLike, split: str = "test",
                     hard_margin: float | None = 0.03) -> dict[str, Any]:
    """Metrics of a loaded CNN detector on one split of a detector data file, at its threshold.

    Args:
        detector: A :class:`~success_detectors.cnn.CNNDetector`.
        path: A file from ``scripts/collect_detector_data.py``, e.g. a test-only file of a
            visual domain held out of training.
        split: ``train``, ``val`` or ``test``.
        hard_margin: As in :func:`evaluate`.

    Returns:
        :func:`evaluate`'s metrics plus ``data``, ``split`` and the file's ``randomization``.

    Raises:
        ValueError: The file's task, camera or image size differ from the detector's, both
            record camera mounts and these differ, or the split is empty. (Where either records
            no mounts, they are not compared.)
    """
    from success_detectors.base import check_recorded_mounts
    from success_detectors.data import read_split

    attrs = fitting_attrs(detector, path)
    if attrs["camera_mounts"] is not None and detector.camera_mounts is not None:
        check_recorded_mounts(
            attrs["camera_mounts"], detector.camera_mounts, source=f"detector data file {path}",
            expected_from=f"the frames {detector.origin} was trained on",
            fix="evaluate on data collected with the cameras the detector was trained with, or "
                "retrain it on frames of these",
        )
    frames = read_split(path, split)
    if len(frames) == 0:
        raise ValueError(f"{path} has no frames in its {split!r} split")
    metrics, _ = evaluate(detector.model, frames, detector.threshold, hard_margin)
    return {**metrics, "data": str(path), "split": split,
            "randomization": attrs["config"].get("randomization", {})}


def threshold_on_file(detector, path: str | os.PathLike, split: str = "val",
                      target_precision: float = 0.98,
                      conservative: bool = True) -> ThresholdChoice:
    """Choose a trained detector's threshold again, on one split of a data file, by the rule of
    training (:func:`~success_detectors.metrics.select_threshold`), without training again:
    the network's weights do not depend on the threshold.

    With ``conservative`` (training's default) the 95% lower bound of the split's precision must
    reach ``target_precision``; without it, the measured precision must. Choose on ``val`` (the
    split training chose on) and read the result on ``test``, never on the split it was chosen on.

    Raises:
        ValueError: The file does not fit the detector, the split is empty or has no positive
            frame, or a target outside (0, 1].
    """
    from success_detectors.data import read_split

    fitting_attrs(detector, path)
    frames = read_split(path, split)
    if len(frames) == 0:
        raise ValueError(f"{path} has no frames in its {split!r} split to choose a threshold on")
    probs = predict_pixels(detector.model, frames.pixels)
    return select_threshold(frames.label, probs, target_precision, conservative)


def metric_drops(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, float]:
    """``reference[key] - other[key]`` for :data:`DROP_KEYS`: how much worse ``other`` reads
    (negative: better)."""
    return {key: float(reference[key] - other[key]) for key in DROP_KEYS}
