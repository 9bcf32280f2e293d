"""The success band: sample where groups carry signal, widen the frontier as it gets easy."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.curriculum.base import Curriculum, Seed, check_unit
from harness.curriculum.table import signal_probability


class SuccessBandCurriculum(Curriculum):
    """Sample where groups carry signal; widen the frontier when its edge gets easy.

    Bins ``0..frontier_bin`` are unlocked. Each unlocked bin with estimated success p (see
    ``SuccessTable``: discounted Beta counts, unseen bins read 0.5) gets weight
    ``signal_probability(p, group_size)``. That formula treats a group's attempts as independent
    draws at the bin's mean success; when start states differ (some nearly always solved, some
    nearly never) a bin's groups split less often than it says (docs/results.md). If some
    unlocked bins lie in the band [low, high], sampling picks among them in proportion to weight
    with probability ``1 - explore``, and uniformly among the other unlocked bins with probability
    ``explore``; if none do, all unlocked bins are candidates. The difficulty is uniform within
    the chosen bin.

    After each update, once the hardest unlocked bin has ``min_obs`` outcomes since the frontier
    last moved, the next bin is unlocked if its estimate exceeds ``high`` and it is locked again if
    its estimate is below ``low`` (at least one bin always stays unlocked). Whenever the frontier
    moves onto a bin, by unlocking it or by falling back to it, that bin's counts are reset to the
    prior (``SuccessTable.reset_bin``), so only outcomes observed there since the move decide the
    next move; the bin left behind keeps its counts. Without the reset, counts from a visit long
    ago (never discounted while the bin was locked) could lock a re-unlocked bin again at once.

    Args:
        num_bins: Number of difficulty bins over [0, 1], at least 1.
        low: Lower edge of the success band, in [0, 1].
        high: Upper edge of the success band, in [0, 1], above ``low``.
        group_size: Attempts per group G used in the signal weight, at least 2.
        explore: Share of samples spread over unlocked bins outside the band, in [0, 1].
        min_obs: Outcomes needed at the hardest unlocked bin before the frontier moves.
        initial_frontier: Index of the hardest bin unlocked at the start.
        prior: Beta prior pseudo-count, > 0.
        decay: Per-outcome discount of old counts, in (0, 1].
        seed: See ``Curriculum``.

    Raises:
        ValueError: If an argument is out of range.
    """

    def __init__(
        self,
        num_bins: int = 10,
        low: float = 0.2,
        high: float = 0.8,
        group_size: int = 8,
        explore: float = 0.1,
        min_obs: int = 16,
        initial_frontier: int = 0,
        prior: float = 1.0,
        decay: float = 0.98,
        *,
        seed: Seed = 0,
    ) -> None:
        super().__init__(seed=seed, num_bins=num_bins, prior=prior, decay=decay)
        self.low = check_unit("low", low)
        self.high = check_unit("high", high)
        if self.low >= self.high:
            raise ValueError(f"low must be < high, got low={low!r}, high={high!r}")
        if int(group_size) != group_size or group_size < 2:
            raise ValueError(f"group_size must be an integer >= 2, got {group_size!r}")
        self.group_size = int(group_size)
        self.explore = check_unit("explore", explore)
        if int(min_obs) != min_obs or min_obs < 0:
            raise ValueError(f"min_obs must be an integer >= 0, got {min_obs!r}")
        self.min_obs = int(min_obs)
        if int(initial_frontier) != initial_frontier or not 0 <= initial_frontier < num_bins:
            raise ValueError(
                f"initial_frontier must be an integer in [0, {num_bins - 1}], "
                f"got {initial_frontier!r}"
            )
        self.frontier_bin = int(initial_frontier)
        self._samples_at_move = 0

    def bin_probabilities(self) -> np.ndarray:
        """Probability of sampling each bin next, shape (num_bins,); locked bins get 0."""
        unlocked = self.frontier_bin + 1
        p = self.table.estimate()[:unlocked]
        weight = np.asarray(signal_probability(p, self.group_size))
        in_band = (p >= self.low) & (p <= self.high)
        candidates = in_band if in_band.any() else np.ones(unlocked, dtype=bool)
        others = ~candidates if (~candidates).any() else candidates
        candidate_weight = np.where(candidates, weight, 0.0)
        if candidate_weight.sum() > 0.0:
            informative = candidate_weight / candidate_weight.sum()
        else:
            informative = candidates / candidates.sum()
        spread = others / others.sum()
        probs = np.zeros(self.table.num_bins)
        probs[:unlocked] = (1.0 - self.explore) * informative + self.explore * spread
        return probs

    def sample(self) -> float:
        """Draw a bin by ``bin_probabilities``, then a difficulty uniformly inside it."""
        index = int(self._rng.choice(self.table.num_bins, p=self.bin_probabilities()))
        lo, hi = self.table.bin_range(index)
        return float(self._rng.uniform(lo, hi))

    def _after_update(self, index: int) -> None:
        if index != self.frontier_bin:
            return
        if self.table.samples[index] - self._samples_at_move < self.min_obs:
            return
        p_edge = self.table.estimate()[index]
        if p_edge > self.high and index < self.table.num_bins - 1:
            self._move_frontier(index + 1)
        elif p_edge < self.low and index > 0:
            self._move_frontier(index - 1)

    def _move_frontier(self, index: int) -> None:
        # Only outcomes seen after the move may move the frontier again, so a bin that was just
        # re-exposed must prove itself afresh rather than on counts from before: its counts are
        # cleared, and ``min_obs`` counts its cumulative samples from here.
        self.frontier_bin = index
        self.table.reset_bin(index)
        self._samples_at_move = int(self.table.samples[index])

    @property
    def frontier(self) -> float:
        """Upper difficulty of the hardest unlocked bin."""
        return self.table.bin_range(self.frontier_bin)[1]

    def metrics(self) -> dict[str, float]:
        """``Curriculum.metrics`` plus ``curriculum/bin_{i}_prob``, the sampling probability."""
        out = super().metrics()
        for i, prob in enumerate(self.bin_probabilities()):
            out[f"curriculum/bin_{i}_prob"] = float(prob)
        return out

    def state_dict(self) -> dict[str, Any]:
        """``Curriculum.state_dict`` plus the frontier."""
        return {
            **super().state_dict(),
            "frontier_bin": self.frontier_bin,
            "samples_at_move": self._samples_at_move,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` into a curriculum built with the same parameters."""
        super().load_state_dict(state)
        self.frontier_bin = int(state["frontier_bin"])
        self._samples_at_move = int(state["samples_at_move"])
