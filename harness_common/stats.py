"""Small statistics shared by evaluation, reports and scripts."""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Sequence
from typing import Any


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


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact (conditional) McNemar p-value from the discordant pairs.

    Under the null of no change each discordant pair is equally likely to go either way, so the
    smaller count is ``Binomial(b + c, 1/2)``: ``p = min(1, 2 * P(X <= min(b, c)))``, summed in
    exact integer arithmetic.

    Args:
        b: Pairs where only the first ("before") measurement succeeded.
        c: Pairs where only the second ("after") measurement succeeded.

    Returns:
        The p-value in (0, 1]; 1.0 when there is no discordant pair.

    Raises:
        ValueError: ``b`` or ``c`` is not a non-negative integer; the message names it.
    """
    for name, value in (("b", b), ("c", c)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name}={value!r}; expected a non-negative integer count")
    n = int(b) + int(c)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1))
    return min(1.0, tail / 2 ** (n - 1))  # 2 * tail / 2**n, one correctly rounded division


def paired_difference_interval(
    before: Sequence[bool], after: Sequence[bool], z: float = 1.959964
) -> tuple[float, float]:
    """Interval for the difference of two paired proportions, ``p_after - p_before``.

    Newcombe (1998, "Improved confidence intervals for the difference between binomial
    proportions based on paired data", Statistics in Medicine 17:2635, method 10): the Wilson
    intervals ``(l, u)`` of each margin are combined as
    ``L = d - sqrt((p_a - l_a)^2 + (u_b - p_b)^2 - 2 phi (p_a - l_a)(u_b - p_b))`` and
    ``U = d + sqrt((p_b - l_b)^2 + (u_a - p_a)^2 - 2 phi (p_b - l_b)(u_a - p_a))``, where
    ``d = p_a - p_b`` and ``phi`` is the correlation of the paired outcomes with Newcombe's
    correction: with ``A = both * neither - after_only * before_only``, ``phi`` is
    ``(A - n/2) / sqrt(product of the four margins)`` when ``A > n/2``, 0 when
    ``0 <= A <= n/2``, and ``A / sqrt(...)`` when ``A < 0``; 0 when a margin is empty.

    Args:
        before: Per pair, the first outcome (e.g. the policy before training on a start state).
        after: Per pair, the second outcome on the same start state.
        z: Normal quantile of the two-sided level (95% by default).

    Returns:
        ``(low, high)`` bounds of ``p_after - p_before``, within [-1, 1].

    Raises:
        ValueError: The sequences are empty or differ in length.
    """
    both, before_only, after_only, neither = _paired_counts(before, after)
    n = both + before_only + after_only + neither
    after_successes, before_successes = both + after_only, both + before_only
    p_after, p_before = after_successes / n, before_successes / n
    l_after, u_after = wilson_interval(after_successes, n, z)
    l_before, u_before = wilson_interval(before_successes, n, z)
    margins = after_successes * (n - after_successes) * before_successes * (n - before_successes)
    association = both * neither - after_only * before_only
    if margins == 0 or 0 <= association <= n / 2:
        phi = 0.0
    elif association > n / 2:
        phi = (association - n / 2) / math.sqrt(margins)
    else:
        phi = association / math.sqrt(margins)
    difference = p_after - p_before
    down_a, up_b = p_after - l_after, u_before - p_before
    down_b, up_a = p_before - l_before, u_after - p_after
    delta = math.sqrt(max(0.0, down_a**2 + up_b**2 - 2 * phi * down_a * up_b))
    epsilon = math.sqrt(max(0.0, down_b**2 + up_a**2 - 2 * phi * down_b * up_a))
    return max(-1.0, difference - delta), min(1.0, difference + epsilon)


def paired_summary(before: Sequence[bool], after: Sequence[bool]) -> dict[str, Any]:
    """Change of the success rate between two paired evaluations (the same start states).

    Args:
        before: Per pair, the first outcome.
        after: Per pair, the second outcome.

    Returns:
        ``{"improvement": p_after - p_before, "improvement_interval": [low, high]`` (Newcombe's
        95% interval, :func:`paired_difference_interval`), ``"improvement_p_value"`` (exact
        McNemar, :func:`mcnemar_exact`), ``"discordant": {"before_only": b, "after_only": c}}``.

    Raises:
        ValueError: The sequences are empty or differ in length.
    """
    both, before_only, after_only, neither = _paired_counts(before, after)
    n = both + before_only + after_only + neither
    low, high = paired_difference_interval(before, after)
    return {
        "improvement": (after_only - before_only) / n,
        "improvement_interval": [low, high],
        "improvement_p_value": mcnemar_exact(before_only, after_only),
        "discordant": {"before_only": before_only, "after_only": after_only},
    }


def _paired_counts(before: Sequence[bool], after: Sequence[bool]) -> tuple[int, int, int, int]:
    """``(both, before_only, after_only, neither)`` of two equally long outcome sequences."""
    if len(before) != len(after) or len(before) == 0:
        raise ValueError(
            f"len(before)={len(before)}, len(after)={len(after)}; expected two equally long,"
            " non-empty sequences of paired outcomes"
        )
    counts = Counter((bool(x), bool(y)) for x, y in zip(before, after, strict=True))
    return counts[True, True], counts[True, False], counts[False, True], counts[False, False]
