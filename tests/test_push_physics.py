"""Push physics: today's numbers pinned, and the opt-in ``physics="fast"`` preset checked.

Recorded figures and running trainings use the default physics, so it must not change by one bit:
:func:`trajectory_digest` hashes every qpos and qvel of a fixed closed-loop episode and compares
them with digests recorded before the fast preset existed. The fast preset may change numbers but
must keep snapshots exact, the scripted expert perfect and the push dynamics close to the default.
"""

from __future__ import annotations

import hashlib
import pickle

import mujoco
import numpy as np
import pytest

import tasks
from harness.config import ConfigError, TaskOptions
from tasks.push import CUBES

LEVELS = (0.0, 0.5, 1.0)  # two, one and no cubes parked under the table
# trajectory_digest(level) with the default physics, recorded with MuJoCo 4.0.0 on 2026-11-30;
# MuJoCo 4.0.1 gives the same digests (checked 2026-12-03). Other builds may compute differently.
DEFAULT_DIGESTS = {0.0: "ae65bd67d5e63d59", 0.5: "a64d4b7099abaa34", 1.0: "aaf01874e15740e4"}
DIGEST_MUJOCO_VERSIONS = ("4.0.0", "4.0.1")


def trajectory_digest(difficulty: float, **options) -> str:
    """SHA-256 (16 hex digits) of qpos and qvel after each of 80 steps: a noisy expert pushes the
    named cube for 50 steps, then random actions (the episode goes on after success)."""
    env = tasks.make("push", obs_mode="state", terminate_on_success=False, **options)
    expert = tasks.ScriptedExpert(env, noise=0.3, seed=7)
    rng = np.random.default_rng(7)
    env.reset(seed=7, options={"difficulty": difficulty})
    digest = hashlib.sha256()
    for step in range(80):
        env.step(expert() if step < 50 else rng.uniform(-1, 1, 4).astype(np.float32))
        digest.update(env.data.qpos.tobytes())
        digest.update(env.data.qvel.tobytes())
    return digest.hexdigest()[:16]


@pytest.mark.skipif(mujoco.__version__ not in DIGEST_MUJOCO_VERSIONS,
                    reason=f"digests checked with MuJoCo {', '.join(DIGEST_MUJOCO_VERSIONS)}")
@pytest.mark.parametrize("options", [{}, {"physics": "default"}], ids=["unset", "default"])
@pytest.mark.parametrize("level", LEVELS)
def test_default_physics_is_bit_identical_to_the_recorded_trajectories(level, options):
    assert trajectory_digest(level, **options) == DEFAULT_DIGESTS[level], (
        "push's default trajectory changed (its physics, or its start states or expert): recorded "
        "figures and running trainings no longer reproduce (or this MuJoCo build computes "
        "differently)"
    )


def test_fast_preset_keeps_the_control_rate_and_explicit_values_win():
    default, fast = tasks.TaskConfig(), tasks.TaskConfig(physics="fast")
    assert (default.timestep, default.substeps) == (0.002, 20)
    assert (fast.timestep, fast.substeps) == (0.005, 8)
    assert fast.timestep * fast.substeps == pytest.approx(default.timestep * default.substeps)
    assert tasks.TaskConfig(physics="fast", substeps=4).substeps == 4
    with pytest.raises(ValueError, match=r"physics='warp'; expected one of \['default', 'fast'\]"):
        tasks.TaskConfig(physics="warp")
    assert TaskOptions(name="push", physics="fast").env_options()["physics"] == "fast"
    with pytest.raises(ConfigError, match="physics='warp'"):
        TaskOptions(name="push", physics="warp")


def _play(env, actions):
    """Step ``actions``; returns the observations, rewards and qpos/qvel bytes of every step."""
    record = []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        record.append((obs["state"].tobytes(), reward, terminated, truncated,
                       env.data.qpos.tobytes(), env.data.qvel.tobytes()))
    return record


@pytest.mark.parametrize("level", LEVELS)
def test_fast_physics_snapshots_replay_bit_for_bit(level):
    env = tasks.make("push", physics="fast", terminate_on_success=False)
    expert = tasks.ScriptedExpert(env, noise=0.2, seed=3)
    env.reset(seed=3, options={"difficulty": level})
    for _ in range(12):
        env.step(expert())
    snapshot = env.snapshot()
    actions = [expert() for _ in range(30)]  # closed loop from here, then replayed open loop
    env.restore(snapshot)
    first = _play(env, actions)
    env.restore(snapshot)
    assert _play(env, actions) == first
    other = tasks.make("push", physics="fast", terminate_on_success=False)
    other.reset(options={"snapshot": pickle.loads(pickle.dumps(snapshot))})
    assert _play(other, actions) == first


def test_snapshots_do_not_cross_physics_presets():
    fast = tasks.make("push", physics="fast")
    fast.reset(seed=0)
    default = tasks.make("push")
    default.reset(seed=0)
    with pytest.raises(ValueError, match="cannot be restored"):
        default.restore(fast.snapshot())


@pytest.mark.parametrize("level", LEVELS)
def test_scripted_expert_succeeds_100_of_100_under_fast_physics(level):
    env = tasks.make("push", physics="fast")
    expert = tasks.ScriptedExpert(env)
    successes = 0
    for seed in range(100):
        env.reset(seed=seed, options={"difficulty": level})
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(expert())
            done = terminated or truncated
        successes += info["is_success"]
    assert successes == 100, f"difficulty {level}: expert succeeded {successes}/100"


def _slide_distance(physics: str, speed: float = 0.5) -> tuple[float, float]:
    """Metres a resting cube slides on the table after it is given ``speed`` along x, and its
    resting height."""
    env = tasks.make("push", physics=physics)
    env.reset(seed=0, options={"difficulty": 0.0})
    env.set_gripper_position(np.array([0.2, -0.2, 0.2]))  # well away from the cube
    joint = env.model.joint(f"cube_{CUBES[env.task.state['target']]}")
    qpos, qvel = int(joint.qposadr[0]), int(joint.dofadr[0])
    still = np.zeros(4, np.float32)
    for _ in range(10):
        env.step(still)
    start = env.data.qpos[qpos:qpos + 3].copy()
    env.data.qvel[qvel] = speed
    for _ in range(10):
        env.step(still)
    return float(env.data.qpos[qpos] - start[0]), float(start[2])


def test_fast_physics_slides_and_rests_cubes_like_the_default():
    default_slide, default_rest = _slide_distance("default")
    fast_slide, fast_rest = _slide_distance("fast")
    # Coulomb friction (mu = 1) stops a cube at 0.5 m/s after v^2 / (2 mu g) = 12.7 mm.
    assert default_slide == pytest.approx(0.0127, rel=0.15)
    assert fast_slide == pytest.approx(default_slide, rel=0.15)
    assert fast_rest == pytest.approx(default_rest, abs=1e-6)


def _episode_length(env, seed: int) -> int:
    """Steps the scripted expert takes to succeed (at most the episode's 100)."""
    expert = tasks.ScriptedExpert(env)
    env.reset(seed=seed, options={"difficulty": 1.0})
    steps = 1
    while not env.step(expert())[4]["is_success"] and steps < 100:
        steps += 1
    return steps


def test_fast_physics_pushes_cubes_like_the_default():
    """The default expert's actions, replayed open loop under fast physics, move the cube to
    nearly the same place, and the closed-loop expert needs about as many steps."""
    default = tasks.make("push", terminate_on_success=False)
    fast = tasks.make("push", physics="fast", terminate_on_success=False)
    expert = tasks.ScriptedExpert(default)
    gaps = []
    for seed in range(16):
        for env in (default, fast):
            env.reset(seed=seed, options={"difficulty": 0.5})
        for _ in range(40):
            action = expert()
            default.step(action)
            fast.step(action)
        gaps.append(np.linalg.norm(default.task.cube_position(default)
                                   - fast.task.cube_position(fast)))
    assert np.median(gaps) < 0.015, f"cube end positions differ by {np.round(gaps, 4)} m"
    lengths = {env: np.mean([_episode_length(env, seed) for seed in range(16)])
               for env in (default, fast)}
    assert lengths[fast] == pytest.approx(lengths[default], rel=0.1), lengths
