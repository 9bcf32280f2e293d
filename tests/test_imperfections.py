"""Sim-to-real imperfections on real MuJoCo: each wrapper's effect, exact restores with them on,
the scales of their levels (the reset option ADR sets), the broader randomisation, inexact
resets, defaults that change nothing, and bad inputs."""

from __future__ import annotations

import hashlib
import importlib
import json

import numpy as np
import pytest

import tasks
from harness import trainers
from harness.algos.rollout.core import EnvHost
from harness.algos.rollout.records import HostSpec, Job
from harness.config import ConfigError, compose
from tasks.perturb import ResetNoise, _penetrations, perturb_start, perturbed_snapshots
from tasks.wrappers import (
    SCALABLE,
    ActionLatency,
    ActionNoise,
    ImperfectionConfig,
    imperfection_scales,
    noise_generator,
)

ALL_ON = {"action_noise": 0.1, "action_latency": 2, "control_jitter": 0.2,
          "observation_noise": 0.01, "dropped_frames": 0.3}


def actions(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (count, 4)).astype(np.float32)


def play(env, moves, **reset) -> list[dict]:
    obs, _ = env.reset(**reset)
    seen = [obs]
    for action in moves:
        obs, *_ = env.step(action)
        seen.append(obs)
    return seen


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


# --- defaults change nothing ----------------------------------------------------------------
def test_defaults_are_off_and_build_the_model_they_always_built():
    env = tasks.make("push")
    assert type(env) is tasks.ManipulationEnv and not ImperfectionConfig().any
    assert env.model.ntex == 0 and env.model.nmat == 0 and env.model.nlight == 2
    # The signature hashes the arrays it always did, so stored snapshots still restore.
    digest = hashlib.sha1()
    for key in ("geom_friction", "body_mass", "dof_damping", "light_diffuse", "geom_rgba",
                "cam_pos"):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(getattr(env.model, key)).tobytes())
    assert env.randomization_signature() == digest.hexdigest()[:12]


def test_enabling_the_block_draws_exactly_what_it_always_drew():
    """The sampler of the six original parameters, written out: the new fields are off by
    default and take nothing from the RNG, so randomised runs replay as before."""
    env = tasks.make("push", randomization={"enabled": True})
    r, randomizer = env.config.randomization, env._randomizer
    ours, theirs = np.random.default_rng(5), np.random.default_rng(5)
    values = randomizer.sample(r, ours)
    # The original sampler, line by line (in place, so float32 arrays stay float32).
    want = {key: randomizer.nominal[key].copy() for key in values}
    objects, geoms = randomizer._object_bodies, randomizer._object_geoms
    want["geom_friction"][:, 0] *= theirs.uniform(*r.friction)
    want["body_mass"][objects] *= theirs.uniform(*r.mass, len(objects))
    want["dof_damping"] *= theirs.uniform(*r.damping)
    want["light_diffuse"] *= theirs.uniform(*r.light, (env.model.nlight, 1))
    rgb = want["geom_rgba"][geoms, :3]
    noise = theirs.uniform(-r.colour_jitter, r.colour_jitter, rgb.shape)
    want["geom_rgba"][geoms, :3] = np.clip(rgb + noise, 0, 1)
    cams = randomizer._fixed_cameras
    want["cam_pos"][cams] += theirs.uniform(-r.camera_jitter, r.camera_jitter, (len(cams), 3))
    assert sorted(values) == sorted(["geom_friction", "body_mass", "dof_damping",
                                     "light_diffuse", "geom_rgba", "cam_pos"])
    for key in values:
        np.testing.assert_array_equal(values[key], want[key])
    assert ours.bit_generator.state == theirs.bit_generator.state


# --- each wrapper's effect ------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3])
def test_latency_k_delays_every_action_by_exactly_k_steps(k):
    moves = actions(12)
    delayed = play(tasks.make("push", imperfections={"action_latency": k}), moves, seed=4)
    hold = np.array([0.0, 0.0, 0.0, -1.0], np.float32)  # no motion, the start's open gripper
    shifted = np.concatenate([np.tile(hold, (k, 1)), moves[:-k]])
    assert_same(delayed, play(tasks.make("push"), shifted, seed=4))


def test_action_noise_has_the_configured_sigma():
    env = tasks.make("reach", imperfections={"action_noise": 0.1}, max_episode_steps=500,
                     terminate_on_success=False)
    env.reset(seed=0)
    # The gripper command is observed exactly (proprio[7]): a zero command plus the noise.
    commands = [env.step(np.zeros(4))[0]["state"][7] for _ in range(400)]
    assert abs(np.std(commands) - 0.1) < 0.1 * 0.15 and abs(np.mean(commands)) < 0.015


def test_observation_noise_has_the_configured_sigma_on_state_and_proprio():
    env = tasks.make("reach", obs_mode="pixels_state", image_size=16,
                     imperfections={"observation_noise": 0.01})
    obs, _ = env.reset(seed=0)
    errors, proprio_errors = [], []
    for action in actions(40):
        truth = env.unwrapped.proprio()  # the first observation is noised too
        errors.append(obs["state"][:8] - truth)
        proprio_errors.append(obs["proprio"] - truth)
        obs, *_ = env.step(action)
    for sample in (np.concatenate(errors), np.concatenate(proprio_errors)):
        assert abs(np.std(sample) - 0.01) < 0.01 * 0.15 and abs(np.mean(sample)) < 0.002
    assert obs["state"].dtype == np.float32 and obs["instruction"].dtype == np.int64


def test_dropped_frames_repeat_the_previous_image_and_nothing_else():
    env = tasks.make("reach", obs_mode="pixels", image_size=24,
                     imperfections={"dropped_frames": 0.4})
    seen = play(env, actions(60, seed=2), seed=1)
    frames = [o["pixels"] for o in seen]
    repeats = [bool(np.array_equal(a, b)) for a, b in zip(frames, frames[1:], strict=False)]
    assert sum(repeats) == env.dropped and 12 <= env.dropped <= 36  # about 0.4 of 60
    base = play(tasks.make("reach", obs_mode="pixels", image_size=24), actions(60, seed=2),
                seed=1)  # the same physics: a dropped frame is the last fresh one
    last = base[0]["pixels"]
    for ours, truth, repeated in zip(frames[1:], base[1:], repeats, strict=True):
        np.testing.assert_array_equal(ours, last if repeated else truth["pixels"])
        last = ours
    np.testing.assert_array_equal(seen[-1]["proprio"], base[-1]["proprio"])
    always = tasks.make("reach", obs_mode="pixels", image_size=24,
                        imperfections={"dropped_frames": 1.0})
    stuck = play(always, actions(5), seed=1)
    assert all(np.array_equal(o["pixels"], stuck[0]["pixels"]) for o in stuck)


def test_control_jitter_varies_the_simulated_time_per_step_around_the_period():
    env = tasks.make("reach", imperfections={"control_jitter": 0.3}, max_episode_steps=300,
                     terminate_on_success=False)
    env.reset(seed=0)
    period = 0.002 * 20
    durations = []
    for _ in range(200):
        before = env.unwrapped.data.time
        env.step(np.zeros(4))
        durations.append(env.unwrapped.data.time - before)
    durations = np.array(durations) / 0.002
    durations = durations.round()  # whole physics steps, up to the clock's rounding
    assert durations.min() >= 14 and durations.max() <= 26 and len(set(durations)) > 5
    assert abs(durations.mean() * 0.002 - period) < 0.05 * period
    assert env.unwrapped.substeps == 20  # restored after every step


# --- exact restores with the wrappers on ----------------------------------------------------
def test_restores_are_bit_exact_with_every_wrapper_on():
    options = {"obs_mode": "pixels_state", "image_size": 24, "imperfections": ALL_ON,
               "randomization": {"enabled": True, "textures": True, "fovy": (0.9, 1.1)}}
    env = tasks.make("push", **options)
    moves = actions(25, seed=9)
    env.reset(seed=11)
    snapshot = env.snapshot()
    original = play(env, moves, seed=11)
    assert_same(play(env, moves, options={"snapshot": snapshot}), original)
    fresh = tasks.make("push", **options)  # another env, as a rollout worker holds
    assert_same(play(fresh, moves, options={"snapshot": snapshot}), original)
    keyed = play(fresh, moves, options={"snapshot": snapshot, "noise_key": 3})
    assert_same(play(env, moves, options={"snapshot": snapshot, "noise_key": 3}), keyed)
    assert not np.array_equal(keyed[-1]["state"], original[-1]["state"])
    env.restore(snapshot, noise_key=3)  # the wrapper's restore restarts its state too
    replay = [env.step(a)[0] for a in moves]
    assert_same(replay, keyed[1:])


def test_a_groups_attempts_replay_identically_whatever_the_number_of_envs():
    """EnvHost passes each attempt's index as noise_key: attempts from one snapshot draw
    different noise, and the same attempt plays the same in any slot."""
    options = {"imperfections": ALL_ON, "max_episode_steps": 6, "terminate_on_success": False}
    starts = tasks.make("push", **options)
    starts.reset(seed=2)
    jobs = [Job(starts.snapshot(), 0, 1.0)] * 4
    moves = actions(6, seed=1)

    def attempts(num_envs: int) -> dict[int, list]:
        host = EnvHost(HostSpec("push", options, num_envs))
        first = host.begin(jobs, range(4)).observations
        seen = {i: [o["state"]] for i, o in first.items()}
        active = set(first)
        while active:
            observations, finished, _ = host.step({i: moves[len(seen[i]) - 1] for i in active})
            active = (active - set(finished)) | set(observations)
            for i, o in observations.items():
                seen.setdefault(i, []).append(o["state"])
        return seen

    one, four = attempts(1), attempts(4)
    for i in range(4):
        np.testing.assert_array_equal(np.stack(one[i]), np.stack(four[i]))
    assert not np.array_equal(four[0][-1], four[1][-1])


# --- scales of the imperfection levels (the reset option ADR sets) --------------------------
def wrappers_of(env) -> dict[str, object]:
    """The scalable imperfection wrappers around ``env.unwrapped``, by the level they scale."""
    found = {}
    while env is not env.unwrapped:
        if getattr(env, "scaled", None):
            found[env.scaled] = env
        env = env.env
    return found


def gripper_commands(env, steps: int, **reset) -> np.ndarray:
    """The gripper command observed (exactly, ``state[7]``) while commanding 0 for ``steps``."""
    env.reset(**reset)
    return np.array([env.step(np.zeros(4))[0]["state"][7] for _ in range(steps)])


def test_no_scale_option_plays_the_configured_level_drawn_as_always():
    """The action noise of a reset without the option, written out: sigma times the draws of
    the wrapper's stream, so runs without ADR replay as before."""
    env = tasks.make("reach", imperfections={"action_noise": 0.1}, max_episode_steps=50,
                     terminate_on_success=False)
    env.reset(seed=0)
    assert env.scale == 1.0
    rng = noise_generator(env.unwrapped.snapshot(), 0, ActionNoise.stream)
    for _ in range(30):
        expected = np.float32(np.clip(rng.normal(0.0, 0.1, 4)[3], -1.0, 1.0))
        assert env.step(np.zeros(4))[0]["state"][7] == expected
    moves = actions(20, seed=3)
    everything = tasks.make("push", imperfections=ALL_ON)
    assert_same(play(everything, moves, seed=5, options={"imperfections": {
        name: (1.0, 1.0) for name in SCALABLE}}), play(everything, moves, seed=5))


def test_a_scale_of_zero_turns_the_noise_off_and_two_doubles_it():
    options = {"max_episode_steps": 500, "terminate_on_success": False}
    noisy = tasks.make("reach", imperfections={"action_noise": 0.1}, **options)
    clean = tasks.make("reach", **options)
    moves = actions(30, seed=4)
    off = {"imperfections": {"action_noise": (0.0, 0.0)}}
    assert_same(play(noisy, moves, seed=2, options=off), play(clean, moves, seed=2))
    # The same episode without noise commands exactly 0: what differs is the noise.
    truth = gripper_commands(clean, 400, seed=0)
    once = gripper_commands(noisy, 400, seed=0) - truth
    twice = gripper_commands(noisy, 400, seed=0,
                             options={"imperfections": {"action_noise": (2.0, 2.0)}}) - truth
    assert noisy.scale == 2.0
    assert abs(np.std(twice) - 0.2) < 0.2 * 0.15
    np.testing.assert_allclose(twice, 2 * once, rtol=1e-6)  # the same draws, twice as large


def test_scales_of_a_start_are_shared_by_all_its_noise_keys_and_restores():
    env = tasks.make("push", imperfections=ALL_ON)
    ranges = {"action_noise": (0.5, 1.5), "control_jitter": (0.2, 1.8),
              "observation_noise": (0.0, 2.0)}
    env.reset(seed=3, options={"imperfections": ranges})
    snapshot = env.snapshot()
    expected = imperfection_scales(snapshot, ranges)
    assert {n: w.scale for n, w in wrappers_of(env).items()} == expected
    assert all(low <= expected[n] <= high and expected[n] != 1.0
               for n, (low, high) in ranges.items())
    assert len(set(expected.values())) == 3  # each wrapper its own stream
    moves, last = actions(5), []
    for key in range(4):
        seen = play(env, moves, options={"snapshot": snapshot, "noise_key": key,
                                         "imperfections": ranges})
        assert {n: w.scale for n, w in wrappers_of(env).items()} == expected
        last.append(seen[-1]["state"])
    assert len({x.tobytes() for x in last}) == 4  # the noise itself differs by key
    env.restore(snapshot, noise_key=7, imperfections=ranges)
    assert {n: w.scale for n, w in wrappers_of(env).items()} == expected
    env.restore(snapshot, noise_key=7)  # without the ranges: the configured levels
    assert all(w.scale == 1.0 for w in wrappers_of(env).values())
    env.reset(seed=4, options={"imperfections": ranges})  # another start, other scales
    assert wrappers_of(env)["action_noise"].scale != expected["action_noise"]


# --- broader randomisation ------------------------------------------------------------------
def test_scene_randomisation_changes_what_it_names_within_its_ranges():
    r = {"enabled": True, "textures": True, "light_count": (1, 4), "fovy": (0.8, 1.2),
         "camera_rotation": 0.05, "light_direction": 0.2, "table_colour": 0.2,
         "background_colour": 0.2, "object_size": (0.8, 1.2)}
    env = tasks.make("pick_place", obs_mode="pixels", image_size=32, randomization=r)
    m, nominal = env.model, env._randomizer.nominal
    assert m.ntex == 8 and m.nmat == 2 and m.nlight == 4
    frames, textures = [], set()
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        frames.append(obs["pixels"])
        assert 1 <= m.light_active.sum() <= 4
        assert np.all((m.cam_fovy >= 0.8 * nominal["cam_fovy"] - 1e-9)
                      & (m.cam_fovy <= 1.2 * nominal["cam_fovy"] + 1e-9))
        turn = [np.degrees(2 * np.arccos(min(1.0, abs(q @ n))))
                for q, n in zip(m.cam_quat, nominal["cam_quat"], strict=True)]
        assert max(turn) <= np.degrees(0.05 * np.sqrt(3)) + 1e-6 and max(turn) > 0
        assert np.allclose(np.linalg.norm(m.light_dir, axis=1),
                           np.linalg.norm(nominal["light_dir"], axis=1))
        textures.update(m.mat_texid[:, 1].tolist())
        cube = m.geom("cube_red").id
        scale = m.geom_size[cube, 0] / nominal["geom_size"][cube, 0]
        assert 0.8 <= scale <= 1.2 and np.allclose(m.geom_size[cube], scale * 0.02)
        # A resized cube still rests on the table: its centre at its own half size.
        assert env.data.qpos[m.joint("cube_red").qposadr[0] + 2] == pytest.approx(0.02 * scale)
    assert len(textures) > 1 and len({f.tobytes() for f in frames}) == 6
    env.reset(seed=0)
    table = m.geom_rgba[m.geom("table").id, :3]
    assert np.all(np.abs(table - nominal["geom_rgba"][m.geom("table").id, :3]) <= 0.2 + 1e-9)


def test_resized_cubes_neither_sink_into_nor_jump_off_the_table():
    env = tasks.make("push", randomization={"enabled": True, "object_size": (0.7, 1.3),
                                            "friction": (1, 1), "mass": (1, 1)})
    for seed in range(5):
        env.reset(seed=seed, options={"difficulty": 0.0})
        cube = env.task.cube_position(env).copy()
        for _ in range(5):
            env.step(np.array([0.0, 0.0, 0.0, -1.0]))
        assert np.abs(env.task.cube_position(env) - cube).max() < 1e-3


# --- inexact resets -------------------------------------------------------------------------
def start(task: str = "push", seed: int = 0, difficulty: float = 0.3):
    env = tasks.make(task)
    env.reset(seed=seed, options={"difficulty": difficulty})
    return env, env.snapshot()


def test_zero_reset_noise_gives_the_snapshot_itself():
    env, snapshot = start()
    generators = [np.random.default_rng(i) for i in range(4)]
    assert perturbed_snapshots(env, snapshot, ResetNoise(), generators) == [snapshot] * 4


def test_reset_noise_moves_the_cube_by_about_sigma_and_is_deterministic_per_attempt():
    env, snapshot = start()
    sigma = 0.005
    cube0 = env.task.cube_position(env)[:2].copy()
    grip0 = env.ee_position.copy()
    generators = [np.random.default_rng([1, 2, 3, i]) for i in range(300)]
    snapshots = perturbed_snapshots(env, snapshot, ResetNoise(sigma, 0.05), generators)
    moves, grips = [], []
    for s in snapshots:
        env.reset(options={"snapshot": s})
        moves.append(env.task.cube_position(env)[:2] - cube0)
        grips.append(env.ee_position - grip0)
    moves, grips = np.array(moves), np.array(grips)
    assert np.all(np.abs(moves.std(axis=0) - sigma) < 0.15 * sigma)
    assert np.all(np.abs(grips.std(axis=0) - sigma) < 0.15 * sigma)
    again = perturbed_snapshots(env, snapshot, ResetNoise(sigma, 0.05),
                                [np.random.default_rng([1, 2, 3, i]) for i in range(3)])
    assert [s.physics for s in again] == [s.physics for s in snapshots[:3]]
    env.reset(options={"snapshot": snapshot})  # the original is untouched
    np.testing.assert_array_equal(env.task.cube_position(env)[:2], cube0)


def test_reset_noise_never_makes_objects_interpenetrate():
    """Distractor cubes 8 cm apart and a 3 cm sigma: draws that collide are rejected and
    drawn again."""
    env, snapshot = start(seed=7, difficulty=1.0)
    assert len(env.task.movable_objects(env)) == 3
    rejected = 0
    for i in range(60):
        env.reset(options={"snapshot": snapshot})
        before = _penetrations(env.model, env.data)
        tries = perturb_start(env, ResetNoise(0.03, 0.5), np.random.default_rng(i))
        assert tries >= 1
        rejected += tries - 1
        after = _penetrations(env.model, env.data)
        assert all(d <= before.get(pair, 0.0) + 5e-4 for pair, d in after.items())
    assert rejected > 0
    drawer, drawer_start = start("drawer_open", difficulty=0.0)
    for i in range(20):
        drawer.reset(options={"snapshot": drawer_start})
        perturb_start(drawer, ResetNoise(0.05), np.random.default_rng(i))
        assert 0.0 <= drawer.task.opening(drawer) <= 0.15


def test_reset_noise_reaches_every_attempt_of_a_group_run_and_is_reproducible(tmp_path):
    # 30 steps an attempt (push's own limit is longer): the noise acts at each reset
    overrides = ["task=push", "task.difficulty=0.2", "task.max_episode_steps=30", "algo=grpo",
                 "policy=mlp", "algo.iterations=1", "algo.num_start_states=2", "algo.group_size=3",
                 "algo.minibatch_size=6", "algo.reset_noise.position_mm=5",
                 "+task.imperfections.action_noise=0.05", "logger=none",
                 "eval.every_steps=0", "eval.final_episodes=2", "seed=1"]
    runs = []
    for name in ("a", "b"):
        trainers.train(compose(overrides), tmp_path / name)
        lines = (tmp_path / name / "metrics.csv").read_text().splitlines()
        runs.append([line.split(",", 2)[::2] for line in lines if "time" not in line])
    assert runs[0] == runs[1]


# --- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize(("options", "match"), [
    ({"imperfections": {"action_noise": -0.1}}, r"imperfections.action_noise=-0.1"),
    ({"imperfections": {"observation_noise": -1}}, r"imperfections.observation_noise=-1"),
    ({"imperfections": {"action_latency": -1}}, r"imperfections.action_latency=-1"),
    ({"imperfections": {"action_latency": 1.5}}, r"imperfections.action_latency=1.5"),
    ({"imperfections": {"dropped_frames": 1.5}}, r"dropped_frames=1.5; expected a probabil"),
    ({"imperfections": {"dropped_frames": -0.1}}, r"dropped_frames=-0.1; expected a probabil"),
    ({"imperfections": {"control_jitter": 1.0}}, r"control_jitter=1.0; expected a fraction"),
    ({"imperfections": {"latency": 1}}, r"unknown imperfections option\(s\) \['latency'\]"),
    ({"randomization": {"frction": (1, 2)}}, r"unknown randomization option\(s\) \['frction'\]"),
    ({"randomization": {"fovy": (1.2, 0.8)}}, r"randomization.fovy=\(1.2, 0.8\); expected 0 <"),
    ({"randomization": {"object_size": (0.5, 2.0)}}, r"object_size=\(0.5, 2.0\); high may be"),
    ({"randomization": {"light_count": (3, 2)}}, r"randomization.light_count=\(3, 2\)"),
    ({"randomization": {"camera_rotation": -0.1}}, r"randomization.camera_rotation=-0.1"),
    ({"randomization": {"table_colour": "red"}}, r"randomization.table_colour='red'"),
])
def test_bad_imperfection_and_randomisation_options_name_the_value(options, match):
    with pytest.raises(ValueError, match=match):
        tasks.make("push", **options)


@pytest.mark.parametrize(("ranges", "match"), [
    ({"action_latency": (1, 2)}, r"\['action_latency'\] cannot be scaled; scalable"),
    ({"action_noise": (-0.5, 1.0)}, r"imperfections.action_noise=\(-0.5, 1.0\); expected a "
                                    r"scale range with 0 <= low <= high"),
    ({"action_noise": (1.5, 0.5)}, r"imperfections.action_noise=\(1.5, 0.5\)"),
    ({"action_noise": 2.0}, r"imperfections.action_noise=2.0; expected a range"),
])
def test_bad_scale_options_name_the_value(ranges, match):
    env = tasks.make("reach", imperfections={"action_noise": 0.1})
    with pytest.raises(ValueError, match=match):
        env.reset(options={"imperfections": ranges})


def test_bad_reset_noise_and_noise_keys_name_the_value():
    with pytest.raises(ValueError, match=r"reset_noise.position=-0.001; expected a standard"):
        ResetNoise(-0.001)
    with pytest.raises(ValueError, match=r"reset_noise.rotation=-1"):
        ResetNoise(0.0, -1)
    with pytest.raises(ConfigError, match=r"algo.reset_noise.position_mm=-2.0; must be >= 0"):
        compose(["algo=grpo", "policy=mlp", "algo.reset_noise.position_mm=-2"])
    with pytest.raises(ConfigError, match=r"task: imperfections.action_latency=-1"):
        compose(["+task.imperfections.action_latency=-1"])
    env = tasks.make("reach", imperfections={"action_noise": 0.1})
    with pytest.raises(ValueError, match=r"reset option noise_key=-1; expected an integer"):
        env.reset(options={"noise_key": -1})
    with pytest.raises(ValueError, match=r"action has shape \(3,\)"):
        ActionLatency(tasks.make("reach"), 2).step(np.zeros(3))


# --- the study script -----------------------------------------------------------------------
def test_study_script_on_a_tiny_budget_writes_its_table_and_figure(tmp_path):
    study = importlib.import_module("studies.study_reset_noise")
    grouped = np.array([1.0, 0.0, 0.5, 0.5])
    np.testing.assert_array_equal(study.centred(grouped, 2), [0.5, -0.5, 0.0, 0.0])
    assert np.isnan(study.pearson(np.ones(3), np.arange(3.0)))  # a constant side
    assert study.pearson(np.arange(3.0), 2 * np.arange(3.0)) == pytest.approx(1.0)
    figure = study.main(["--out", str(tmp_path), "--sigmas-mm", "0", "5", "--algos", "grpo",
                         "--iterations", "2", "--final-episodes", "2",
                         "--probe-starts", "1", "--probe-repeats", "2",
                         "--override", "algo.start_policy.bc.demos=0", "algo.group_size=2",
                         "algo.num_start_states=2", "algo.minibatch_size=4"])
    assert figure.exists() and figure.stat().st_size > 0
    rows = (tmp_path / "study.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("algo,sigma_mm,seed,informative_fraction")
    assert (tmp_path / "grpo_sigma5" / "summary.json").exists()

    # tables measured apart (here: the same one as seed 0 and as seed 3) merge into one figure
    other = json.loads((tmp_path / "study.json").read_text())
    other["rows"] = [{**row, "seed": 3, "final_success_rate": 1.0} for row in other["rows"]]
    (tmp_path / "seed3").mkdir()
    (tmp_path / "seed3" / "study.json").write_text(json.dumps(other))
    merged = tmp_path / "merged"
    assert study.main(["--out", str(merged), "--combine", str(tmp_path / "study.json"),
                       str(tmp_path / "seed3" / "study.json")]).exists()
    table = json.loads((merged / "study.json").read_text())["rows"]
    assert sorted((r["seed"], r["sigma_mm"]) for r in table) == [(0, 0), (0, 5), (3, 0), (3, 5)]
    with pytest.raises(SystemExit):
        study.main(["--combine", str(tmp_path / "missing.json")])
