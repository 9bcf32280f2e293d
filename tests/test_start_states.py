"""Groups that start anywhere: along expert demonstrations (by a reverse curriculum over the
fraction of the demonstration left) or from the policy's own failed attempts; evaluation is
untouched by where training starts. Real demos, real MuJoCo, real (tiny) runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tasks
from harness import config as harness_config
from harness import curriculum as curricula
from harness import trainers
from harness.algos.group.start_states import StartStates
from harness.algos.rollout.pools import PerWorkerPool
from harness.algos.rollout.records import EngineSpec, Job
from harness.config import ConfigError
from harness.demos import collect_demos, load_demo_snapshots, load_demos
from harness.policies import make
from harness.policies.saving import policy_record
from harness_common.files import read_metrics

FAST = [
    "task=reach", "task.obs_mode=state", "task.difficulty=0.5", "task.max_episode_steps=20",
    "policy=mlp", "policy.hidden=32", "algo=grpo", "algo.group_size=4", "algo.num_start_states=4",
    "algo.iterations=3", "eval.every_steps=0", "eval.final_episodes=8", "logger=none",
]


@pytest.fixture(scope="module")
def demo_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("demos") / "reach.hdf5"
    collect_demos(path, "reach", 3, obs_mode="state", difficulty=0.5, max_episode_steps=20,
                  progress=False)
    return path


def test_a_group_started_from_a_demo_step_replays_that_step_exactly(demo_path):
    """All G attempts' first observations equal the demo's recorded observation at that step."""
    snapshots = load_demo_snapshots(demo_path)
    demos = load_demos(demo_path)
    env = tasks.make("reach", obs_mode="state", max_episode_steps=20)
    torch.manual_seed(0)
    policy = make(harness_config.compose(FAST).policy,
                  env.observation_space)
    step = len(snapshots[1]) // 2
    recorded = demos.obs["state"][len(snapshots[0]) + step]  # episodes are concatenated
    snapshot = tasks.snapshot_from_bytes(snapshots[1][step])
    jobs = [Job(snapshot, 0, 0.5)] * 4
    with PerWorkerPool(EngineSpec("reach", {"obs_mode": "state", "max_episode_steps": 20},
                                  policy_record(policy), 4), 1) as pool:
        rollout = pool.run(policy, jobs, 1.0, seed=0)
    firsts = rollout.obs["state"][rollout.starts]
    assert np.array_equal(firsts, np.stack([recorded] * 4))
    assert len(set(map(bytes, rollout.decisions[rollout.starts]))) > 1  # attempts then differ


def test_a_version_1_demo_file_is_refused_with_the_way_out(tmp_path, demo_path):
    import h5py

    old = tmp_path / "old.hdf5"
    old.write_bytes(demo_path.read_bytes())
    with h5py.File(old, "a") as f:
        del f["data"].attrs["format_version"]
    with pytest.raises(ValueError, match="format version 1.*collect_demos"):
        load_demo_snapshots(old)


def _starts(*overrides, demos=None):
    cfg = harness_config.compose([*FAST, *overrides])
    curriculum = curricula.make("fixed", seed=0, **cfg.curriculum_params())
    env = tasks.make("reach", obs_mode="state", max_episode_steps=20)
    return StartStates(cfg, curriculum, env, demos)


def test_the_demo_offset_moves_back_on_success_and_not_on_failure(demo_path):
    """The frontier of the fraction remaining moves from the first bin only when success at
    the frontier passes the band's upper edge."""
    demos = load_demo_snapshots(demo_path)
    options = ["algo.starts.source=demo", "algo.starts.curriculum.min_obs=8"]
    failing, winning = _starts(*options, demos=demos), _starts(*options, demos=demos)
    for starts, outcome in ((failing, 0.0), (winning, 1.0)):
        counter = 0
        for _ in range(40):
            start, counter = starts.draw(counter)
            starts.record(start, [outcome] * 4, informative=False)
    assert failing.demo_curriculum.frontier == pytest.approx(0.1)
    assert winning.demo_curriculum.frontier > 0.5
    assert winning.metrics()["starts/demo_remaining"] > 0.5


def test_demo_starts_near_the_end_are_a_few_steps_from_success(demo_path):
    demos = load_demo_snapshots(demo_path)
    starts = _starts("algo.starts.source=demo", "algo.starts.weights={demo: 1.0}", demos=demos)
    env = tasks.make("reach", obs_mode="state", max_episode_steps=20)
    counter = 0
    for _ in range(5):
        start, counter = starts.draw(counter)
        assert start.source == "demo" and start.remaining <= 0.1
        env.reset(options={"snapshot": start.snapshot})
        raw = env.unwrapped
        assert raw.task.success_margin(raw) < 0.05  # within 5 cm of the target


def test_the_replay_buffer_is_bounded_and_keeps_failures_only():
    starts = _starts("algo.starts.source=replay", "algo.starts.replay_buffer=5")
    env = tasks.make("reach", obs_mode="state", max_episode_steps=20)
    env.reset(seed=0)
    data = tasks.snapshot_to_bytes(env.snapshot())
    starts.add_replays([data] * 12, np.array([False] * 8 + [True] * 4), np.full(12, 0.5))
    assert len(starts.replay) == 5
    starts.add_replays([data, None], np.array([True, False]), np.full(2, 0.5))
    assert len(starts.replay) == 5
    state = starts.state_dict()
    again = _starts("algo.starts.source=replay", "algo.starts.replay_buffer=5")
    again.load_state_dict(state)
    assert list(again.replay) == list(starts.replay)


def _run(tmp_path, name, *overrides):
    config = harness_config.compose([*FAST, *overrides])
    summary = trainers.train(config, tmp_path / name)
    return summary, read_metrics(tmp_path / name / "metrics.csv")


def test_replay_and_demo_runs_log_their_sources_and_leave_evaluation_alone(tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)  # the start demos are cached under HARNESS_DATA
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    reset, _ = _run(tmp_path, "reset")
    mixed, metrics = _run(tmp_path, "mix", "algo.starts.source=mix", "algo.starts.demos=3",
                          "algo.starts.replay_every=2")
    assert mixed["start_states"]["sources"] == "mix"
    for key in ("starts/share_reset", "starts/share_demo", "starts/share_replay",
                "starts/demo_remaining", "starts/replay_buffer"):
        assert key in metrics, key
    assert metrics["starts/replay_buffer"][-1][1] > 0
    from harness_common.plots import start_states_curve

    figure = start_states_curve(tmp_path / "mix" / "metrics.csv", tmp_path / "starts.png")
    assert figure.stat().st_size > 10_000  # a real picture of both panels
    with pytest.raises(ValueError, match="starts/demo_remaining"):
        start_states_curve(tmp_path / "reset" / "metrics.csv", tmp_path / "none.png")
    # The start policy is evaluated on the same test seeds and starts, whatever training does.
    for key in ("start_success_rate", "start_success_interval", "start_sampled_success_rate",
                "best_start_decoding", "start_validation_success_rate"):
        assert mixed[key] == reset[key], key
    # the demos of demo starts are recorded from the run's demo seed (seed 0: 5 * 10^6): one more
    # range, held out of evaluation
    assert mixed["seed_ranges"] == {**reset["seed_ranges"], "start_demo": [5_000_000, 5_000_030]}


@pytest.mark.parametrize("override, message", [
    ("algo.starts.source=demos", "algo.starts.source='demos'"),
    ("algo.starts.weights={reset: -1, demo: 1}", "weights must be >= 0"),
    ("algo.starts.replay_buffer=0", "algo.starts.replay_buffer=0"),
])
def test_bad_start_settings_are_refused_at_load(override, message):
    with pytest.raises(ConfigError, match=message):
        harness_config.compose([*FAST, override])


def test_an_unknown_start_source_is_named_by_hydra():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as error:
        harness_config.compose([*FAST, "algo.starts.weights={reset: 1, expert: 1}"])
    assert "expert" in str(error.value.__cause__)
