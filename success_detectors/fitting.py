"""The optimisation loop of the CNN detector (:func:`fit`): AdamW with a one-cycle schedule,
augmentation, class-balanced cross-entropy (plus the optional margin regression) and early
stopping on the validation loss, keeping the best weights.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch.nn import functional as F

from success_detectors.augmentation import Augmentation
from success_detectors.frames import FrameSet
from success_detectors.network import Architecture, SuccessCNN, predict_pixels


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
