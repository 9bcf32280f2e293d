"""Per-bin success estimates, and the probability that a group of attempts carries signal."""

from __future__ import annotations

from typing import Any

import numpy as np


def signal_probability(p: float | np.ndarray, group_size: int) -> float | np.ndarray:
    """Probability that a group of Bernoulli(p) outcomes is not all equal.

    A group-relative advantage ((r - mean) / std as in GRPO, Shao et al. 2024) is zero for every
    attempt when all G rewards are equal, so only groups with mixed outcomes carry gradient:
    ``1 - p**G - (1 - p)**G``.

    Args:
        p: Success probability of one attempt, in [0, 1]; a scalar or an array of any shape.
        group_size: Number of attempts G in the group, at least 1.

    Returns:
        The probability, with the shape of ``p`` (a float for a scalar ``p``).

    Raises:
        ValueError: If ``p`` lies outside [0, 1] or ``group_size`` < 1.
    """
    return 1.0 - no_signal_probability(p, group_size)


def no_signal_probability(p: float | np.ndarray, group_size: int) -> float | np.ndarray:
    """Probability that a group of Bernoulli(p) outcomes is all successes or all failures.

    ``p**G + (1 - p)**G``; e.g. p = 0.05, G = 8 gives 0.6634: two groups in three are wasted.

    Args:
        p: Success probability of one attempt, in [0, 1]; a scalar or an array of any shape.
        group_size: Number of attempts G in the group, at least 1.

    Returns:
        The probability, with the shape of ``p`` (a float for a scalar ``p``).

    Raises:
        ValueError: If ``p`` lies outside [0, 1] or ``group_size`` < 1.
    """
    if int(group_size) != group_size or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    p_arr = np.asarray(p, dtype=np.float64)
    if np.any((p_arr < 0.0) | (p_arr > 1.0)) or np.any(np.isnan(p_arr)):
        raise ValueError(f"p must be in [0, 1], got {p!r}")
    prob = p_arr**group_size + (1.0 - p_arr) ** group_size
    return float(prob) if prob.ndim == 0 else prob



class SuccessTable:
    """Per-bin success estimates over [0, 1] from discounted Beta counts.

    Bin ``i`` covers difficulties [i / num_bins, (i + 1) / num_bins) (the last bin includes 1).
    Each bin holds a Beta(prior + s, prior + f) posterior whose counts s, f are discounted: before
    n new outcomes are added, both are multiplied by ``decay**n``, so the estimate follows roughly
    the last ``1 / (1 - decay)`` outcomes as the policy improves (``decay=1`` keeps plain counts).
    The estimate is the posterior mean, so an unseen bin reads 0.5. Counts are discounted only
    when their bin receives outcomes, so a bin left unsampled keeps them however old they are;
    ``reset_bin`` clears them. ``samples`` is the cumulative number of outcomes per bin and is
    never cleared.

    Args:
        num_bins: Number of bins, at least 1.
        prior: Pseudo-count of successes and of failures, > 0.
        decay: Per-outcome discount of old counts, in (0, 1].

    Raises:
        ValueError: If an argument is out of range.
    """

    def __init__(self, num_bins: int = 10, prior: float = 1.0, decay: float = 0.98) -> None:
        if int(num_bins) != num_bins or num_bins < 1:
            raise ValueError(f"num_bins must be an integer >= 1, got {num_bins!r}")
        if not prior > 0.0:
            raise ValueError(f"prior must be > 0, got {prior!r}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.num_bins = int(num_bins)
        self.prior = float(prior)
        self.decay = float(decay)
        self.successes = np.zeros(self.num_bins)
        self.failures = np.zeros(self.num_bins)
        self.samples = np.zeros(self.num_bins, dtype=np.int64)

    def bin_of(self, difficulty: float) -> int:
        """Index of the bin holding ``difficulty`` (in [0, 1])."""
        return min(int(difficulty * self.num_bins), self.num_bins - 1)

    def bin_range(self, index: int) -> tuple[float, float]:
        """Lower and upper difficulty of bin ``index``."""
        return index / self.num_bins, (index + 1) / self.num_bins

    def record(self, index: int, outcomes: np.ndarray) -> None:
        """Add outcomes (each in [0, 1]) observed at bin ``index``."""
        discount = self.decay ** len(outcomes)
        self.successes[index] = self.successes[index] * discount + outcomes.sum()
        self.failures[index] = self.failures[index] * discount + (1.0 - outcomes).sum()
        self.samples[index] += len(outcomes)

    def reset_bin(self, index: int) -> None:
        """Clear the success and failure counts of bin ``index``.

        The bin's estimate returns to the prior (0.5); its cumulative ``samples`` are kept.
        """
        self.successes[index] = 0.0
        self.failures[index] = 0.0

    def estimate(self) -> np.ndarray:
        """Posterior-mean success probability of every bin, shape (num_bins,)."""
        return (self.successes + self.prior) / (self.successes + self.failures + 2 * self.prior)

    def state_dict(self) -> dict[str, Any]:
        """Counts as plain lists."""
        return {
            "successes": self.successes.tolist(),
            "failures": self.failures.tolist(),
            "samples": self.samples.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counts written by ``state_dict`` (other keys, such as the group counts that
        older versions kept, are ignored)."""
        if len(state["samples"]) != self.num_bins:
            raise ValueError(
                f"state has {len(state['samples'])} bins, this table has {self.num_bins}"
            )
        self.successes = np.asarray(state["successes"], dtype=np.float64)
        self.failures = np.asarray(state["failures"], dtype=np.float64)
        self.samples = np.asarray(state["samples"], dtype=np.int64)
