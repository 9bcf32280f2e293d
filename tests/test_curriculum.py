"""Curricula on synthetic success functions; signal probability against the closed form."""

from __future__ import annotations

import importlib
import json
from collections import Counter

import numpy as np
import pytest

from harness import curriculum
from harness.curriculum import (
    SuccessBandCurriculum,
    SuccessTable,
    make,
    no_signal_probability,
    signal_probability,
)

GROUP_SIZE = 8


def play(cur, success, groups: int, seed: int = 0) -> Counter:
    """Run ``groups`` groups of Bernoulli(success(d)) outcomes; count the sampled bins."""
    rng = np.random.default_rng(seed)
    bins: Counter = Counter()
    for _ in range(groups):
        d = cur.sample()
        bins[cur.table.bin_of(d)] += 1
        cur.update(d, rng.random(GROUP_SIZE) < success(d))
    return bins


# --- signal probability: closed form -------------------------------------------------------


def test_no_signal_probability_matches_hand_computed_value():
    # 0.95**8 + 0.05**8 = 0.66342043 + 3.9e-11
    assert no_signal_probability(0.05, 8) == pytest.approx(0.6634204, abs=1e-6)
    assert signal_probability(0.05, 8) == pytest.approx(1 - 0.6634204, abs=1e-6)


def test_signal_probability_edges_and_arrays():
    assert signal_probability(0.0, 8) == 0.0
    assert signal_probability(1.0, 8) == 0.0
    assert signal_probability(0.5, 2) == pytest.approx(0.5)
    p = np.array([0.0, 0.5, 1.0])
    np.testing.assert_allclose(signal_probability(p, 4), [0.0, 1 - 2 / 16, 0.0])


@pytest.mark.parametrize(
    ("p", "group_size", "match"),
    [(1.5, 8, r"p must be in \[0, 1\], got 1.5"), (0.5, 0, "group_size must be .* >= 1, got 0")],
)
def test_signal_probability_rejects_bad_inputs(p, group_size, match):
    with pytest.raises(ValueError, match=match):
        signal_probability(p, group_size)


# --- success_band ----------------------------------------------------------------------------


def test_success_band_prefers_mid_range_bins():
    cur = make("success_band", initial_frontier=9, min_obs=10**6, seed=0)
    bins = play(cur, lambda d: 1.0 - d, groups=500)
    # success(d) = 1 - d: bins 4 and 5 have p ~ 0.5, bins 0 and 9 have p ~ 0.95 and 0.05.
    assert bins[4] + bins[5] > 4 * (bins[0] + bins[9])
    probs = cur.bin_probabilities()
    assert probs[4] > 3 * probs[0] and probs[5] > 3 * probs[9]
    assert probs.sum() == pytest.approx(1.0)


def test_success_band_widens_when_easy():
    cur = make("success_band", seed=0)
    assert cur.frontier_bin == 0
    play(cur, lambda d: 1.0, groups=100)
    assert cur.frontier_bin == 9
    assert cur.metrics()["curriculum/frontier"] == 1.0


def test_success_band_narrows_when_hard_but_keeps_one_bin():
    cur = make("success_band", initial_frontier=9, seed=0)
    play(cur, lambda d: 0.0, groups=100)
    assert cur.frontier_bin == 0
    assert cur.metrics()["curriculum/frontier"] == pytest.approx(0.1)


def test_success_band_stops_at_the_step_in_a_step_function():
    # Easy below d = 0.5, impossible above: the frontier should settle at bin 4 or 5.
    cur = make("success_band", seed=0)
    play(cur, lambda d: 0.9 if d < 0.5 else 0.0, groups=200)
    assert cur.frontier_bin in (4, 5)


def test_success_band_resets_a_bin_when_the_frontier_moves_onto_it():
    """Unlock bin 1, fall back to bin 0, unlock bin 1 again: the re-unlocked bin starts from the
    Beta(1, 1) prior, so its old failures do not outweigh the successes seen since."""
    cur = SuccessBandCurriculum(num_bins=4, min_obs=8, high=0.8, low=0.2)
    cur.update(0.1, [True] * 8)  # bin 0: (8 + 1) / (8 + 2) = 0.9 > 0.8: unlock bin 1
    assert cur.frontier_bin == 1
    cur.update(0.3, [False] * 8)  # bin 1: 1 / 10 = 0.1 < 0.2: fall back to bin 0
    assert cur.frontier_bin == 0
    # the bin left behind keeps its counts; the bin moved onto reads the prior
    assert cur.table.estimate()[:2] == pytest.approx([0.5, 0.1])
    cur.update(0.1, [True] * 8)  # bin 0 afresh: 9 / 10 = 0.9: unlock bin 1 again
    assert cur.frontier_bin == 1
    assert cur.table.estimate()[1] == 0.5
    assert cur.table.samples[1] == 8  # cumulative samples are kept
    # stale failures would give (4 + 1) / (4 + 8 * 0.98**4 + 2) = 0.374
    cur.update(0.3, [True] * 4)
    assert cur.table.estimate()[1] == pytest.approx(5 / 6)
    assert cur.frontier_bin == 1  # 4 outcomes since the move, fewer than min_obs = 8
    cur.update(0.3, [True] * 4)  # 8 since the move: 9 / 10 = 0.9 > 0.8: unlock bin 2
    assert cur.frontier_bin == 2


def test_success_band_stale_counts_do_not_lock_a_reunlocked_bin_again():
    cur = SuccessBandCurriculum(num_bins=4, min_obs=8, high=0.8, low=0.2)
    cur.update(0.1, [True] * 8)  # 0.9: unlock bin 1
    cur.update(0.3, [False] * 16)  # 1 / 18: fall back to bin 0
    cur.update(0.1, [True] * 8)  # 0.9: unlock bin 1 again
    assert cur.frontier_bin == 1
    # 3 of 8 since the move: (3 + 1) / (8 + 2) = 0.4, in the band. With the 16 stale failures
    # discounted once, (3 + 1) / (3 + 16 * 0.98**8 + 5 + 2) = 0.169 < 0.2 would lock it again.
    cur.update(0.3, [True] * 3 + [False] * 5)
    assert cur.table.estimate()[1] == pytest.approx(0.4)
    assert cur.frontier_bin == 1

    resumed = SuccessBandCurriculum(num_bins=4, min_obs=8, high=0.8, low=0.2, seed=9)
    resumed.load_state_dict(json.loads(json.dumps(cur.state_dict())))
    assert resumed.state_dict() == cur.state_dict()
    assert [cur.sample() for _ in range(10)] == [resumed.sample() for _ in range(10)]


def test_success_band_samples_only_unlocked_bins_uniformly_inside():
    cur = make("success_band", initial_frontier=2, min_obs=10**6, seed=1)
    samples = np.array([cur.sample() for _ in range(200)])
    assert samples.min() >= 0.0 and samples.max() < 0.3


def test_metrics_report_bins_frontier_and_signal_fraction():
    cur = make("success_band", num_bins=4, seed=0)
    cur.update(0.1, [True, False, True])  # mixed: signal
    cur.update(0.1, [True, True])  # all equal: no signal
    cur.update(0.1, [False])  # one episode: not a group
    m = cur.metrics()
    assert m["curriculum/signal_fraction"] == 0.5
    assert m["curriculum/bin_0_samples"] == 6.0
    assert m["curriculum/bin_1_samples"] == 0.0
    assert m["curriculum/bin_1_success"] == 0.5  # Beta(1, 1) prior
    assert {f"curriculum/bin_{i}_success" for i in range(4)} <= set(m)
    assert all(k.startswith("curriculum/") for k in m)


def test_state_dict_round_trip_continues_identically():
    params = {"initial_frontier": 3, "min_obs": 8, "seed": 7}
    cur = make("success_band", **params)
    play(cur, lambda d: 1.0 - d, groups=30, seed=1)
    state = json.loads(json.dumps(cur.state_dict()))
    resumed = make("success_band", **{**params, "seed": 123})
    resumed.load_state_dict(state)
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(30):
        d_a, d_b = cur.sample(), resumed.sample()
        assert d_a == d_b
        cur.update(d_a, rng_a.random(GROUP_SIZE) < 1.0 - d_a)
        resumed.update(d_b, rng_b.random(GROUP_SIZE) < 1.0 - d_b)
    assert cur.metrics() == resumed.metrics()


def test_success_table_reset_bin_clears_counts_but_keeps_samples():
    table = SuccessTable(num_bins=2, decay=1.0)
    table.record(0, np.array([1.0, 0.0, 0.0]))
    table.record(1, np.array([1.0, 1.0]))
    table.reset_bin(0)
    assert table.successes[0] == table.failures[0] == 0.0
    assert table.samples.tolist() == [3, 2]
    assert table.estimate() == pytest.approx([0.5, 3 / 4])  # bin 1 untouched: (2 + 1) / (2 + 2)


def test_success_table_loads_a_state_holding_the_group_counts_of_older_versions():
    table = SuccessTable(num_bins=2)
    table.record(0, np.array([1.0, 0.0]))
    old_state = {**table.state_dict(), "groups": [1.0, 0.0], "informative": [1.0, 0.0]}
    resumed = SuccessTable(num_bins=2)
    resumed.load_state_dict(old_state)
    assert resumed.state_dict() == table.state_dict()


# --- fixed, uniform, linear ------------------------------------------------------------------


def test_fixed_always_returns_its_difficulty():
    cur = make("fixed", difficulty=0.3)
    assert {cur.sample() for _ in range(5)} == {0.3}
    assert make("fixed").sample() == 1.0


def test_uniform_stays_in_range_and_is_seeded():
    a = [make("uniform", low=0.2, high=0.4, seed=3).sample() for _ in range(2)]
    cur = make("uniform", low=0.2, high=0.4, seed=3)
    samples = [cur.sample() for _ in range(100)]
    assert all(0.2 <= s <= 0.4 for s in samples)
    assert a[0] == a[1] == samples[0]
    assert max(samples) - min(samples) > 0.1


def test_linear_ramps_over_updates_then_holds():
    cur = make("linear", start=0.2, end=0.6, steps=4)
    seen = []
    for _ in range(6):
        seen.append(cur.sample())
        cur.update(seen[-1], [True])
    np.testing.assert_allclose(seen, [0.2, 0.3, 0.4, 0.5, 0.6, 0.6])
    assert cur.sample() == cur.sample()  # sampling alone does not advance the ramp


def test_reset_options_play_the_difficulty_and_adr_key_is_gone():
    assert make("fixed", difficulty=0.5).reset_options(0.5) == {"difficulty": 0.5}
    assert make("success_band").reset_options(0.25) == {"difficulty": 0.25}
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['adr_key'\]"):
        make("success_band", adr_key="friction")


# --- bad inputs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("nope", {}, r"unknown curriculum 'nope'; choose one of \['fixed', 'linear'"),
        ("fixed", {"level": 1}, r"unknown parameter\(s\) \['level'\] for curriculum 'fixed'"),
        ("fixed", {"difficulty": 1.2}, r"difficulty must be in \[0, 1\], got 1.2"),
        ("uniform", {"low": 0.6, "high": 0.6}, "low must be < high, got low=0.6, high=0.6"),
        ("uniform", {"low": -0.1}, r"low must be in \[0, 1\], got -0.1"),
        ("linear", {"end": 2.0}, r"end must be in \[0, 1\], got 2.0"),
        ("linear", {"steps": 0}, "steps must be an integer >= 1, got 0"),
        ("success_band", {"low": 0.9, "high": 0.1}, "low must be < high, got low=0.9"),
        ("success_band", {"high": 1.5}, r"high must be in \[0, 1\], got 1.5"),
        ("success_band", {"num_bins": 0}, "num_bins must be an integer >= 1, got 0"),
        ("success_band", {"group_size": 1}, "group_size must be an integer >= 2, got 1"),
        ("success_band", {"explore": 1.1}, r"explore must be in \[0, 1\], got 1.1"),
        ("success_band", {"initial_frontier": 10}, r"initial_frontier .* \[0, 9\], got 10"),
        ("success_band", {"decay": 0.0}, r"decay must be in \(0, 1\], got 0.0"),
    ],
)
def test_make_rejects_bad_parameters(name, params, match):
    with pytest.raises(ValueError, match=match):
        make(name, **params)


@pytest.mark.parametrize(
    ("difficulty", "successes", "match"),
    [
        (1.5, [True], r"difficulty must be in \[0, 1\], got 1.5"),
        (-0.1, [True], r"difficulty must be in \[0, 1\], got -0.1"),
        (0.5, [], "at least one outcome"),
        (0.5, [0.5, 2.0], r"successes must be booleans or floats in \[0, 1\]"),
    ],
)
def test_update_rejects_bad_inputs(difficulty, successes, match):
    with pytest.raises(ValueError, match=match):
        make("success_band").update(difficulty, successes)


def test_registry_lists_every_curriculum():
    assert sorted(curriculum.CURRICULA) == ["fixed", "linear", "success_band", "uniform"]
    assert isinstance(make("success_band"), SuccessBandCurriculum)


# --- figure script -------------------------------------------------------------------------


def test_signal_figure_script_writes_a_png(tmp_path):
    signal_figure = importlib.import_module("studies.signal_figure")
    out = signal_figure.main(["--out", str(tmp_path / "fig.png"), "--p", "0.05", "--seed", "1"])
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000
