"""Labelled frames in memory (:class:`FrameSet`) and how they are split and balanced.

Frames are split into train/val/test *by episode* (:func:`split_episodes`), so no episode feeds
two splits; each split is then class-balanced (:func:`balance_classes`), keeping up to a share of
its negatives from near-misses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

COLUMNS = ("label", "episode", "step", "difficulty", "margin", "policy")


@dataclass
class FrameSet:
    """Labelled frames, one row per frame.

    Attributes:
        pixels: ``uint8 (N, H, W, 3)`` RGB frames.
        label: ``bool (N,)`` success labels.
        episode: ``int64 (N,)`` episode ids (one id per photo for image folders).
        step: ``int32 (N,)`` control step within the episode (0 for photos).
        difficulty: ``float32 (N,)`` difficulty of the episode (NaN for photos).
        margin: ``float32 (N,)`` metres outside the success region, negative inside (NaN when
            unknown, as for photos).
        policy: ``int8 (N,)`` index into
            :data:`success_detectors.episode_policies.POLICIES` (-1 for photos).
        names: Optional file names of photos, for figures.
    """

    pixels: np.ndarray
    label: np.ndarray
    episode: np.ndarray
    step: np.ndarray
    difficulty: np.ndarray
    margin: np.ndarray
    policy: np.ndarray
    names: list[str] | None = None

    def __post_init__(self) -> None:
        n = len(self.pixels)
        for column in COLUMNS:
            if len(getattr(self, column)) != n:
                raise ValueError(f"FrameSet.{column} has {len(getattr(self, column))} rows; "
                                 f"pixels has {n}")

    def __len__(self) -> int:
        return len(self.pixels)

    def subset(self, index: np.ndarray) -> FrameSet:
        """The rows ``index`` (integer indices or a boolean mask)."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        names = None if self.names is None else [self.names[i] for i in index]
        return FrameSet(self.pixels[index], *(getattr(self, c)[index] for c in COLUMNS), names)

    @staticmethod
    def concatenate(parts: Sequence[FrameSet], image_shape: tuple[int, int, int]) -> FrameSet:
        """Join frame sets row-wise (an empty sequence gives an empty set of ``image_shape``)."""
        if not parts:
            return empty_frames(image_shape)
        names = None
        if all(p.names is not None for p in parts):
            names = [name for p in parts for name in p.names]
        return FrameSet(
            np.concatenate([p.pixels for p in parts]),
            *(np.concatenate([getattr(p, c) for p in parts]) for c in COLUMNS),
            names,
        )

    def class_counts(self) -> dict[str, int]:
        positives = int(np.sum(self.label))
        return {"positives": positives, "negatives": len(self) - positives}


def empty_frames(image_shape: tuple[int, int, int]) -> FrameSet:
    return FrameSet(
        np.zeros((0, *image_shape), np.uint8), np.zeros(0, bool), np.zeros(0, np.int64),
        np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.float32),
        np.zeros(0, np.int8),
    )


def split_episodes(
    episodes: Iterable[int], fractions: Sequence[float] = (0.7, 0.15, 0.15), seed: int = 0
) -> dict[str, np.ndarray]:
    """Assign whole episodes to train/val/test at random.

    Args:
        episodes: Episode ids (repeats allowed: one per frame).
        fractions: Shares of episodes for train, val and test; they must sum to 1.
        seed: Seed of the shuffle.

    Returns:
        ``{"train": ids, "val": ids, "test": ids}``, disjoint, every id in exactly one split.
        With at least three episodes, every split gets at least one.

    Raises:
        ValueError: Fractions not three non-negative numbers summing to 1, or no episodes.
    """
    fractions = np.asarray(fractions, dtype=float)
    if fractions.shape != (3,) or np.any(fractions < 0) or not np.isclose(fractions.sum(), 1):
        raise ValueError(f"split fractions={fractions.tolist()}; expected three shares "
                         "(train, val, test) >= 0 summing to 1")
    ids = np.unique(np.asarray(list(episodes), dtype=np.int64))
    if len(ids) == 0:
        raise ValueError("no episodes to split")
    ids = np.random.default_rng(seed).permutation(ids)
    counts = np.floor(fractions * len(ids)).astype(int)
    counts[0] = len(ids) - counts[1] - counts[2]
    if len(ids) >= 3:  # every split with a positive share gets at least one episode
        for i in (1, 2):
            if fractions[i] > 0 and counts[i] == 0 and counts[0] > 1:
                counts[i], counts[0] = 1, counts[0] - 1
    bounds = np.cumsum(counts)
    return {
        "train": np.sort(ids[:bounds[0]]),
        "val": np.sort(ids[bounds[0]:bounds[1]]),
        "test": np.sort(ids[bounds[1]:]),
    }


def split_frames(
    frames: FrameSet, fractions: Sequence[float] = (0.7, 0.15, 0.15), seed: int = 0
) -> dict[str, FrameSet]:
    """Split frames into train/val/test by episode (no episode in two splits)."""
    assignment = split_episodes(frames.episode, fractions, seed)
    return {name: frames.subset(np.isin(frames.episode, ids)) for name, ids in assignment.items()}


def balance_classes(
    frames: FrameSet, hard_margin: float, hard_fraction: float, seed: int = 0
) -> np.ndarray:
    """Indices of a class-balanced subset that keeps near-miss negatives.

    Both classes get ``n = min(#positives, #negatives)`` frames. Negatives are drawn first from
    near-misses (``0 <= margin < hard_margin``), up to ``hard_fraction * n``, then from the rest
    (and again from near-misses if the rest runs out).

    Args:
        frames: Frames with labels and margins.
        hard_margin: Metres outside the success region that still count as a near-miss.
        hard_fraction: Largest share of the kept negatives that are near-misses.
        seed: Seed of the draws.

    Returns:
        Sorted row indices.
    """
    if not 0 <= hard_fraction <= 1:
        raise ValueError(f"hard_fraction={hard_fraction}; expected a share in [0, 1]")
    rng = np.random.default_rng(seed)
    positives = np.flatnonzero(frames.label)
    negatives = np.flatnonzero(~frames.label)
    n = min(len(positives), len(negatives))
    near = frames.margin[negatives] < hard_margin  # NaN (unknown) compares False: not near
    hard, easy = rng.permutation(negatives[near]), rng.permutation(negatives[~near])
    take_hard = min(len(hard), int(round(hard_fraction * n)))
    take_easy = min(len(easy), n - take_hard)
    take_hard = min(len(hard), n - take_easy)
    chosen = np.concatenate((
        rng.choice(positives, n, replace=False), hard[:take_hard], easy[:take_easy]
    ))
    return np.sort(chosen)
