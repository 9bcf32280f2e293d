"""Automatic domain randomisation: the boundary rule against hand-worked numbers, its state,
the ranges (randomisation ranges and imperfection scales) reaching a real env through SB3's and
the group trainer's wrapping, and tiny SB3 and group-trainer runs that log ``adr/*``."""

from __future__ import annotations

import csv
import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

import tasks
from harness import curriculum as curricula
from harness import trainers
from harness.algos.group.checkpoints import read_checkpoint
from harness.algos.group.collect import collect_groups
from harness.algos.group.start_states import StartStates
from harness.algos.rollout.core import EnvHost
from harness.algos.rollout.records import HostSpec
from harness.algos.sb3.envs import make_env_factory
from harness.config import ConfigError, compose
from harness.curriculum import (
    AdrEpisode,
    AdrParameter,
    AutomaticDomainRandomization,
    NextResetOptions,
)


def adr(**overrides) -> AutomaticDomainRandomization:
    """friction in [1, 1] inside [0.9, 1.2], step 0.1; buffer 4; thresholds 0.25 and 0.75."""
    params = overrides.pop("parameters", {"friction": AdrParameter((1.0, 1.0), (0.9, 1.2), 0.1)})
    settings = {"threshold_low": 0.25, "threshold_high": 0.75, "buffer": 4, "boundary_prob": 1.0}
    return AutomaticDomainRandomization(params, **{**settings, **overrides})


def pinned(ranges, name: str, side: str) -> AdrEpisode:
    return AdrEpisode(dict(ranges), (name, side))


# --- the boundary rule, by hand -----------------------------------------------------------------
def test_a_full_buffer_above_t_high_widens_by_step_and_never_past_the_bound():
    a = adr()
    a.update(pinned(a.ranges, "friction", "high"), [True, True, True])
    assert a.ranges["friction"] == (1.0, 1.0)          # 3 of 4 outcomes: nothing read yet
    a.update(pinned(a.ranges, "friction", "high"), [False])
    assert a.ranges["friction"] == (1.0, 1.1)          # 3/4 = 0.75 >= t_high: high + 0.1
    assert a.buffers["friction_high"] == []            # read, then emptied
    a.update(pinned(a.ranges, "friction", "high"), [1, 1, 1, 1])
    assert a.ranges["friction"] == (1.0, 1.2)
    a.update(pinned(a.ranges, "friction", "high"), [1, 1, 1, 1])
    assert a.ranges["friction"] == (1.0, 1.2)          # the hard bound 1.2 holds
    a.update(pinned(a.ranges, "friction", "low"), [1, 1, 1, 1])
    assert a.ranges["friction"] == (0.9, 1.2)          # low - 0.1, the hard bound 0.9
    a.update(pinned(a.ranges, "friction", "low"), [1, 1, 1, 1])
    assert a.ranges["friction"] == (0.9, 1.2)
    assert a.metrics() == {"adr/friction_low": 0.9, "adr/friction_high": 1.2}


def test_a_full_buffer_below_t_low_narrows_and_never_crosses_the_other_boundary():
    a = adr(parameters={"friction": AdrParameter((0.9, 1.1), (0.5, 1.5), 0.1)})
    a.update(pinned(a.ranges, "friction", "low"), [0, 0, 0, 1])   # 0.25 <= t_low: low + 0.1
    assert a.ranges["friction"] == (1.0, 1.1)
    a.update(pinned(a.ranges, "friction", "high"), [0, 1, 1, 0])  # 0.5: between, no move
    assert a.ranges["friction"] == (1.0, 1.1) and a.buffers["friction_high"] == []
    a.update(pinned(a.ranges, "friction", "high"), [0, 0, 0, 0])  # high - 0.1 = 1.0
    assert a.ranges["friction"] == (1.0, 1.0)
    a.update(pinned(a.ranges, "friction", "low"), [0, 0, 0, 0])   # cannot pass high
    assert a.ranges["friction"] == (1.0, 1.0)


def test_unpinned_episodes_teach_nothing_and_a_group_fills_a_buffer_at_once():
    a = adr()
    a.update(AdrEpisode(dict(a.ranges), None), [1] * 10)
    assert a.ranges["friction"] == (1.0, 1.0) and all(not b for b in a.buffers.values())
    a.update(pinned(a.ranges, "friction", "high"), [1] * 8)  # a group of 8 > buffer 4: read
    assert a.ranges["friction"] == (1.0, 1.1)


def test_sampling_pins_each_boundary_equally_often_and_keeps_the_other_ranges():
    params = {"friction": AdrParameter((0.8, 1.2), (0.5, 1.5), 0.1),
              "mass": AdrParameter((0.9, 1.3), (0.5, 1.5), 0.1)}
    a = adr(parameters=params, boundary_prob=0.5, seed=7)
    counts: Counter = Counter()
    for _ in range(4000):
        episode = a.sample()
        counts[episode.pinned] += 1
        if episode.pinned is None:
            assert episode.ranges == a.ranges
            continue
        name, side = episode.pinned
        value = a.ranges[name][0 if side == "low" else 1]
        assert episode.ranges[name] == (value, value)
        other = "mass" if name == "friction" else "friction"
        assert episode.ranges[other] == a.ranges[other]
    assert abs(counts[None] / 4000 - 0.5) < 0.03
    for key in [("friction", "low"), ("friction", "high"), ("mass", "low"), ("mass", "high")]:
        assert abs(counts[key] / 4000 - 0.125) < 0.02
    assert all(adr(boundary_prob=0.0).sample().pinned is None for _ in range(50))


def test_state_dict_round_trip_continues_identically():
    a = adr(boundary_prob=0.5, seed=3)
    for outcome in [1, 1, 0, 1, 1, 1, 1, 0]:
        episode = a.sample()
        a.update(episode, [outcome])
    state = json.loads(json.dumps(a.state_dict()))  # JSON-able, as the SB3 metadata keeps it
    b = adr(boundary_prob=0.5, seed=99)
    b.load_state_dict(state)
    assert b.ranges == a.ranges and b.buffers == a.buffers
    for _ in range(20):
        x, y = a.sample(), b.sample()
        assert x == y
        a.update(x, [1, 0])
        b.update(y, [1, 0])
    assert a.state_dict() == b.state_dict()
    with pytest.raises(ValueError, match="holds parameters"):
        adr(parameters={"mass": AdrParameter()}).load_state_dict(state)
    with pytest.raises(ValueError, match="holds no ADR state"):
        b.load_state_dict(None)


def test_reset_options_split_randomisation_ranges_from_imperfection_scales():
    ranges = {"friction": (0.9, 1.1), "action_noise": (0.0, 0.0), "observation_noise": (0.5, 2)}
    assert AutomaticDomainRandomization.reset_options(AdrEpisode(ranges, None)) == {
        "randomization": {"friction": (0.9, 1.1)},
        "imperfections": {"action_noise": (0.0, 0.0), "observation_noise": (0.5, 2)}}
    only = AdrEpisode({"friction": (1.0, 1.2)}, None)  # no imperfection: the options as before
    assert AutomaticDomainRandomization.reset_options(only) == {
        "randomization": {"friction": (1.0, 1.2)}}
    noise = adr(parameters={"action_noise": AdrParameter((1.0, 1.0), (0.0, 2.0), 0.5)})
    noise.update(pinned(noise.ranges, "action_noise", "low"), [1, 1, 1, 1])
    noise.update(pinned(noise.ranges, "action_noise", "low"), [1, 1, 1, 1])
    noise.update(pinned(noise.ranges, "action_noise", "low"), [1, 1, 1, 1])
    assert noise.ranges["action_noise"] == (0.0, 1.0)  # a scale reaches 0 and stays there


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"buffer": 0}, r"adr.buffer=0; expected an integer >= 1"),
    ({"boundary_prob": 1.5}, r"adr.boundary_prob must be in \[0, 1\], got 1.5"),
    ({"boundary_prob": -0.1}, r"adr.boundary_prob must be in \[0, 1\], got -0.1"),
    ({"threshold_low": 0.8, "threshold_high": 0.4}, "adr.threshold_low=0.8 must be below"),
    ({"parameters": {}}, "adr.params is empty"),
    ({"parameters": {"friction": AdrParameter((1, 1), (1.5, 0.5), 0.1)}},
     r"adr.params.friction.bounds=\[1.5, 0.5\]: low > high"),
    ({"parameters": {"friction": AdrParameter((1.2, 1.1), (0.5, 1.5), 0.1)}},
     r"adr.params.friction.initial=\[1.2, 1.1\]: low > high"),
    ({"parameters": {"friction": AdrParameter((0.2, 1.0), (0.5, 1.5), 0.1)}},
     "lies outside its bounds"),
    ({"parameters": {"friction": AdrParameter((1, 1), (0.5, 1.5), 0.0)}},
     r"adr.params.friction.step=0.0; expected a number > 0"),
])
def test_bad_adr_arguments_name_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        adr(**kwargs)
    with pytest.raises(ValueError, match="successes must be"):
        adr().update(pinned({"friction": (1, 1)}, "friction", "low"), [1.5])


@pytest.mark.parametrize(("overrides", "match"), [
    (["adr.enabled=true"], "adr.enabled=true with no adr.params"),
    (["adr.enabled=true", "+adr.params.frction.bounds=[0.5,2]"],
     r"adr.params.frction: not a randomisation range of task 'reach'"),
    (["adr.enabled=true", "+adr.params.object_size.bounds=[0.5,1.2]"],
     r"adr.params.object_size: not a randomisation range of task 'reach'"),
    (["task=push", "adr.enabled=true", "+adr.params.friction.bounds=[2,0.5]"],
     r"adr.params.friction.bounds: randomization.friction=\(2.0, 0.5\); expected 0 < low"),
    (["task=push", "adr.enabled=true", "+adr.params.object_size.bounds=[0.5,1.6]"],
     "high may be at most 1.5"),
    (["adr.enabled=true", "+adr.params.friction.bounds=[0.5,2]", "adr.boundary_prob=2"],
     r"adr.boundary_prob must be in \[0, 1\], got 2"),
    (["adr.enabled=true", "+adr.params.friction.stp=1"], r"unknown field\(s\) \['stp'\]"),
    (["curriculum=success_band", "curriculum.adr_key=spawn"],
     "curriculum.adr_key='spawn' was removed"),
    (["adr.enabled=true", "+adr.params.noise.bounds=[0.5,2]"],
     r"adr.params.noise: not a randomisation range of task 'reach'; its ranges are \[.*\], "
     r"and the imperfections ADR scales are \['action_noise', 'control_jitter', "
     r"'observation_noise'\]"),
    (["adr.enabled=true", "+adr.params.action_noise.bounds=[0.5,1.5]"],
     r"adr.params.action_noise: task.imperfections.action_noise=0.0 is off, so there is no "
     r"level to scale; set task.imperfections.action_noise > 0"),
    (["+task.imperfections.action_noise=0.1", "adr.enabled=true",
      "+adr.params.action_noise.bounds=[-0.5,1.5]"],
     r"adr.params.action_noise.bounds=\[-0.5, 1.5\]; expected a scale range \[min, max\] "
     r"with 0 <= min <= max"),
    (["+task.imperfections.action_latency=2", "adr.enabled=true",
      "+adr.params.action_latency.bounds=[0.5,1.5]"],
     r"adr.params.action_latency \(bounds \[0.5, 1.5\]\): ADR does not scale "
     r"action_latency"),
    (["+task.imperfections.control_jitter=0.5", "adr.enabled=true",
      "+adr.params.control_jitter.bounds=[0.5,2.5]"],
     r"adr.params.control_jitter.bounds=\[0.5, 2.5\]: max 2.5 times "
     r"task.imperfections.control_jitter=0.5 must stay below 1"),
])
def test_bad_adr_config_is_refused_by_name(overrides, match):
    with pytest.raises(ConfigError, match=match):
        compose(overrides)


def test_an_imperfection_scale_may_start_at_zero():
    config = compose(["+task.imperfections.observation_noise=0.01", "adr.enabled=true",
                      "+adr.params.observation_noise.bounds=[0.0,1.5]",
                      "+adr.params.observation_noise.initial=[0.0,1.0]"])
    assert curricula.make_adr(config.adr, 0).ranges == {"observation_noise": (0.0, 1.0)}


# --- the ranges reach a real env ------------------------------------------------------------
def test_reset_option_ranges_set_the_model_and_leave_the_rest_nominal():
    env = tasks.make("push")
    nominal_friction = env.model.geom_friction[:, 0].copy()
    nominal_mass = env.model.body_mass.copy()
    env.reset(seed=0, options={"randomization": {"friction": (1.3, 1.3)}})
    np.testing.assert_array_equal(env.model.geom_friction[:, 0], nominal_friction * 1.3)
    np.testing.assert_array_equal(env.model.body_mass, nominal_mass)  # the block is off
    snapshot = env.snapshot()
    fresh = tasks.make("push")
    fresh.reset(options={"snapshot": snapshot})  # the snapshot carries the drawn values
    np.testing.assert_array_equal(fresh.model.geom_friction, env.model.geom_friction)
    env.reset(seed=0)  # no option: back to the configured (nominal) model
    np.testing.assert_array_equal(env.model.geom_friction[:, 0], nominal_friction)
    with pytest.raises(ValueError, match=r"\['colour_jitter'\] are not randomisation ranges"):
        env.reset(options={"randomization": {"colour_jitter": 0.1}})
    with pytest.raises(ValueError, match=r"randomization.mass=\(1.2, 0.8\); expected 0 < low"):
        env.reset(options={"randomization": {"mass": (1.2, 0.8)}})


def scales(env) -> dict[str, float]:
    """The scale of each scalable imperfection wrapper inside ``env``, by the level it scales."""
    found = {}
    while env is not env.unwrapped:
        if getattr(env, "scaled", None):
            found[env.scaled] = env.scale
        env = env.env
    return found


def test_sb3_envs_pass_adrs_scales_down_to_the_imperfection_wrappers():
    config = compose(["task=reach", "algo=ppo", "policy=mlp", "reward=verifier",
                      "detector=scripted", "+task.imperfections.action_noise=0.1",
                      "+task.imperfections.observation_noise=0.01", "adr.enabled=true",
                      "+adr.params.action_noise.bounds=[0.0,2.0]"])
    env = make_env_factory(config, 1.0, {})()  # Monitor(Curriculum(Select(Verifier(...))))
    episode = AdrEpisode({"action_noise": (0.0, 0.0)}, ("action_noise", "low"))
    env.get_wrapper_attr("set_next_randomization")(
        AutomaticDomainRandomization.reset_options(episode))
    env.reset(seed=0)
    assert scales(env) == {"action_noise": 0.0, "observation_noise": 1.0}  # only the named


class StopAtRollout(Exception):
    pass


class RecordingPool:
    """Keeps the jobs of the first call and stops the iteration there."""

    def run(self, policy, jobs, temperature, seed):
        self.jobs = jobs
        raise StopAtRollout


def test_a_groups_attempts_share_one_scale_even_from_perturbed_starts():
    config = compose(["task=push", "task.difficulty=0.2", "algo=grpo", "policy=mlp",
                      "algo.num_start_states=3", "algo.group_size=4", "algo.minibatch_size=4",
                      "algo.reset_noise.position_mm=5", "+task.imperfections.action_noise=0.1",
                      "adr.enabled=true", "adr.boundary_prob=0",
                      "+adr.params.action_noise.bounds=[0.5,1.5]",
                      "+adr.params.action_noise.initial=[0.5,1.5]"])
    options = config.task.env_options()
    starts_env = NextResetOptions(tasks.make("push", **{**options, "obs_mode": "state"}))
    curriculum = curricula.make(config.curriculum.name, seed=0, **config.curriculum_params())
    starts, pool = StartStates(config, curriculum, starts_env), RecordingPool()
    with pytest.raises(StopAtRollout):
        collect_groups(config, pool, SimpleNamespace(policy=None), starts, None, 0, 0,
                       curricula.make_adr(config.adr, 0))
    groups = [pool.jobs[g * 4:(g + 1) * 4] for g in range(3)]
    drawn = []
    for group in groups:
        assert len({job.snapshot.physics for job in group}) == 4  # each its perturbed start
        assert all(job.options == group[0].options for job in group)
        (low, high), = group[0].options["imperfections"].values()
        assert low == high and 0.5 <= low <= 1.5
        drawn.append(low)
        host = EnvHost(HostSpec("push", options, 4))
        host.begin(group, range(4))
        assert [scales(env) for env in host.envs] == [{"action_noise": low}] * 4
        host.close()
    assert len(set(drawn)) == 3  # a draw per group


# --- tiny runs ------------------------------------------------------------------------------
def adr_rows(run_dir) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = {}
    with open(run_dir / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row["key"].startswith("adr/"):
                rows.setdefault(row["key"], []).append(float(row["value"]))
    return rows


# Failing attempts narrow a range that starts wide: the range moves whatever the policy does.
NARROWING = ["adr.enabled=true", "+adr.params.friction.bounds=[0.5,2.0]",
             "+adr.params.friction.initial=[0.8,1.2]", "adr.boundary_prob=1.0",
             "logger=none", "eval.every_steps=0", "eval.final_episodes=2", "seed=3"]


# Failing attempts narrow the action-noise scale around the configured 0.1.
NARROWING_NOISE = ["adr.enabled=true", "+task.imperfections.action_noise=0.1",
                   "+adr.params.action_noise.bounds=[0.0,2.0]",
                   "+adr.params.action_noise.initial=[0.6,1.4]", "adr.boundary_prob=1.0",
                   "logger=none", "eval.every_steps=0", "eval.final_episodes=2", "seed=3"]
# (overrides, the range, its initial width): a physical range, and an imperfection's scale
RANGES = {"friction": (NARROWING, 0.4), "action_noise": (NARROWING_NOISE, 0.8)}


@pytest.mark.parametrize("name", list(RANGES))
def test_adr_in_a_tiny_sb3_run_logs_and_moves_the_range(tmp_path, name):
    overrides, width = RANGES[name]
    config = compose(["task=reach", "algo=ppo", "policy=mlp", "total_timesteps=512",
                      "algo.n_steps=128", "algo.batch_size=64", "algo.n_epochs=1",
                      "adr.buffer=1", *overrides])
    trainers.train(config, tmp_path)
    rows = adr_rows(tmp_path)
    assert set(rows) == {f"adr/{name}_low", f"adr/{name}_high"}
    assert rows[f"adr/{name}_high"][-1] - rows[f"adr/{name}_low"][-1] < width  # narrowed
    metadata = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    assert metadata["trainer_state"]["adr"]["ranges"][name] == [
        rows[f"adr/{name}_low"][-1], rows[f"adr/{name}_high"][-1]]


@pytest.mark.parametrize("name", [  # one range by default, the wrapper-scaled one with -m slow
    "friction", pytest.param("action_noise", marks=pytest.mark.slow)])
def test_adr_in_a_tiny_group_run_logs_and_moves_the_range(tmp_path, name):
    overrides, width = RANGES[name]
    config = compose(["task=push", "task.difficulty=0.2", "algo=grpo", "policy=mlp",
                      "algo.iterations=2", "algo.num_start_states=4", "algo.group_size=4",
                      "algo.minibatch_size=8", "adr.buffer=4", *overrides])
    trainers.train(config, tmp_path)
    rows = adr_rows(tmp_path)
    assert len(rows[f"adr/{name}_low"]) == 2  # one per iteration
    assert rows[f"adr/{name}_high"][-1] - rows[f"adr/{name}_low"][-1] < width
    state = read_checkpoint(tmp_path / "checkpoints" / "latest.pt")["adr"]
    assert state["ranges"][name] == [rows[f"adr/{name}_low"][-1], rows[f"adr/{name}_high"][-1]]
