"""In-run hard-negative mining of a learned verifier: the HIL-SERL loop, every few iterations.

A policy rewarded by a learned detector finds the frames the detector wrongly calls success
(docs/sim_to_real.md, "Reward-hacking audit"); a detector fixed before training falls behind the
policy it scores. :class:`DetectorRefresher` keeps it up with the policy during the run:

1. :meth:`~DetectorRefresher.observe` takes each iteration's scored final frames and asks for
   their labels, which in simulation the scripted predicate gives (on a robot, a person): with
   ``label="claimed"`` only the frames the detector called success, the claims a person checking
   a real cell would review, whose wrong ones are the hard negatives; with ``"all"`` every frame.
   The labelled frames join a bounded buffer (the oldest leave first).
2. Every ``every`` iterations :meth:`~DetectorRefresher.refresh` fine-tunes the detector in
   place for ``steps`` AdamW steps on batches that mix the buffer with the detector's own
   training split (``data``: ``replay_fraction`` of each batch, so that it keeps what it knew),
   augmented and class-balanced as in training (``hard_negative_share`` of the buffer's part
   drawn from its hard negatives); then it chooses the threshold again on the
   data file's validation split by the training rule (``target_precision``, ``conservative``).
   Without ``data`` it trains on the buffer alone and keeps its threshold. With ``holdout`` > 0
   a share of the labelled frames never trains the detector: it is the policy's own held-out
   set, and the threshold is raised until the precision on it also reaches the target, because
   the validation split was not drawn from the policy's attempts and the policy's false positives
   are exactly the frames it lacks.
3. It writes the refreshed detector (``<out_dir>/<task>_<camera>.pt``, atomically) and a sheet
   of the hard negatives that refresh learnt from (``hard_negatives_<n>.png``): the frames the
   policy had learnt to end on.

Everything it draws is seeded by (run seed, refresh number), and :meth:`state_dict` carries the
weights, threshold, buffer and counts, so a resumed run refreshes as an uninterrupted one would.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from success_detectors.augmentation import Augmentation
from success_detectors.cnn import CNNDetector
from success_detectors.fitting import _loss
from success_detectors.metrics import binary_metrics, select_threshold
from success_detectors.network import predict_pixels

SHEET_FRAMES = 8  # hard negatives per sheet
SHEET_COLUMNS = 4
MIN_HELD_OUT = 20  # held-out frames needed before they may move the threshold


def _balanced_weights(labels: torch.Tensor) -> tuple[float, float]:
    """Per-frame loss weights ``(negative, positive)`` giving each class present half the loss."""
    n, positives = len(labels), float(labels.sum())
    negatives = n - positives
    if positives == 0 or negatives == 0:
        return 1.0, 1.0
    return n / (2 * negatives), n / (2 * positives)


def policy_floor(truth: np.ndarray, probs: np.ndarray, target_precision: float,
                 conservative: bool = False) -> float:
    """The lowest threshold at which labelled policy frames reach ``target_precision``.

    :func:`~success_detectors.metrics.select_threshold` on them; with no true success among them
    every claim is false, and the floor lies just above their highest score.
    """
    truth, probs = np.asarray(truth, dtype=bool), np.asarray(probs, dtype=np.float32)
    if not truth.any():
        return float(np.nextafter(probs.max(), np.float32(np.inf)))
    return select_threshold(truth, probs, target_precision, conservative=conservative).threshold


class DetectorRefresher:
    """Fine-tunes a CNN detector on the policy's own labelled frames during a run.

    Args:
        detector: The verifier, refreshed in place (its model and threshold).
        config: ``every``, ``label``, ``buffer``, ``steps``, ``batch_size``, ``learning_rate``,
            ``data``, ``replay_fraction``, ``target_precision``, ``conservative_threshold``,
            ``holdout``
            (:class:`harness.config.DetectorRefreshConfig`).
        seed: The run's seed.
        out_dir: Where the refreshed checkpoint and hard-negative sheets go; ``None``: nowhere.

    Raises:
        ValueError: ``data`` holds frames of another task, camera or size than the detector's,
            or a split without both classes.
    """

    def __init__(self, detector: CNNDetector, config: Any, seed: int,
                 out_dir: str | Path | None = None) -> None:
        from success_detectors import data

        self.detector, self.config, self.seed = detector, config, int(seed)
        self.out_dir = None if out_dir is None else Path(out_dir)
        views = detector.model.architecture.views
        self.shape = (detector.image_size, detector.image_size * views, 3)
        self.pixels = np.zeros((0, *self.shape), dtype=np.uint8)
        self.labels = np.zeros(0, dtype=bool)
        self.probs = np.zeros(0, dtype=np.float32)  # the detector's score when it was asked
        self.claimed = np.zeros(0, dtype=bool)  # it called the frame a success then
        self.margins = np.zeros(0, dtype=np.float32)  # metres outside success (NaN: unknown)
        self.added = np.zeros(0, dtype=np.int64)  # refresh number at which the frame arrived
        self.held_out = np.zeros(0, dtype=bool)  # kept out of fine-tuning, to set the threshold
        self.initial_threshold = float(detector.threshold)
        self.refreshes = self.labels_total = self.hard_negatives_total = 0
        self.replay = self.val = None
        if config.data is not None:
            attrs = data.read_attrs(config.data)
            wanted = {"task": detector.task, "camera": detector.camera,
                      "image_size": detector.image_size}
            for key, value in wanted.items():
                if attrs[key] != value:
                    raise ValueError(f"detector_refresh.data={config.data} holds frames with "
                                     f"{key}={attrs[key]!r}; the detector reads {value!r}")
            self.replay = data.read_split(config.data, "train")
            self.val = data.read_split(config.data, "val")
            for name, split in (("train", self.replay), ("val", self.val)):
                if split.label.all() or not split.label.any():
                    raise ValueError(f"detector_refresh.data={config.data}: its {name} split "
                                     f"has {split.class_counts()}; it needs both classes")

    # ------------------------------------------------------------------ labelling
    def observe(self, frames: np.ndarray, probs: np.ndarray, truth: np.ndarray,
                margins: np.ndarray | None = None) -> dict[str, float]:
        """Label one iteration's scored final frames and add them to the buffer.

        Args:
            frames: ``uint8 (A, H, W, 3)`` the frames the detector scored.
            probs: ``(A,)`` its success probabilities for them.
            truth: ``bool (A,)`` the labels (the scripted predicate's verdicts).
            margins: ``(A,)`` metres outside the success region, shown on the hard-negative
                sheets; ``None``: unknown.

        Returns:
            ``detector/labels_total`` (labels asked for so far: a person's workload on a
            robot), ``detector/hard_negatives_total`` (claimed successes labelled failure) and
            ``detector/refresh_buffer``.
        """
        probs, truth = np.asarray(probs, dtype=np.float32), np.asarray(truth, dtype=bool)
        claimed = probs >= self.detector.threshold
        asked = claimed if self.config.label == "claimed" else np.ones(len(truth), dtype=bool)
        count = np.arange(self.labels_total, self.labels_total + int(asked.sum()))
        share = self.config.holdout  # every 1/share-th label is held out, spread evenly
        held_out = np.floor((count + 1) * share) > np.floor(count * share)
        self.labels_total += int(asked.sum())
        self.hard_negatives_total += int((claimed & ~truth).sum())
        keep = self.config.buffer
        self.pixels = np.concatenate([self.pixels, frames[asked]])[-keep:]
        self.labels = np.concatenate([self.labels, truth[asked]])[-keep:]
        self.probs = np.concatenate([self.probs, probs[asked]])[-keep:]
        self.claimed = np.concatenate([self.claimed, claimed[asked]])[-keep:]
        margins = np.full(len(truth), np.nan, dtype=np.float32) if margins is None \
            else np.asarray(margins, dtype=np.float32)
        self.margins = np.concatenate([self.margins, margins[asked]])[-keep:]
        self.added = np.concatenate([self.added, np.full(int(asked.sum()), self.refreshes)])[-keep:]
        self.held_out = np.concatenate([self.held_out, held_out])[-keep:]
        return {"detector/labels_total": float(self.labels_total),
                "detector/hard_negatives_total": float(self.hard_negatives_total),
                "detector/refresh_buffer": float(len(self.labels))}

    def due(self, iteration: int) -> bool:
        """Whether a refresh follows ``iteration`` (counted from 1)."""
        return self.config.every > 0 and iteration % self.config.every == 0

    # ------------------------------------------------------------------ fine-tuning
    def refresh(self) -> dict[str, float]:
        """Fine-tune the detector on the buffer (and the replayed training split), choose its
        threshold again, write it out; returns ``detector/refresh_*`` metrics.

        A buffer without a hard negative or without a true success, and no training split to
        replay, has nothing to teach: the refresh is skipped (``detector/refresh_skipped``).
        """
        config, model = self.config, self.detector.model
        trainable = np.flatnonzero(~self.held_out)  # the buffer's frames that may train
        n_buffer, truth = len(trainable), self.labels[trainable]
        classes = n_buffer > 0 and truth.any() and not truth.all()
        if n_buffer == 0 or (self.replay is None and not classes):
            return {"detector/refresh_skipped": 1.0, "detector/refreshes": float(self.refreshes)}
        t0 = time.perf_counter()
        self.refreshes += 1
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.refreshes)
        augment = Augmentation()
        optimiser = torch.optim.AdamW(model.parameters(), lr=config.learning_rate,
                                      weight_decay=1e-4)
        from_replay = 0 if self.replay is None else round(config.replay_fraction
                                                           * config.batch_size)
        from_buffer = config.batch_size - from_replay
        buffer_pixels = torch.from_numpy(self.pixels[trainable])
        buffer_labels = torch.from_numpy(truth.astype(np.float32))
        hard_rows = torch.from_numpy(np.flatnonzero(self.claimed[trainable] & ~truth))
        from_hard = round(config.hard_negative_share * from_buffer) if len(hard_rows) else 0
        model.train()
        losses = []
        for _ in range(config.steps):
            index = torch.randint(0, n_buffer, (from_buffer - from_hard,), generator=generator)
            if from_hard:  # oversampled, so that the few frames the policy fools it with count
                pick = torch.randint(0, len(hard_rows), (from_hard,), generator=generator)
                index = torch.cat([index, hard_rows[pick]])
            pixels, labels = [buffer_pixels[index]], [buffer_labels[index]]
            if from_replay:
                rows = np.sort(torch.randint(0, len(self.replay), (from_replay,),
                                             generator=generator).numpy())
                pixels.append(torch.from_numpy(self.replay.pixels[rows]))
                labels.append(torch.from_numpy(self.replay.label[rows].astype(np.float32)))
            batch_labels = torch.cat(labels)
            loss = _loss(model, augment(torch.cat(pixels), generator), batch_labels,
                         _balanced_weights(batch_labels))
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
        model.eval()
        metrics = {"detector/refreshes": float(self.refreshes), "detector/refresh_skipped": 0.0,
                   "detector/refresh_loss": float(np.mean(losses))}
        if self.val is not None:
            val_probs = predict_pixels(model, self.val.pixels)
            choice = select_threshold(self.val.label, val_probs, config.target_precision,
                                      conservative=config.conservative_threshold)
            self.detector.threshold = float(choice.threshold)
        metrics.update(self._calibrate_on_policy())
        if self.val is not None:  # at the threshold the detector now holds
            val = binary_metrics(self.val.label, val_probs, self.detector.threshold)
            metrics.update({"detector/refresh_val_precision": float(val["precision"]),
                            "detector/refresh_val_recall": float(val["recall"])})
        hard = self.claimed & ~self.labels & ~self.held_out
        if hard.any():  # fitted, not held out: does the detector still claim them?
            still = predict_pixels(model, self.pixels[hard]) >= self.detector.threshold
            metrics["detector/refresh_hard_negatives_still_claimed"] = float(still.mean())
        metrics.update({"detector/threshold": float(self.detector.threshold),
                        "detector/refresh_s": time.perf_counter() - t0})
        self._write()
        return metrics

    def _calibrate_on_policy(self) -> dict[str, float]:
        """Raise the threshold until the held-out policy frames reach ``target_precision``.

        Only upwards from the validation split's choice (without ``data``, from the threshold the
        run started with), which stays a floor (:func:`policy_floor`). Fewer than
        ``MIN_HELD_OUT`` held-out frames: nothing moves.
        """
        held = np.flatnonzero(self.held_out)
        if self.config.holdout == 0 or len(held) < MIN_HELD_OUT:
            return {}
        truth = self.labels[held]
        probs = predict_pixels(self.detector.model, self.pixels[held])
        floor = policy_floor(truth, probs, self.config.target_precision,
                             self.config.conservative_threshold)
        base = self.detector.threshold if self.val is not None else self.initial_threshold
        self.detector.threshold = max(float(base), floor)
        claimed = probs >= self.detector.threshold
        wrong = claimed & ~truth
        return {"detector/refresh_policy_frames": float(len(held)),
                "detector/refresh_policy_precision":
                    float(truth[claimed].mean()) if claimed.any() else float("nan"),
                "detector/refresh_policy_recall":
                    float(claimed[truth].mean()) if truth.any() else float("nan"),
                "detector/refresh_policy_hard_negatives_claimed":
                    float(wrong.sum() / max(1, (~truth).sum()))}

    def _write(self) -> None:
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        detector = self.detector
        detector.training_summary = {
            **detector.training_summary,
            "refreshed": {"refreshes": self.refreshes, "labels": self.labels_total,
                          "hard_negatives": self.hard_negatives_total,
                          "label": self.config.label, "data": self.config.data},
        }
        detector.save(self.out_dir / f"{detector.task}_{detector.camera}.pt")
        fresh = np.flatnonzero(self.claimed & ~self.labels & ~self.held_out
                               & (self.added == self.refreshes - 1))
        if len(fresh):
            self._sheet(fresh[np.argsort(-self.probs[fresh])][:SHEET_FRAMES])

    def _sheet(self, rows: np.ndarray) -> None:
        """A PNG of the most confidently claimed hard negatives this refresh learnt from."""
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt

        from harness_common.plots import save_figure

        views = self.shape[1] // self.shape[0]
        columns = min(len(rows), SHEET_COLUMNS)
        lines = -(-len(rows) // columns)
        figure, axes = plt.subplots(lines, columns, figsize=(1.8 * views * columns,
                                                             2.0 * lines + 0.4), squeeze=False)
        for axis in axes.flat:
            axis.axis("off")
        for axis, row in zip(axes.flat, rows, strict=False):
            axis.imshow(self.pixels[row])
            margin = "" if np.isnan(self.margins[row]) else f", {1000 * self.margins[row]:+.0f} mm"
            axis.set_title(f"p={self.probs[row]:.2f}{margin}", fontsize=8)
        figure.suptitle(f"refresh {self.refreshes}: claimed successes the scripted check "
                        "calls failures (detector probability, mm outside success)", fontsize=9)
        save_figure(figure, self.out_dir / f"hard_negatives_{self.refreshes:03d}.png")

    # ------------------------------------------------------------------ resuming
    def state_dict(self) -> dict[str, Any]:
        return {"model": {k: v.detach().clone() for k, v in
                          self.detector.model.state_dict().items()},
                "threshold": float(self.detector.threshold),
                "initial_threshold": self.initial_threshold,
                "pixels": torch.from_numpy(self.pixels.copy()),
                "labels": torch.from_numpy(self.labels.copy()),
                "probs": torch.from_numpy(self.probs.copy()),
                "claimed": torch.from_numpy(self.claimed.copy()),
                "margins": torch.from_numpy(self.margins.copy()),
                "added": torch.from_numpy(self.added.copy()),
                "held_out": torch.from_numpy(self.held_out.copy()),
                "counts": [self.refreshes, self.labels_total, self.hard_negatives_total]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.detector.model.load_state_dict(state["model"])
        self.detector.model.eval()
        self.detector.threshold = float(state["threshold"])
        self.initial_threshold = float(state.get("initial_threshold", self.initial_threshold))
        self.pixels = state["pixels"].numpy().copy()
        self.labels = state["labels"].numpy().copy()
        self.probs = state["probs"].numpy().copy()
        self.claimed = state["claimed"].numpy().copy()
        self.margins = state["margins"].numpy().copy()
        self.added = state["added"].numpy().copy()
        self.held_out = state["held_out"].numpy().copy() if "held_out" in state \
            else np.zeros(len(self.labels), dtype=bool)  # saved before holdout existed
        self.refreshes, self.labels_total, self.hard_negatives_total = \
            (int(v) for v in state["counts"])
