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
5. **Metrics** on the held-out test split (:func:`binary_metrics`): accuracy, precision, recall,
   F1, ROC-AUC, expected calibration error and the confusion matrix.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.nn import functional as F

from harness.stats import wilson_interval
from success_detectors.cnn import (
    Architecture,
    CNNDetector,
    SuccessCNN,
    predict_pixels,
    write_atomically,
)
from success_detectors.data import FrameSet


# ---------------------------------------------------------------------------------- metrics
def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with mid-ranks for ties).

    Args:
        labels: ``bool (N,)``.
        scores: ``float (N,)``, higher meaning more likely positive.

    Returns:
        AUC in [0, 1]; NaN when one class is absent.
    """
    labels = np.asarray(labels, dtype=bool)
    scores = np.asarray(scores, dtype=float)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores))
    start = 0
    while start < len(scores):  # mid-rank of each run of equal scores
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def expected_calibration_error(labels: np.ndarray, probs: np.ndarray, bins: int = 10) -> float:
    """ECE of the success probability: ``sum_b (n_b / N) |mean(label_b) - mean(prob_b)|``.

    Bins are ``bins`` equal widths over [0, 1] (the last one closed), as in Guo et al. (2017),
    applied to the positive-class probability of a binary classifier.
    """
    labels = np.asarray(labels, dtype=float)
    probs = np.asarray(probs, dtype=float)
    if len(probs) == 0:
        return float("nan")
    index = np.minimum((probs * bins).astype(int), bins - 1)
    ece = 0.0
    for b in range(bins):
        mask = index == b
        if mask.any():
            ece += mask.mean() * abs(labels[mask].mean() - probs[mask].mean())
    return float(ece)


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator / denominator) if denominator else float("nan")


def binary_metrics(
    labels: np.ndarray, probs: np.ndarray, threshold: float, bins: int = 10
) -> dict[str, Any]:
    """Classification metrics of probabilities at a threshold (prediction: ``prob >= threshold``).

    Args:
        labels: ``bool (N,)`` ground truth.
        probs: ``float (N,)`` success probabilities.
        threshold: Decision threshold.
        bins: Bins of the calibration error.

    Returns:
        ``accuracy``, ``precision``, ``recall``, ``f1``, ``roc_auc``, ``ece``, ``threshold``,
        ``confusion_matrix`` (``[[tn, fp], [fn, tp]]``, rows = truth), ``false_positive_rate``,
        ``false_negative_rate`` and ``frames``. Ratios with a zero denominator are NaN.
    """
    labels = np.asarray(labels, dtype=bool)
    probs = np.asarray(probs, dtype=float)
    predicted = probs >= threshold
    tp = int(np.sum(predicted & labels))
    fp = int(np.sum(predicted & ~labels))
    fn = int(np.sum(~predicted & labels))
    tn = int(np.sum(~predicted & ~labels))
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    return {
        "accuracy": _ratio(tp + tn, len(labels)),
        "precision": precision,
        "recall": recall,
        "f1": _ratio(2 * tp, 2 * tp + fp + fn),
        "roc_auc": roc_auc(labels, probs),
        "ece": expected_calibration_error(labels, probs, bins),
        "threshold": float(threshold),
        "confusion_matrix": [[tn, fp], [fn, tp]],
        "false_positive_rate": _ratio(fp, fp + tn),
        "false_negative_rate": _ratio(fn, fn + tp),
        "frames": len(labels),
    }


class ThresholdChoice(NamedTuple):
    """The chosen threshold and what it gives on the set it was chosen on."""

    threshold: float
    precision: float
    recall: float
    reached: bool


def select_threshold(
    labels: np.ndarray, probs: np.ndarray, target_precision: float = 0.98,
    conservative: bool = False,
) -> ThresholdChoice:
    """The lowest threshold whose precision reaches ``target_precision`` (the most recall).

    Candidates are the observed scores (prediction: ``prob >= threshold``). With
    ``conservative``, a threshold qualifies only if the lower end of the 95% Wilson interval of
    its precision reaches the target, so that a precision measured on a few hundred frames still
    holds on new ones (and ten lucky frames never qualify). If no threshold qualifies, the one
    with the highest precision (then recall) is returned with ``reached=False``.

    Args:
        labels: ``bool (N,)`` ground truth.
        probs: ``float (N,)`` scores.
        target_precision: Required precision in (0, 1].
        conservative: Require the precision's 95% lower confidence bound to reach the target.

    Raises:
        ValueError: No positive labels, or a target outside (0, 1].
    """
    if not 0 < target_precision <= 1:
        raise ValueError(f"target_precision={target_precision}; expected a value in (0, 1]")
    labels = np.asarray(labels, dtype=bool)
    probs = np.asarray(probs, dtype=float)
    if not labels.any():
        raise ValueError("cannot choose a threshold: the set has no positive frames")
    order = np.argsort(-probs, kind="mergesort")
    sorted_probs, sorted_labels = probs[order], labels[order]
    tp = np.cumsum(sorted_labels)
    predicted = np.arange(1, len(probs) + 1)
    last_of_run = np.r_[sorted_probs[1:] != sorted_probs[:-1], True]  # ties decide together
    thresholds = sorted_probs[last_of_run]
    precision = tp[last_of_run] / predicted[last_of_run]
    recall = tp[last_of_run] / labels.sum()
    evidence = precision
    if conservative:
        evidence = np.array([wilson_interval(int(t), int(n))[0]
                             for t, n in zip(tp[last_of_run], predicted[last_of_run], strict=True)])
    meets = np.flatnonzero(evidence >= target_precision - 1e-12)
    if len(meets):
        best = meets[-1]  # lowest threshold that still meets the target
        return ThresholdChoice(float(thresholds[best]), float(precision[best]),
                               float(recall[best]), True)
    best = np.lexsort((-recall, -precision))[0]
    return ThresholdChoice(float(thresholds[best]), float(precision[best]),
                           float(recall[best]), False)


# ------------------------------------------------------------------------------ augmentation
@dataclass(frozen=True)
class Augmentation:
    """Training-time image augmentation.

    Attributes:
        shift: Pixels of random translation (replicate padding, then a random crop).
        brightness: Largest brightness offset, as a share of 255.
        contrast: Largest relative contrast change.
        channel_gain: Largest relative change of each colour channel's gain.
    """

    shift: int = 4
    brightness: float = 0.08
    contrast: float = 0.15
    channel_gain: float = 0.05

    def __call__(self, pixels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augment ``uint8 (B, H, W, 3)`` frames; returns float frames in 0..255, same layout."""
        x = pixels.float()
        batch, height, width, _ = x.shape
        if self.shift > 0:
            # Views side by side (width a multiple of height) are shifted independently, so
            # no view borrows columns of its neighbour.
            views = width // height if width % height == 0 else 1
            x = x.reshape(batch, height, views, width // views, 3).transpose(1, 2)
            x = x.reshape(batch * views, height, width // views, 3)
            s, view_width = self.shift, width // views
            padded = F.pad(x.permute(0, 3, 1, 2), (s, s, s, s), mode="replicate")
            offsets = torch.randint(0, 2 * s + 1, (batch * views, 2), generator=generator)
            x = torch.stack([
                padded[i, :, dy:dy + height, dx:dx + view_width]
                for i, (dy, dx) in enumerate(offsets.tolist())
            ]).permute(0, 2, 3, 1)
            x = x.reshape(batch, views, height, view_width, 3).transpose(1, 2)
            x = x.reshape(batch, height, width, 3)
        uniform = torch.rand(batch, 5, generator=generator) * 2 - 1
        brightness = (self.brightness * 255 * uniform[:, 0]).view(batch, 1, 1, 1)
        contrast = (1 + self.contrast * uniform[:, 1]).view(batch, 1, 1, 1)
        gain = (1 + self.channel_gain * uniform[:, 2:5]).view(batch, 1, 1, 3)
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        x = ((x - mean) * contrast + mean) * gain + brightness
        return x.clamp_(0, 255).contiguous(memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings of :func:`fit`.

    Attributes:
        epochs: Most passes over the training split.
        batch_size: Frames per gradient step.
        learning_rate: AdamW step size.
        weight_decay: AdamW weight decay.
        patience: Epochs without a better validation loss before stopping.
        max_minutes: Wall-clock budget; training stops after the epoch that crosses it.
        target_precision: Precision the threshold must reach on the validation split.
        conservative_threshold: Require the 95% lower confidence bound of the validation
            precision, not the measured value, to reach ``target_precision``.
        augmentation: Image augmentation.
        architecture: Layer sizes of the network.
        margin_weight: Weight of the margin head's loss (Huber, centimetres) against the
            classification loss, where frames have a known margin (simulator data).
        margin_cap_cm: Margins are clipped to +-this many centimetres before regression: far
            from the boundary the exact distance does not matter.
        seed: Seed of initialisation, shuffling and augmentation.
        threads: Torch CPU threads.
    """

    epochs: int = 12
    batch_size: int = 64
    learning_rate: float = 2e-3
    weight_decay: float = 1e-4
    patience: int = 4
    max_minutes: float = 10.0
    target_precision: float = 0.98
    conservative_threshold: bool = True
    augmentation: Augmentation = field(default_factory=Augmentation)
    architecture: Architecture = field(default_factory=Architecture)
    margin_weight: float = 0.5
    margin_cap_cm: float = 5.0
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.augmentation, Mapping):
            object.__setattr__(self, "augmentation", Augmentation(**self.augmentation))
        if isinstance(self.architecture, Mapping):
            object.__setattr__(self, "architecture", Architecture(**self.architecture))
        for name in ("epochs", "batch_size", "patience", "threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"train.{name}={getattr(self, name)}; expected an integer >= 1")
        for name in ("learning_rate", "max_minutes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"train.{name}={getattr(self, name)}; expected a number > 0")
        if not 0 < self.target_precision <= 1:
            raise ValueError(f"train.target_precision={self.target_precision}; expected (0, 1]")
        if not self.margin_weight >= 0:
            raise ValueError(f"train.margin_weight={self.margin_weight}; expected a number >= 0")
        if not self.margin_cap_cm > 0:
            raise ValueError(f"train.margin_cap_cm={self.margin_cap_cm}; expected cm > 0")


@dataclass
class FitResult:
    """What :func:`fit` returns: the best model and its history."""

    model: SuccessCNN
    history: list[dict[str, float]]
    best_epoch: int
    seconds: float
    stopped: str


def _class_weights(labels: torch.Tensor) -> tuple[float, float]:
    """Per-frame loss weights ``(negative, positive)`` giving each class half of the loss."""
    n = len(labels)
    positives = float(labels.sum())
    negatives = n - positives
    if positives == 0 or negatives == 0:
        raise ValueError(f"training split has {int(positives)} positive and {int(negatives)} "
                         "negative frames; a detector needs both")
    return n / (2 * negatives), n / (2 * positives)


def _loss(model: SuccessCNN, pixels: torch.Tensor, labels: torch.Tensor,
          weights: tuple[float, float], margins_cm: torch.Tensor | None = None,
          margin_weight: float = 0.0) -> torch.Tensor:
    """Class-weighted cross-entropy, plus ``margin_weight`` x the margin head's Huber loss on the
    frames whose margin is known (``margins_cm`` finite; already clipped)."""
    frame_weights = torch.where(labels > 0.5, weights[1], weights[0])
    if margins_cm is None or model.margin_head is None:
        return F.binary_cross_entropy_with_logits(model(pixels), labels, weight=frame_weights)
    logits, predicted = model.forward_with_margin(pixels)
    loss = F.binary_cross_entropy_with_logits(logits, labels, weight=frame_weights)
    known = torch.isfinite(margins_cm)
    if known.any():
        loss = loss + margin_weight * F.huber_loss(predicted[known], margins_cm[known])
    return loss


def _validation_loss(
    model: SuccessCNN, frames: FrameSet, weights: tuple[float, float]
) -> tuple[float, np.ndarray]:
    """Class-weighted cross-entropy on ``frames`` (no augmentation) and the probabilities."""
    probs = predict_pixels(model, frames.pixels)
    eps = 1e-7
    p = np.clip(probs, eps, 1 - eps)
    y = frames.label
    frame_loss = -(y * np.log(p) + (~y) * np.log(1 - p))
    frame_weights = np.where(y, weights[1], weights[0])
    return float(np.sum(frame_weights * frame_loss) / np.sum(frame_weights)), probs


def normalisation_of(pixels: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation (0..255 units) of ``uint8 (N, H, W, 3)`` frames."""
    sample = pixels[:: max(1, len(pixels) // 2000)].reshape(-1, 3).astype(np.float64)
    return tuple(sample.mean(0).tolist()), tuple(np.maximum(sample.std(0), 1.0).tolist())


def fit(train: FrameSet, val: FrameSet, config: TrainConfig, progress: bool = True) -> FitResult:
    """Train a :class:`SuccessCNN` with augmentation, class balancing and early stopping.

    Args:
        train: Training frames (both classes).
        val: Validation frames (both classes), for early stopping.
        config: Optimisation settings.
        progress: Show a tqdm progress bar.

    Returns:
        The model with the best validation loss, the per-epoch history, the best epoch, the time
        taken and why it stopped (``"epochs"``, ``"patience"`` or ``"time"``).
    """
    from tqdm import tqdm

    if len(val) == 0 or val.label.all() or not val.label.any():
        raise ValueError(f"validation split has {val.class_counts()}; it needs both classes")
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    mean, std = normalisation_of(train.pixels)
    height, width = train.pixels.shape[1:3]
    if width % height:
        raise ValueError(f"frames are {height}x{width}; expected square views side by side "
                         "(width a multiple of height)")
    architecture = replace(config.architecture, views=width // height)
    margins_cm = None
    if architecture.margin_head:
        if np.isfinite(train.margin).any():
            cap = config.margin_cap_cm
            margins_cm = torch.from_numpy(np.clip(100.0 * train.margin, -cap, cap)
                                          .astype(np.float32))
        else:  # photos: no distance to learn from
            architecture = replace(architecture, margin_head=False)
    model = SuccessCNN(architecture, mean=mean, std=std)
    optimiser = torch.optim.AdamW(model.parameters(), lr=config.learning_rate,
                                  weight_decay=config.weight_decay)
    pixels = torch.from_numpy(train.pixels)
    labels = torch.from_numpy(train.label.astype(np.float32))
    weights = _class_weights(labels)
    batches = math.ceil(len(train) / config.batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimiser, max_lr=config.learning_rate, total_steps=config.epochs * batches,
        pct_start=0.15,
    )

    best_loss, best_state, best_epoch, waited = math.inf, None, 0, 0
    history: list[dict[str, float]] = []
    stopped = "epochs"
    start = time.perf_counter()
    bar = tqdm(total=config.epochs * batches, desc="train detector", unit="batch",
               disable=not progress)
    for epoch in range(1, config.epochs + 1):
        model.train()
        order = torch.randperm(len(train), generator=generator)
        epoch_loss = 0.0
        for b in range(batches):
            index = order[b * config.batch_size:(b + 1) * config.batch_size]
            batch = config.augmentation(pixels[index], generator)
            loss = _loss(model, batch, labels[index], weights,
                         None if margins_cm is None else margins_cm[index],
                         config.margin_weight)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            scheduler.step()
            epoch_loss += loss.item() * len(index)
            bar.update(1)
        val_loss, val_probs = _validation_loss(model, val, weights)
        val_accuracy = float(np.mean((val_probs >= 0.5) == val.label))
        history.append({"epoch": epoch, "train_loss": epoch_loss / len(train),
                        "val_loss": val_loss, "val_accuracy": val_accuracy})
        bar.set_postfix(epoch=epoch, loss=f"{epoch_loss / len(train):.3f}",
                        val_loss=f"{val_loss:.3f}", val_acc=f"{val_accuracy:.3f}")
        if val_loss < best_loss - 1e-4:
            best_loss, best_epoch, waited = val_loss, epoch, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            waited += 1
        if waited >= config.patience:
            stopped = "patience"
            break
        if time.perf_counter() - start > 60 * config.max_minutes:
            stopped = "time"
            break
    bar.close()
    if best_state is None:  # the validation loss was never finite: the training diverged
        losses = [h["val_loss"] for h in history]
        raise RuntimeError(f"training diverged (validation losses {losses}); lower "
                           "train.learning_rate")
    model.load_state_dict(best_state)
    return FitResult(model.eval(), history, best_epoch, time.perf_counter() - start, stopped)


# ------------------------------------------------------------------------------- evaluation
MARGIN_BINS_CM = (0.0, 0.25, 0.5, 1.0, 2.0, 5.0, float("inf"))


def errors_by_margin(labels: np.ndarray, probs: np.ndarray, margins: np.ndarray,
                     threshold: float) -> list[dict[str, Any]]:
    """Errors binned by the frame's distance to the success boundary, ``|margin|`` in cm.

    Pixels resolve the boundary only to a few millimetres, so errors a few millimetres from it
    are expected; errors far from it are real mistakes. Frames without a margin (photos) are left
    out. One row per bin of ``MARGIN_BINS_CM``: ``from_cm``, ``to_cm`` (None for the open last
    bin), ``frames``, ``errors``, ``false_positives``, ``false_negatives``.
    """
    labels = np.asarray(labels, dtype=bool)
    predicted = np.asarray(probs) >= threshold
    distance = np.abs(np.asarray(margins, dtype=float)) * 100.0
    rows = []
    for low, high in zip(MARGIN_BINS_CM[:-1], MARGIN_BINS_CM[1:], strict=True):
        inside = np.isfinite(distance) & (distance >= low) & (distance < high)
        rows.append({
            "from_cm": low, "to_cm": None if np.isinf(high) else high,
            "frames": int(inside.sum()),
            "errors": int(np.sum(inside & (predicted != labels))),
            "false_positives": int(np.sum(inside & predicted & ~labels)),
            "false_negatives": int(np.sum(inside & ~predicted & labels)),
        })
    return rows


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
            metrics["near_miss_false_positive_rate"] = _ratio(
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

    from harness.plots import save_figure

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


# ------------------------------------------------------------------------------- the whole run
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


def train_detector(config: TrainDetectorConfig, progress: bool = True) -> TrainDetectorResult:
    """Train, pick the threshold on val, evaluate on test, and write the run's files.

    Writes, in ``out_dir``, ``<task>_<camera>.pt`` (atomically), ``<task>_<camera>_metrics.json``
    (test-split metrics at the top level, plus ``val``, ``training`` and ``config`` sections) and
    ``<task>_<camera>_worst_errors.png``.
    """
    torch.set_num_threads(config.train.threads)
    splits, task, camera, image_size = load_splits(config)
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
                           threshold=choice.threshold, training_summary=_plain(summary))
    out_dir, stem = Path(config.out_dir), f"{task}_{camera}"
    checkpoint = detector.save(out_dir / f"{stem}.pt")
    figure = worst_errors_figure(out_dir / f"{stem}_worst_errors.png", splits["test"],
                                 test_probs, choice.threshold)
    metrics = {
        **test_metrics, "split": "test", "task": task, "camera": camera,
        "image_size": image_size, "checkpoint": str(checkpoint),
        "val": val_metrics, "training": {**summary, "history": result.history},
        "config": _plain(asdict(config)),
    }
    metrics_path = write_atomically(
        out_dir / f"{stem}_metrics.json",
        lambda temp: temp.write_text(json.dumps(_plain(metrics), indent=2)),
    )
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
