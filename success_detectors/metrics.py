"""Metrics of a binary success detector, as pure functions of labels and scores.

ROC-AUC (Mann-Whitney U), expected calibration error (Guo et al. 2017), the confusion-matrix
metrics at a threshold (:func:`binary_metrics`), the threshold choice for a target precision
(:func:`select_threshold`) and errors binned by the distance to the success boundary
(:func:`errors_by_margin`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from harness_common.stats import wilson_interval

MARGIN_BINS_CM = (0.0, 0.25, 0.5, 1.0, 2.0, 5.0, float("inf"))


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


def ratio_or_nan(numerator: float, denominator: float) -> float:
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
    precision, recall = ratio_or_nan(tp, tp + fp), ratio_or_nan(tp, tp + fn)
    return {
        "accuracy": ratio_or_nan(tp + tn, len(labels)),
        "precision": precision,
        "recall": recall,
        "f1": ratio_or_nan(2 * tp, 2 * tp + fp + fn),
        "roc_auc": roc_auc(labels, probs),
        "ece": expected_calibration_error(labels, probs, bins),
        "threshold": float(threshold),
        "confusion_matrix": [[tn, fp], [fn, tp]],
        "false_positive_rate": ratio_or_nan(fp, fp + tn),
        "false_negative_rate": ratio_or_nan(fn, fn + tp),
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
