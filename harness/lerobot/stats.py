"""Feature statistics as LeRobot stores them (``meta/stats.json`` and the ``stats/...`` columns
of the episodes table): ``min``, ``max``, ``mean``, ``std``, ``count`` and the quantiles
``q01 q10 q50 q90 q99``.

Vectors get one value per entry (shape ``(D,)``); images one per colour channel, scaled to
[0, 1] and shaped ``(3, 1, 1)`` so they broadcast over ``(C, H, W)`` frames, as LeRobot's
``compute_stats`` does. ``count`` is the number of frames. LeRobot estimates quantiles from
histograms; here vectors get ``numpy.quantile`` (linear interpolation) and images, whose values
are 256 levels, the exact lowest level whose cumulative share reaches ``q``.
"""

from __future__ import annotations

import numpy as np

from harness.lerobot.layout import QUANTILES

Stats = dict[str, np.ndarray]


def _quantile_key(q: float) -> str:
    return f"q{round(q * 100):02d}"


def vector_stats(values: np.ndarray) -> Stats:
    """Statistics of a feature over frames.

    Args:
        values: ``(N,)`` or ``(N, D)`` numbers or booleans, ``N >= 1``.

    Returns:
        Each statistic as an array of shape ``(D,)`` (``(1,)`` for one value per frame);
        ``min`` and ``max`` keep the values' dtype, the others are float64; ``count`` is ``[N]``.
    """
    values = np.asarray(values).reshape(len(values), -1)  # (N, D)
    numbers = values.astype(np.float64)
    stats = {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": numbers.mean(axis=0),
        "std": numbers.std(axis=0),
        "count": np.array([len(values)], dtype=np.int64),
    }
    for q, level in zip(QUANTILES, np.quantile(numbers, QUANTILES, axis=0), strict=True):
        stats[_quantile_key(q)] = level
    return stats


def image_stats(frames: np.ndarray) -> Stats:
    """Per-channel statistics of uint8 frames, in [0, 1], from each channel's 256-bin histogram.

    Args:
        frames: ``(N, H, W, C)`` uint8, ``N >= 1``.

    Returns:
        Each statistic of shape ``(C, 1, 1)`` (float64), ``count`` ``[N]``.
    """
    channels = frames.shape[-1]
    histograms = np.stack([np.bincount(frames[..., c].ravel(), minlength=256)
                           for c in range(channels)])  # (C, 256)
    return {**_histogram_stats(histograms),
            "count": np.array([len(frames)], dtype=np.int64)}


def _histogram_stats(histograms: np.ndarray) -> Stats:
    """``min``, ``max``, ``mean``, ``std`` and quantiles (not ``count``) of 8-bit channels given
    by their ``(C, 256)`` histograms, scaled to [0, 1] and shaped ``(C, 1, 1)``."""
    levels = np.arange(256, dtype=np.float64)
    total = histograms.sum(axis=1, keepdims=True)  # (C, 1)
    share = histograms / total
    mean = (share * levels).sum(axis=1)
    std = np.sqrt((share * (levels - mean[:, None]) ** 2).sum(axis=1))
    present = histograms > 0
    stats = {
        "min": present.argmax(axis=1).astype(np.float64),
        "max": 255 - present[:, ::-1].argmax(axis=1).astype(np.float64),
        "mean": mean,
        "std": std,
    }
    cumulative = np.cumsum(share, axis=1)
    for q in QUANTILES:
        stats[_quantile_key(q)] = (cumulative >= q - 1e-12).argmax(axis=1).astype(np.float64)
    return {key: (value / 255.0).reshape(-1, 1, 1) for key, value in stats.items()}


def to_json(stats: Stats) -> dict[str, list]:
    """Statistics as JSON lists (numpy scalars turned into Python numbers)."""
    return {key: value.tolist() for key, value in stats.items()}
