"""Meta-World and robosuite through the harness: snapshots on disk and refused, difficulty, the
Hydra groups and experiments, GRPO runs that clone the suite's expert and fine-tune it, SB3 PPO
(suites' environment)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tasks
from harness import config as harness_config
from harness import trainers
from harness.config import ConfigError
from harness_common.files import read_metrics
from tasks.suites import SuiteError


def _steps(env, actions):
    return [env.step(a)[:2] for a in actions]


def test_a_snapshot_through_a_file_replays_exactly_in_a_fresh_env(tmp_path):
    env = tasks.make("metaworld/pick-place-v3", obs_mode="pixels_state")
    env.reset(seed=3)
    for _ in range(20):
        env.step(env.expert_action())
    tasks.save_snapshot(tmp_path / "s.npz", env.snapshot())
    actions = np.random.default_rng(0).uniform(-1, 1, (15, 4))
    recorded = _steps(env, actions)
    fresh = tasks.make("metaworld/pick-place-v3", obs_mode="pixels_state")
    fresh.reset(options={"snapshot": tasks.load_snapshot(tmp_path / "s.npz")})
    for (obs, reward), (again, reward_again) in zip(recorded, _steps(fresh, actions),
                                                   strict=True):
        assert reward == reward_again
        assert all(np.array_equal(obs[k], again[k]) for k in obs)
    assert fresh.steps == env.steps == 35


def test_bad_snapshots_are_refused_by_name_and_leave_the_env_as_it_was():
    env = tasks.make("metaworld/push-v3")
    obs, _ = env.reset(seed=0)
    snapshot = env.snapshot()
    other = tasks.make("metaworld/reach-v3")
    other.reset(seed=0)
    with pytest.raises(ValueError, match="cannot be restored into model"):
        env.restore(other.snapshot())
    state = dict(snapshot.task_state)
    state["suite._target_pos"] = np.array([np.nan, 0.0, 0.0])
    with pytest.raises(ValueError, match="suite._target_pos"):
        env.restore(dataclasses.replace(snapshot, task_state=state))
    state = dict(snapshot.task_state)
    del state["suite.curr_path_length"]
    with pytest.raises(ValueError, match="suite.curr_path_length"):
        env.restore(dataclasses.replace(snapshot, task_state=state))
    state = {**snapshot.task_state, "suite_model.body_pos": np.zeros(3)}
    with pytest.raises(ValueError, match="suite_model.body_pos"):
        env.restore(dataclasses.replace(snapshot, task_state=state))
    after = env.step(np.zeros(4))[0]  # nothing was written by the refused restores
    env.restore(snapshot)
    assert np.array_equal(env.step(np.zeros(4))[0]["state"], after["state"])


def test_difficulty_scales_the_start_ranges_around_their_centre():
    env = tasks.make("metaworld/push-v3")
    starts = [env.reset(seed=s, options={"difficulty": 0.0})[0]["state"] for s in range(3)]
    assert all(np.array_equal(starts[0], s) for s in starts[1:])  # the centre, every seed
    wide = [env.reset(seed=s)[0]["state"] for s in range(3)]
    assert not np.array_equal(wide[0], wide[1])
    with pytest.raises(ValueError, match="difficulty=1.5"):
        env.reset(options={"difficulty": 1.5})
    with pytest.raises(ValueError, match="randomization"):
        env.reset(options={"randomization": {}})


def test_the_hydra_group_composes_and_refuses_what_a_suite_cannot_honour():
    config = harness_config.compose(["task=metaworld", "task.name=door-open-v3"])
    assert (config.task.suite, config.task.name) == ("metaworld", "door-open-v3")
    assert config.task.env_options()["suite"] == "metaworld"
    with pytest.raises(ConfigError, match="'door-opn-v3' is unknown"):
        harness_config.compose(["task=metaworld", "task.name=door-opn-v3"])
    with pytest.raises(ConfigError, match="physics='fast' is an option of our own tasks"):
        harness_config.compose(["task=metaworld", "task.physics=fast"])
    with pytest.raises(ConfigError, match="camera='front'"):
        harness_config.compose(["task=metaworld", "task.camera=front"])
    with pytest.raises(SuiteError, match="camera=.front."):
        tasks.make("metaworld/push-v3", camera="front")


def fast(suite: str, name: str) -> list[str]:
    return [f"task={suite}", f"task.name={name}", "algo=grpo", "policy=mlp",
            "policy.normalize_state=true", "algo.iterations=2", "algo.workers=1",
            "algo.num_start_states=2", "algo.group_size=4", "algo.start_policy.bc.demos=3",
            "algo.start_policy.bc.epochs=20", "task.max_episode_steps=60", "eval.episodes=4",
            "eval.final_episodes=4", "eval.every_steps=100000000", "logger.videos=false"]


@pytest.mark.parametrize(("suite", "name"), [("metaworld", "reach-v3"), ("robosuite", "Lift")])
def test_grpo_clones_the_suites_expert_and_fine_tunes_on_its_success(tmp_path, monkeypatch,
                                                                     suite, name):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    # robosuite steps at ~170/s on one core (Meta-World ~1,500): its run is smaller
    small = ["algo.start_policy.bc.demos=2", "eval.episodes=2", "eval.final_episodes=2",
             "algo.group_size=2"] if suite == "robosuite" else []
    # Meta-World: groups also start along the expert's demos and from replayed failures
    branching = ["algo.starts.source=mix", "algo.starts.demos=3", "algo.starts.replay_every=2",
                 "algo.starts.weights={reset: 0.2, demo: 0.6, replay: 0.2}",
                 "curriculum=success_band"] if suite == "metaworld" else []
    summary = trainers.train(harness_config.compose([*fast(suite, name), *small, *branching]),
                             tmp_path / "run")
    assert summary["task"] == name and summary["algo"] == "grpo"
    assert summary["env_steps"] > 0 and 0.0 <= summary["success_rate"] <= 1.0
    metrics = read_metrics(tmp_path / "run" / "metrics.csv")
    assert len(metrics["rollout/success_rate"]) == 2  # two iterations, each logged
    if branching:
        assert summary["start_states"]["sources"] == "mix"
        assert max(share for _, share in metrics["starts/share_demo"]) > 0  # along a demo
    demos = list((tmp_path / "data").rglob(f"{name}_*.hdf5"))
    assert demos, "the scripted expert's demos are cached under HARNESS_DATA"


def test_sb3_ppo_trains_on_a_metaworld_task(tmp_path):
    config = harness_config.compose([
        "task=metaworld", "task.name=reach-v3", "task.max_episode_steps=50", "algo=ppo",
        "algo.n_steps=128", "algo.batch_size=64", "algo.n_epochs=2", "policy.net_arch=[16]",
        "total_timesteps=256", "eval.every_steps=0", "eval.final_episodes=2"])
    summary = trainers.train(config, tmp_path / "ppo")
    assert summary["algo"] == "ppo" and summary["env_steps"] >= 256
    assert (tmp_path / "ppo" / "checkpoints").is_dir()


def test_the_metaworld_experiment_composes_here():
    config = harness_config.compose(["+experiment=metaworld_state", "task.name=drawer-open-v3"])
    assert (config.task.suite, config.task.name, config.algo.name) == \
        ("metaworld", "drawer-open-v3", "grpo")
    assert config.policy.head["name"] == "gaussian" and config.algo.start_policy.bc.demos == 20
    config = harness_config.compose(["+experiment=metaworld_pixels"])
    assert (config.task.obs_mode, config.policy.name, config.policy.instruction_keypoints) == \
        ("pixels", "tiny_vla", 0)
    config = harness_config.compose(["+experiment=robosuite_state", "task.name=Door"])
    assert (config.task.suite, config.task.name, config.task.max_episode_steps) == \
        ("robosuite", "Door", None)
