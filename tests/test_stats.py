"""Interval and test statistics against numbers worked out by hand or published elsewhere."""

from __future__ import annotations

import pytest

from harness_common.stats import (
    mcnemar_exact,
    paired_difference_interval,
    paired_summary,
    wilson_interval,
)


def pairs(both: int, before_only: int, after_only: int, neither: int) -> tuple[list, list]:
    """``(before, after)`` outcome lists holding the four cells of a paired 2x2 table."""
    before = [True] * both + [True] * before_only + [False] * after_only + [False] * neither
    after = [True] * both + [False] * before_only + [True] * after_only + [False] * neither
    return before, after


def test_wilson_interval_matches_hand_computed_bounds():
    # z^2 = 3.841459, so 1 + z^2/n = 1.3841459 for n = 10.
    # 0/10: centre = (z^2/20) / 1.3841459 = 0.138767 and the half-width is the same,
    # so the upper bound is 0.277533.
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=5e-5)
    # 5/10: centre 0.5, half = z sqrt(0.025 + z^2/400) / 1.3841459 = 0.263409.
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=5e-5)


def test_mcnemar_exact_matches_binomial_tails():
    assert mcnemar_exact(0, 5) == 2 * 0.5**5 == 0.0625
    # P(X <= 1) for Binomial(10, 1/2) is (1 + 10) / 1024; doubled: 22 / 1024.
    assert mcnemar_exact(1, 9) == 0.021484375
    assert mcnemar_exact(9, 1) == 0.021484375
    # A balanced split doubles a tail above 1/2: capped at 1.
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(0, 0) == 1.0
    # Cavo et al. 2012 (6 and 16 discordant pairs): C(22, 0..6) sum to 110056, and
    # 2 * 110056 / 2^22 = 0.052479, as Fagerland, Lydersen & Laake's book reports.
    assert mcnemar_exact(6, 16) == pytest.approx(0.052479, abs=5e-7)


@pytest.mark.parametrize(("b", "c", "bad"), [(-1, 3, "b=-1"), (2, 1.5, "c=1.5"),
                                             (2, "3", "c='3'")])
def test_mcnemar_exact_names_a_bad_count(b, c, bad):
    with pytest.raises(ValueError, match=bad):
        mcnemar_exact(b, c)


def test_newcombe_interval_when_a_margin_is_empty():
    # 10 pairs: before never succeeds, after succeeds in 5. A margin is empty, so phi = 0.
    # Wilson: before 0/10 -> (0, 0.277533), after 5/10 -> (0.236591, 0.763409).
    # L = 0.5 - sqrt((0.5 - 0.236591)^2 + (0.277533 - 0)^2) = 0.5 - 0.382634 = 0.117366
    # U = 0.5 + sqrt((0 - 0)^2 + (0.763409 - 0.5)^2) = 0.763409
    before, after = pairs(both=0, before_only=0, after_only=5, neither=5)
    assert paired_difference_interval(before, after) == pytest.approx((0.11737, 0.76341),
                                                                      abs=1e-5)


def test_newcombe_interval_with_perfectly_opposed_pairs():
    # 4 pairs, two succeed only before and two only after: A = 0 * 0 - 2 * 2 = -4 < 0, so
    # phi = -4 / sqrt(2 * 2 * 2 * 2) = -1. Both margins are 2/4, Wilson (0.150038, 0.849962),
    # a distance x = 0.349962 from 0.5; with phi = -1 each side is sqrt(x^2 + x^2 + 2 x^2) = 2x.
    before, after = pairs(both=0, before_only=2, after_only=2, neither=0)
    assert paired_difference_interval(before, after) == pytest.approx((-0.69992, 0.69992),
                                                                      abs=1e-5)


def test_newcombe_interval_matches_the_published_cavo_example():
    # Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables" (2017),
    # chapter 8: complete response after (rows) and before (columns) consolidation therapy,
    # n11 = 59, n12 = 6, n21 = 16, n22 = 80; Newcombe square-and-add -0.0621 (-0.1186 to
    # -0.0046). Here A = 59 * 80 - 6 * 16 = 4624 > n/2, so phi uses A - n/2.
    before, after = pairs(both=59, before_only=16, after_only=6, neither=80)
    assert paired_difference_interval(before, after) == pytest.approx((-0.1186, -0.0046),
                                                                      abs=5e-5)
    # Swapping the roles mirrors the interval.
    assert paired_difference_interval(after, before) == pytest.approx((0.0046, 0.1186),
                                                                      abs=5e-5)


def test_paired_summary_reports_the_change_with_its_interval_and_p_value():
    before, after = pairs(both=0, before_only=0, after_only=5, neither=5)
    summary = paired_summary(before, after)
    assert summary["improvement"] == 0.5
    assert summary["improvement_interval"] == pytest.approx([0.11737, 0.76341], abs=1e-5)
    assert summary["improvement_p_value"] == 0.0625
    assert summary["discordant"] == {"before_only": 0, "after_only": 5}


@pytest.mark.parametrize(("before", "after"), [([], []), ([True, False], [True])])
def test_paired_statistics_need_equally_long_non_empty_outcomes(before, after):
    with pytest.raises(ValueError, match=f"len\\(before\\)={len(before)}"):
        paired_difference_interval(before, after)
    with pytest.raises(ValueError, match=f"len\\(after\\)={len(after)}"):
        paired_summary(before, after)
