"""Small statistics shared by evaluation, reports and scripts."""

from __future__ import annotations

import math


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default).

    Args:
        successes: Number of successes, ``0 <= successes <= trials``.
        trials: Number of trials; 0 gives the uninformative interval ``(0, 1)``.
        z: Normal quantile of the two-sided level.

    Returns:
        ``(low, high)`` bounds in [0, 1].
    """
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(
            f"successes={successes}, trials={trials}; expected 0 <= successes <= trials"
        )
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)
