"""Contract tests of the task environments: spaces, determinism, snapshots, experts, bad input."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import mujoco
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import tasks
from tasks import language
from tasks.base import OBS_MODES
from tasks.push import CUBES

TASK_NAMES = sorted(tasks.TASKS)


def rollout(env, actions, stop_on_done=True):
    """Step through ``actions``; return observations, rewards and infos."""
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, reward, terminated, truncated, info["is_success"]))
        if stop_on_done and (terminated or truncated):
            break
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for (obs_a, *rest_a), (obs_b, *rest_b) in zip(a, b, strict=True):
        assert obs_a.keys() == obs_b.keys()
        for key in obs_a:
            assert obs_a[key].dtype == obs_b[key].dtype
            np.testing.assert_array_equal(obs_a[key], obs_b[key], err_msg=key)
        assert rest_a == rest_b  # reward, terminated, truncated, success: exact equality


@pytest.mark.parametrize("obs_mode", OBS_MODES)
@pytest.mark.parametrize("name", TASK_NAMES)
def test_check_env_gymnasium_and_sb3(name, obs_mode):
    env = gym.make(tasks.GYM_IDS[name], obs_mode=obs_mode, image_size=32)
    gym_check_env(env.unwrapped, skip_render_check=True)
    sb3_check_env(env.unwrapped, warn=True)
    env.close()


@pytest.mark.parametrize("name", TASK_NAMES)
def test_observations_in_space_and_finite(name):
    env = tasks.make(name, obs_mode="pixels_state", image_size=32)
    rng = np.random.default_rng(0)
    for episode in range(3):
        obs, _ = env.reset(seed=episode, options={"difficulty": rng.uniform()})
        assert env.observation_space.contains(obs)
        for _ in range(60):
            obs, reward, terminated, truncated, info = env.step(rng.uniform(-1, 1, 4))
            assert env.observation_space.contains(obs), obs
            assert np.all(np.isfinite(obs["state"])) and np.isfinite(reward)
            if terminated or truncated:
                break
    assert obs["pixels"].std() > 5  # a real image, not a blank frame


@pytest.mark.parametrize("name", TASK_NAMES)
def test_same_seed_is_exactly_deterministic(name):
    actions = np.random.default_rng(1).uniform(-1, 1, (40, 4))
    runs = []
    for _ in range(2):
        env = tasks.make(name, obs_mode="pixels_state", image_size=32)
        obs, _ = env.reset(seed=123)
        runs.append([(obs, 0.0, False, False, False), *rollout(env, actions)])
        env.close()
    assert_same(*runs)
    other = tasks.make(name)
    obs, _ = other.reset(seed=124)
    assert not np.array_equal(obs["state"], runs[0][0][0]["state"])


@pytest.mark.parametrize("name", TASK_NAMES)
def test_snapshot_restore_is_bit_identical_in_process(name):
    env = tasks.make(name, obs_mode="pixels_state", image_size=48)
    env.reset(seed=5)
    expert = tasks.ScriptedExpert(env, noise=0.3, seed=0)
    for _ in range(4):
        env.step(expert())
    snapshot = env.snapshot()
    at_snapshot = env._observe()
    actions = [expert() for _ in range(25)]
    first = rollout(env, actions, stop_on_done=False)
    env.step(np.ones(4))  # wander off before restoring
    env.restore(snapshot)
    for key, value in env._observe().items():
        np.testing.assert_array_equal(value, at_snapshot[key])
    assert_same(first, rollout(env, actions, stop_on_done=False))
    obs, _ = env.reset(options={"snapshot": pickle.loads(pickle.dumps(snapshot))})
    np.testing.assert_array_equal(obs["pixels"], at_snapshot["pixels"])
    assert_same(first, rollout(env, actions, stop_on_done=False))


def test_snapshot_restores_rng_task_state_and_step_count():
    env = tasks.make("push")
    env.reset(seed=3)
    env.step(np.zeros(4))
    snapshot = env.snapshot()
    draws = env.np_random.uniform(size=3)
    env.reset(seed=99)
    env.restore(snapshot)
    np.testing.assert_array_equal(env.np_random.uniform(size=3), draws)
    assert env.steps == 1 and snapshot.task_state["steps"] == 1
    assert env.instruction == snapshot.task_state["instruction"]
    np.testing.assert_array_equal(env.task.state["goal"], snapshot.task_state["goal"])


def test_snapshot_restore_in_another_process(tmp_path):
    env = tasks.make("pick_place", obs_mode="pixels_state", image_size=48)
    env.reset(seed=11)
    expert = tasks.ScriptedExpert(env, noise=0.2, seed=1)
    for _ in range(6):
        env.step(expert())
    snapshot = env.snapshot()
    actions = np.array([expert() for _ in range(20)])
    here = rollout(env, actions, stop_on_done=False)
    (tmp_path / "snapshot.pkl").write_bytes(pickle.dumps((snapshot, actions)))
    script = textwrap.dedent(f"""
        import pickle, numpy as np, tasks
        snapshot, actions = pickle.loads(open({str(tmp_path / 'snapshot.pkl')!r}, 'rb').read())
        env = tasks.make("pick_place", obs_mode="pixels_state", image_size=48)
        env.reset(options={{"snapshot": snapshot}})
        out = {{}}
        for i, a in enumerate(actions):
            obs, reward, terminated, truncated, info = env.step(a)
            for key, value in obs.items():
                out[f"{{key}}_{{i}}"] = value
            out[f"reward_{{i}}"] = np.float64(reward)
        np.savez({str(tmp_path / 'there.npz')!r}, **out)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    there = np.load(tmp_path / "there.npz")
    for i, (obs, reward, *_) in enumerate(here):
        for key, value in obs.items():
            np.testing.assert_array_equal(value, there[f"{key}_{i}"], err_msg=f"{key} step {i}")
        assert reward == float(there[f"reward_{i}"])


def test_restore_into_another_task_or_randomisation_raises():
    push, reach = tasks.make("push"), tasks.make("reach")
    push.reset(seed=0)
    reach.reset(seed=0)
    with pytest.raises(ValueError, match=r"task 'push'.*task 'reach'"):
        reach.restore(push.snapshot())
    with pytest.raises(ValueError, match="cannot be restored"):
        reach.reset(options={"snapshot": push.snapshot()})
    randomised = tasks.make("push", randomization={"enabled": True})
    randomised.reset(seed=0)
    snapshot = randomised.snapshot()
    randomised.reset(seed=1)
    with pytest.raises(ValueError, match="randomisation"):
        randomised.restore(snapshot)
    fresh = tasks.make("push", randomization={"enabled": True})
    obs, _ = fresh.reset(options={"snapshot": snapshot})  # re-applies the snapshot's values
    assert fresh.randomization_signature() == snapshot.randomization_signature


def test_domain_randomisation_is_off_by_default_and_varies_when_on():
    plain = tasks.make("push")
    plain.reset(seed=0)
    signature = plain.randomization_signature()
    plain.reset(seed=1)
    assert plain.randomization_signature() == signature
    env = tasks.make("push", randomization={"enabled": True, "friction": (0.5, 2.0)})
    env.reset(seed=0)
    friction = env.model.geom_friction[:, 0].copy()
    env.reset(seed=1)
    assert not np.array_equal(friction, env.model.geom_friction[:, 0])


@pytest.mark.parametrize("name", TASK_NAMES)
def test_scripted_expert_succeeds_95_percent_at_full_difficulty(name):
    env = tasks.make(name)
    expert = tasks.ScriptedExpert(env)
    successes = 0
    for seed in range(100):
        _, info = env.reset(seed=seed, options={"difficulty": 1.0})
        assert not info["is_success"]
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(expert())
            done = terminated or truncated
        successes += info["is_success"]
    assert successes >= 95, f"{name}: expert succeeded {successes}/100"


@pytest.mark.parametrize("name", TASK_NAMES)
def test_reward_is_weighted_sum_of_named_terms(name):
    env = tasks.make(name, reward_weights={"success": 3.0})
    env.reset(seed=0)
    expert = tasks.ScriptedExpert(env)
    for _ in range(60):
        _, reward, terminated, _, info = env.step(expert())
        terms = info["reward_terms"]
        assert set(terms) == set(env.reward_weights) and env.reward_weights["success"] == 3.0
        assert reward == pytest.approx(sum(env.reward_weights[k] * v for k, v in terms.items()))
        assert terms["success"] == float(info["is_success"])
        if terminated:
            break
    assert terminated, "the expert should finish within 60 steps"


# ------------------------------------------------------------------ success margin, goal region
# Conditions a predicate adds to "margin < 0", each a function of the env.
EXTRA_SUCCESS_CONDITIONS = {
    "push": lambda env: env.task.cube_position(env)[2] < 0.03,  # the cube rests on the table
}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_success_margin_is_negative_exactly_when_the_predicate_holds(name):
    """``margin < 0`` agrees with ``is_success`` on every state visited, with the task's extra
    condition where the predicate has one (push: ``success == margin < 0 and on the table``)."""
    env = tasks.make(name, terminate_on_success=False, max_episode_steps=60)
    extra = EXTRA_SUCCESS_CONDITIONS.get(name, lambda env: True)
    inside = outside = 0
    for seed in range(6):
        env.reset(seed=seed, options={"difficulty": 0.0})
        expert = tasks.ScriptedExpert(env, noise=0.2, seed=seed)
        rng = np.random.default_rng(seed)
        switch = int(rng.integers(20, 60))  # the expert reaches success, random actions undo it
        for step in range(60):
            env.step(expert() if step < switch else rng.uniform(-1, 1, 4))
            margin, success = env.task.success_margin(env), env.task.is_success(env)
            assert isinstance(margin, float)
            assert success == (margin < 0 and extra(env)), (seed, step, margin)
            inside += success
            outside += not success
    assert inside > 20 and outside > 20, (inside, outside)


@pytest.mark.parametrize("name, offset, margin, success", [
    ("push", (0.04, 0.0, 0.0), 0.01, False),
    ("push", (0.0, -0.02, 0.0), -0.01, True),
    ("push", (0.02, 0.0, 0.08), -0.01, False),  # over the target, but lifted off the table
    ("pick_place", (0.0, 0.0, 0.04), 0.01, False),
    ("pick_place", (0.012, 0.0, -0.016), -0.01, True),  # 0.012^2 + 0.016^2 = 0.02^2
    ("reach", (0.0, 0.05, 0.0), 0.02, False),
    ("reach", (0.0, 0.0, -0.02), -0.01, True),
])
def test_success_margin_of_hand_placed_states(name, offset, margin, success):
    """The measured point ``offset`` metres from the goal: margin = |offset| - 3 cm (push: in
    x-y only)."""
    env = tasks.make(name)
    env.reset(seed=0, options={"difficulty": 0.0})
    task = env.task
    if name == "reach":  # the goal moves: the grasp point stays where the gripper is
        task.state["goal"] = env.ee_position - np.array(offset)
    else:
        cube = f"cube_{CUBES[task.state['target']]}" if name == "push" else "cube_red"
        env.set_free_body(cube, task.state["goal"] + np.array(offset))
        mujoco.mj_forward(env.model, env.data)
    assert task.success_margin(env) == pytest.approx(margin, abs=1e-9)
    assert task.is_success(env) == success


@pytest.mark.parametrize("opening, margin, success", [
    (0.07, 0.03, False), (0.0999, 0.0001, False), (0.10, 0.0, True), (0.12, -0.02, True),
])
def test_drawer_margin_is_the_opening_still_missing(opening, margin, success):
    env = tasks.make("drawer_open")
    env.reset(seed=0)
    env.data.qpos[env.task.drawer_qpos] = opening
    assert env.task.success_margin(env) == pytest.approx(margin, abs=1e-12)
    assert env.task.is_success(env) == success


@pytest.mark.parametrize("name", TASK_NAMES)
def test_goal_region_and_aiming_the_expert_elsewhere(name):
    env = tasks.make(name)
    env.reset(seed=0)
    region = env.task.goal_region()
    if name == "drawer_open":
        assert region is None  # success is an opening, not a place
        return
    np.testing.assert_array_equal(region.goal, env.task.state["goal"])
    assert region.radius == 0.03
    assert region.planar == (name == "push")
    assert region.needs_object == (name != "reach")  # reach: the gripper itself is measured
    true_goal = env.task.state["goal"].copy()
    action = env.expert_action()
    with env.task.aiming_at(true_goal + np.array([0.0, 0.15, 0.05])):
        aimed = env.expert_action()
    np.testing.assert_array_equal(env.task.state["goal"], true_goal)
    if name == "reach":  # the reach expert heads straight for whatever goal it is given
        assert not np.array_equal(action, aimed)
    with env.task.aiming_at(None):
        np.testing.assert_array_equal(env.expert_action(), action)


def test_terminate_on_success_can_be_turned_off():
    env = tasks.make("reach", terminate_on_success=False, max_episode_steps=30)
    env.reset(seed=0)
    expert = tasks.ScriptedExpert(env)
    flags = [env.step(expert())[2:4] for _ in range(30)]
    assert not any(terminated for terminated, _ in flags)
    assert flags[-1] == (False, True)


def test_difficulty_moves_distractors_and_goal_distance():
    env = tasks.make("push")
    on_table = []
    for d in (0.0, 0.5, 1.0):
        env.reset(seed=0, options={"difficulty": d})
        cubes = np.array([env.data.xpos[b] for b in env.task.cube_bodies])
        on_table.append(int(np.sum(cubes[:, 2] > 0)))
    assert on_table == [1, 2, 3]
    distances = {}
    for d in (0.0, 1.0):
        env.reset(seed=0, options={"difficulty": {"goal_distance": d}})
        cube = env.data.xpos[env.task.cube_bodies[env.task.state["target"]]]
        distances[d] = np.linalg.norm(cube[:2] - env.task.state["goal"][:2])
    assert distances[0.0] == pytest.approx(0.06, abs=1e-6)
    assert distances[1.0] == pytest.approx(0.18, abs=1e-6)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_a_tasks_reset_reads_fresh_positions(name, monkeypatch):
    # what a task's reset reads of the gripper is where reset just put it, not the last
    # episode's position or mj_resetData's zeros
    env = tasks.make(name)
    seen = []
    task_reset = type(env.task).reset

    def spy(task, env_, levels):
        q = env_._gripper_qpos
        seen.append((env_.ee_position.copy(), env_.data.qpos[q:q + 3].copy()))
        return task_reset(task, env_, levels)

    monkeypatch.setattr(type(env.task), "reset", spy)
    for seed in range(3):
        env.reset(seed=seed)
        env.step(env.action_space.sample())
    grasp_offset = seen[0][0] - seen[0][1]  # the grasp site rides at a fixed offset
    for ee, gripper in seen:
        np.testing.assert_allclose(ee - gripper, grasp_offset, atol=1e-9)
    assert np.linalg.norm(seen[0][0]) > 0.05


def test_reach_goal_lies_at_its_distance_from_the_gripper_start():
    # Regression: the goal was placed around the world origin (positions were stale at the
    # task's reset), 5-39 cm from the gripper instead of 5-20 cm.
    env = tasks.make("reach")
    for difficulty, expected in ((0.0, 0.05), (0.5, 0.125), (1.0, 0.20)):
        for seed in range(20):
            env.reset(seed=seed, options={"difficulty": {"goal_distance": difficulty,
                                                         "spawn": 0.0}})
            start, goal = env.ee_position.copy(), env.task.state["goal"]
            gap = np.linalg.norm(goal - start)
            # the goal is clipped into the workspace box [-0.25, 0.25]^2 x [0.03, 0.25]
            clipped = np.isclose(goal, [-0.25, -0.25, 0.03]).any() or \
                np.isclose(goal, [0.25, 0.25, 0.25]).any()
            assert gap == pytest.approx(expected, abs=1e-9) or (clipped and gap < expected)
    assert tasks.TASKS["reach"].version == 2


def test_instruction_tokens_name_the_target_cube():
    env = tasks.make("push")
    colours = set()
    for seed in range(12):
        obs, info = env.reset(seed=seed)
        text = language.detokenize(obs["instruction"])
        assert text == info["instruction"]
        colours.add(text.split()[2])
    assert colours == {"red", "blue", "yellow"}
    obs, _ = env.reset(seed=0, options={"instruction": "push the red cube to the green target"})
    assert language.detokenize(obs["instruction"]).startswith("push the red")


def test_tasks_make_and_gym_ids_give_the_same_env():
    a = tasks.make("drawer_open")
    b = gym.make("harness/DrawerOpen-v0")
    obs_a, _ = a.reset(seed=2)
    obs_b, _ = b.reset(seed=2)
    np.testing.assert_array_equal(obs_a["state"], obs_b["state"])


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("action, match", [
    (np.array([0.0, np.nan, 0.0, 0.0]), "not finite"),
    (np.array([0.0, 0.0, np.inf, 0.0]), "not finite"),
    (np.zeros(3), r"shape \(3,\)"),
    (np.zeros((1, 4)), r"shape \(1, 4\)"),
])
def test_bad_actions_raise_before_simulating(action, match):
    env = tasks.make("reach")
    env.reset(seed=0)
    time_before = env.data.time
    with pytest.raises(ValueError, match=match):
        env.step(action)
    assert env.data.time == time_before


def test_out_of_range_actions_are_clipped():
    a, b = tasks.make("reach"), tasks.make("reach")
    a.reset(seed=0)
    b.reset(seed=0)
    obs_a = a.step(np.array([5.0, -7.0, 2.0, 3.0]))[0]
    obs_b = b.step(np.array([1.0, -1.0, 1.0, 1.0]))[0]
    np.testing.assert_array_equal(obs_a["state"], obs_b["state"])


@pytest.mark.parametrize("call, match", [
    (lambda: tasks.make("stack"), r"unknown task 'stack'.*drawer_open.*push"),
    (lambda: tasks.make("push", obs_mode="rgb"), r"obs_mode='rgb'.*pixels_state"),
    (lambda: tasks.make("push", camera="top"), r"camera='top'.*front.*wrist"),
    (lambda: tasks.make("push", frobnicate=1), r"unknown option.*frobnicate.*allowed"),
    (lambda: tasks.make("push", difficulty=1.5), r"difficulty=1.5.*\[0, 1\]"),
    (lambda: tasks.make("push", render_quality="ultra"), r"render_quality='ultra'"),
    (lambda: tasks.make("push", reward_weights={"speed": 1}), r"speed.*terms are"),
    (lambda: tasks.make("push", randomization={"mass": (2, 1)}), r"randomization.mass"),
])
def test_bad_options_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("options, match", [
    ({"difficulty": -0.1}, r"difficulty=-0.1.*\[0, 1\]"),
    ({"difficulty": "hard"}, r"difficulty='hard'"),
    ({"difficulty": {"height": 0.5}}, r"unknown difficulty level.*goal_distance"),
    ({"seed_state": 1}, r"unknown reset option.*allowed"),
    ({"snapshot": "abc"}, r"expected a tasks.Snapshot"),
    ({"instruction": "fly to the moon"}, r"'fly' .*not in the vocabulary"),
    ({"max_episode_steps": 0}, r"max_episode_steps=0; expected an integer >= 1"),
    ({"max_episode_steps": 2.5}, r"max_episode_steps=2.5; expected an integer >= 1"),
])
def test_bad_reset_options_raise(options, match):
    env = tasks.make("push")
    with pytest.raises(ValueError, match=match):
        env.reset(seed=0, options=options)


def test_a_reset_option_sets_one_episodes_step_limit():
    env = tasks.make("push", max_episode_steps=4)

    def length(**options):
        env.reset(seed=0, options=options or None)
        steps, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(np.zeros(4))
            steps, done = steps + 1, terminated or truncated
        return steps

    assert length() == 4
    assert length(max_episode_steps=7) == 7
    assert length() == 4  # back to the configured limit
    env.reset(seed=1)
    snapshot = env.unwrapped.snapshot()
    assert length(snapshot=snapshot, max_episode_steps=6) == 6  # restores too
    assert length(snapshot=snapshot) == 4
    env.close()


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="reset"):
        tasks.make("reach").step(np.zeros(4))


def test_physics_divergence_truncates_with_physics_error():
    env = tasks.make("push", obs_mode="pixels_state", image_size=32)
    env.reset(seed=0)
    env.data.qvel[:] = 1e300  # as a blown-up simulation would leave it
    obs, reward, terminated, truncated, info = env.step(np.zeros(4))
    assert truncated and not terminated and reward == 0.0
    assert "physics_error" in info and not info["is_success"]
    assert np.all(np.isfinite(obs["state"]))
    env.reset(seed=1)  # the env is usable again after a reset
    env.step(np.zeros(4))


def _green_centroid(image: np.ndarray) -> np.ndarray:
    pixels = image.astype(int)
    green = (pixels[..., 1] > pixels[..., 0] + 40) & (pixels[..., 1] > pixels[..., 2] + 40)
    assert green.sum() > 5, "the green goal marker is not in view"
    rows, cols = np.nonzero(green)
    return np.array([rows.mean(), cols.mean()])


@pytest.mark.parametrize("name", ["push", "pick_place", "reach"])
def test_goal_camera_follows_the_goal(name):
    """The ``goal`` cameras ride on the goal's mocap body: the marker stays in the middle of
    their images wherever the goal is placed, while it moves across the fixed ``front`` view."""
    env = tasks.make(name)
    front, centred = [], []
    for seed in range(3):
        env.reset(seed=seed, options={"difficulty": 1.0})
        front.append(_green_centroid(env.render_camera("front", 84)))
        centred.append([_green_centroid(env.render_camera(c, 84)) for c in ("goal", "goal_side")])
    middle = np.array([41.5, 41.5])
    assert all(np.abs(c - middle).max() < 6 for views in centred for c in views), centred
    assert max(np.abs(f - front[0]).max() for f in front[1:]) > 4, front


def test_goal_camera_is_only_in_tasks_with_a_goal_marker():
    with pytest.raises(ValueError, match="camera='goal'"):
        tasks.make("drawer_open", camera="goal")
    assert {"goal", "goal_side"} <= set(tasks.make("push", camera="goal_side").camera_names)


def test_camera_views_script_renders_every_camera(tmp_path):
    path = Path(__file__).resolve().parents[1] / "studies" / "camera_views.py"
    spec = importlib.util.spec_from_file_location("camera_views", path)
    camera_views = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(camera_views)
    image, names = camera_views.camera_grid("push", 32, seed=0, difficulty=1.0, moments=[0, 5])
    assert names == ("front", "side", "overhead", "wrist", "goal", "goal_side")
    assert image.shape == (2 * 32, 6 * 32, 3) and image.dtype == np.uint8
    assert not np.array_equal(image[:32], image[32:])  # the expert moved in between
    with pytest.raises(ValueError, match="moments=.*increasing"):
        camera_views.camera_grid("push", 32, seed=0, difficulty=1.0, moments=[5, 0])
    out = camera_views.main(["--task", "reach", "--size", "24", "--moments", "0",
                             "--out", str(tmp_path / "views.png")])
    assert out.exists()
    both, names = camera_views.camera_grid("push", 32, seed=0, difficulty=1.0, moments=[0, 5],
                                           cameras=["front", "wrist"])
    assert names == ("front", "wrist") and np.array_equal(both[:, :32], image[:, :32])
    assert np.array_equal(both[:, 32:], image[:, 3 * 32:4 * 32])
    with pytest.raises(ValueError, match=r"\['elbow'\] not among push's cameras"):
        camera_views.camera_grid("push", 32, seed=0, difficulty=1.0, moments=[0],
                                 cameras=["front", "elbow"])
    out = camera_views.main(["--task", "push", "pick_place", "--cameras", "front", "wrist",
                             "--size", "24", "--moments", "0", "--out", str(tmp_path / "fw.png")])
    import imageio.v3 as iio

    assert iio.imread(out).shape == (2 * 24, 2 * 24, 3)
