"""Rollout workers as processes or Ray actors: the same seed gives the same run, bit for bit,
whatever the backend and the number of workers; a worker killed mid-iteration is replaced and
the iteration completes; bad Ray settings, a cluster that cannot be joined included, are
refused before the run directory exists.

Real group-trainer runs on reach (state, a tiny MLP), real worker processes, a real local Ray.
The tests that use Ray are marked ``ray`` (one xdist worker runs those, tests/conftest.py); the
process tests balance across both workers.
"""

from __future__ import annotations

import os
import signal
import socket
import threading

import numpy as np
import pytest
import torch

import tasks
from harness import config as harness_config
from harness import trainers
from harness.algos.rollout.batched import BatchedPool
from harness.algos.rollout.pools import PerWorkerPool, make_pool
from harness.algos.rollout.records import EngineSpec, Job, RolloutWorkerError
from harness.config import ConfigError
from harness.config.algos import RolloutConfig
from harness.policies import make, sample_tokens
from harness.policies.saving import policy_record
from harness_common.files import read_metrics

FAST = [
    "task=reach", "task.obs_mode=state", "task.difficulty=0.3", "task.max_episode_steps=12",
    "policy=mlp", "policy.hidden=32", "algo=grpo", "algo.group_size=4", "algo.num_start_states=3",
    "algo.learning_rate=3e-3", "algo.iterations=3", "eval.every_steps=0",
    "eval.final_episodes=6", "logger=none",
]
OPERATIONAL = ("time/", "rollout/worker_restarts")  # wall clock and restarts differ by design


def run(tmp_path, name: str, *overrides: str) -> dict[str, list]:
    config = harness_config.compose([*FAST, *overrides])
    summary = trainers.train(config, tmp_path / name)
    metrics = read_metrics(tmp_path / name / "metrics.csv")
    learned = {k: v for k, v in metrics.items() if not k.startswith(OPERATIONAL)}
    learned["final"] = [(0, summary["success_rate"]), (0, summary["env_steps"])]
    return learned


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run(tmp_path_factory.mktemp("one"), "run", "algo.workers=1")


def test_sampling_is_the_inverse_cdf_of_each_row():
    """Worked by hand: probabilities (0.1, 0.2, 0.7) -> cdf (0.1, 0.3, 1.0); u in [0, 0.1) is
    token 0, [0.1, 0.3) token 1, [0.3, 1) token 2; a zero-probability token is never drawn."""
    logits = torch.log(torch.tensor([0.1, 0.2, 0.7])).expand(6, 3)
    uniforms = torch.tensor([0.0, 0.0999, 0.1001, 0.2999, 0.3001, 0.99999])
    assert sample_tokens(logits, uniforms).tolist() == [0, 0, 1, 1, 2, 2]
    zero = torch.tensor([[0.0, -float("inf"), 0.0]])
    assert sample_tokens(zero, torch.tensor([0.5])).item() == 2
    assert sample_tokens(zero, torch.tensor([0.4999])).item() == 0


@pytest.mark.parametrize("workers", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_the_number_of_processes_does_not_change_the_run(tmp_path, reference, workers):
    assert run(tmp_path, "run", f"algo.workers={workers}") == reference


@pytest.mark.parametrize("workers", [1, 2])
def test_batched_rollouts_give_the_same_run_as_policy_copies(tmp_path, reference, workers):
    """One policy in the learner, environments in workers: the same attempts, the same run."""
    assert run(tmp_path, "run", f"algo.workers={workers}", "algo.rollout.mode=batched") == \
        reference


@pytest.mark.ray
@pytest.mark.parametrize("mode", [pytest.param("per_worker", marks=pytest.mark.slow), "batched"])
def test_ray_actors_give_the_same_run_as_processes(tmp_path, reference, mode, local_ray):
    assert run(tmp_path, "run", "algo.workers=2", "algo.rollout.backend=ray",
               f"algo.rollout.mode={mode}") == reference


def _jobs(policy_count: int = 48):
    env = tasks.make("reach", obs_mode="state", max_episode_steps=12)
    jobs = []
    for group in range(policy_count // 4):
        env.reset(seed=group, options={"difficulty": 0.3})
        jobs += [Job(env.snapshot(), group, 0.3)] * 4
    torch.manual_seed(0)
    policy = make(harness_config.compose(FAST).policy,
                  env.observation_space)
    env.close()
    spec = EngineSpec("reach", {"obs_mode": "state", "max_episode_steps": 12},
                      policy_record(policy), 6)
    return policy, jobs, spec


def _same(a, b) -> None:
    assert np.array_equal(a.decisions, b.decisions) and np.array_equal(a.lengths, b.lengths)
    assert np.array_equal(a.success, b.success)
    for key in a.obs:
        assert np.array_equal(a.obs[key], b.obs[key])


def _kill_soon(pool, timer: float = 0.3) -> threading.Timer:
    victim = pool.worker_pids()[0]
    killer = threading.Timer(timer, os.kill, (victim, signal.SIGKILL))
    killer.start()
    return killer


@pytest.mark.parametrize(("mode", "backend"), [  # each backend and each mode once by default
    pytest.param("per_worker", "processes", marks=pytest.mark.slow),
    pytest.param("per_worker", "ray", marks=pytest.mark.ray),
    ("batched", "processes"),
    pytest.param("batched", "ray", marks=[pytest.mark.slow, pytest.mark.ray]),
])
def test_a_worker_killed_mid_call_is_replaced_and_its_attempts_played_again(backend, mode):
    policy, jobs, spec = _jobs()
    with PerWorkerPool(spec, 1) as local:
        expected = local.run(policy, jobs, 1.0, seed=(0, 7, 0))
    if backend == "ray":
        pytest.importorskip("ray")
    settings = RolloutConfig(backend=backend, cpus_per_worker=1)
    if mode == "batched":
        pool = BatchedPool(spec.host, 2, settings)
    else:
        pool = PerWorkerPool(spec, 2, settings)
    with pool:
        pool.run(policy, jobs[:2], 1.0, seed=0)  # warm: both workers up and holding weights
        killer = _kill_soon(pool, timer=0.05)  # most often mid-call; else before the next one
        rollout = pool.run(policy, jobs, 1.0, seed=(0, 7, 0))
        killer.join()
        again = pool.run(policy, jobs, 1.0, seed=(0, 7, 0))  # the replacement serves on
        assert pool.restarts == 1
        _same(rollout, expected)
        _same(again, expected)


@pytest.mark.parametrize("mode", ["per_worker", "batched"])
def test_an_exception_in_a_worker_process_comes_back_naming_the_worker(mode):
    """A snapshot of another scene fails to restore inside the worker; the error, its type and
    message, reaches the caller as a RolloutWorkerError naming the worker."""
    policy, jobs, spec = _jobs(8)
    push = tasks.make("push")
    push.reset(seed=0)
    jobs[5] = Job(push.snapshot(), 1, 0.3)  # the second worker's chunk
    push.close()
    pool = PerWorkerPool(spec, 2) if mode == "per_worker" else BatchedPool(spec.host, 2)
    with pool, pytest.raises(RolloutWorkerError, match="rollout worker 1 failed: ValueError"):
        pool.run(policy, jobs, 1.0, seed=0)


def test_jobs_and_specs_that_are_not_records_are_refused():
    policy, jobs, spec = _jobs(4)
    with PerWorkerPool(spec, 1) as pool, pytest.raises(TypeError, match=r"jobs\[2\] is a tuple"):
        pool.run(policy, [*jobs[:2], (jobs[2].snapshot, 0, 0.3)], 1.0, seed=0)
    with pytest.raises(TypeError, match="expected a harness.algos.rollout.records.EngineSpec"):
        make_pool(RolloutConfig(), 1, ("reach", {}, policy.config, policy.obs_shapes, 6))
    with pytest.raises(ValueError, match="num_envs=0"):
        EngineSpec("reach", {}, policy_record(policy), 0)


def test_weights_travel_only_when_they_changed():
    policy, jobs, spec = _jobs()
    with PerWorkerPool(spec, 2) as pool:
        first = pool.run(policy, jobs, 1.0, seed=1)
        held = list(pool._held)
        pool.run(policy, jobs, 1.0, seed=1)
        assert pool._held == held  # nothing changed, nothing sent
        with torch.no_grad():
            for parameter in policy.parameters():
                parameter.add_(0.5)
        changed = pool.run(policy, jobs, 1.0, seed=1)
        assert pool._held != held
        assert not np.array_equal(first.decisions, changed.decisions)


# -------------------------------------------------------------------------- bad input
@pytest.mark.ray
def test_an_unreachable_ray_address_is_refused_before_the_run_directory(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = harness_config.compose(
        [*FAST, "algo.rollout.backend=ray", f"algo.rollout.ray_address=127.0.0.1:{port}"])
    with pytest.raises(ConfigError, match=f"algo.rollout.ray_address='127.0.0.1:{port}'"):
        trainers.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.ray
def test_a_ray_address_that_answers_but_cannot_be_joined_is_refused_before_the_run_directory(
        tmp_path, monkeypatch):
    """A port that answers but holds no cluster that takes this driver (one with token
    authentication refuses it after Ray's ~30 s of retries, here at once): the join is part of
    the pre-flight checks, so the run stops before its directory exists."""
    ray = pytest.importorskip("ray")

    def refuse(address: str, **options) -> None:
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        config = harness_config.compose(
            [*FAST, "algo.rollout.backend=ray", f"algo.rollout.ray_address={address}"])
        with pytest.raises(ConfigError, match=f"ray_address='{address}': cannot join"):
            trainers.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.ray
def test_a_joined_cluster_too_small_for_the_workers_is_refused_before_the_run_directory(
        tmp_path, monkeypatch):
    """Joined in the pre-flight checks, a cluster whose CPUs cannot hold ``algo.workers`` actors
    stops the run before its directory exists, and the driver leaves the cluster."""
    ray = pytest.importorskip("ray")
    left = []
    monkeypatch.setattr(ray, "init", lambda address, **options: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}])
    monkeypatch.setattr(ray, "shutdown", lambda: left.append(True))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        config = harness_config.compose(
            [*FAST, "algo.rollout.backend=ray", f"algo.rollout.ray_address={address}",
             "algo.workers=3", "algo.rollout.cpus_per_worker=1"])
        with pytest.raises(ConfigError, match="algo.workers=3 .* asks for 3 CPUs.* has 2"):
            trainers.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert left == [True]


@pytest.mark.ray
def test_a_resource_request_no_node_can_hold_is_refused():
    pytest.importorskip("ray")
    _, _, spec = _jobs()
    with pytest.raises(ConfigError, match="gpus_per_worker=1"):
        PerWorkerPool(spec, 1, RolloutConfig(backend="ray", cpus_per_worker=1,
                                             gpus_per_worker=1))
    import ray

    assert not ray.is_initialized()  # the local instance it started is shut down


@pytest.mark.parametrize("override, message", [
    ("algo.rollout.backend=dask", "algo.rollout.backend='dask'"),
    ("algo.rollout.cpus_per_worker=0", "algo.rollout.cpus_per_worker=0"),
    ("algo.rollout.gpus_per_worker=0.5", "need algo.rollout.backend=ray"),
])
def test_bad_rollout_settings_are_refused_at_load(override, message):
    with pytest.raises(ConfigError, match=message):
        harness_config.compose([*FAST, override])


def test_replay_starts_give_the_same_run_in_every_mode(tmp_path):
    """Captured near-miss states travel back from the workers the same way in every mode."""
    replay = ("algo.starts.source=replay", "algo.starts.replay_every=3")
    one = run(tmp_path, "one", "algo.workers=1", *replay)
    assert one["starts/replay_buffer"][-1][1] > 0
    assert run(tmp_path, "two", "algo.workers=2", *replay) == one
    assert run(tmp_path, "batched", "algo.workers=2", "algo.rollout.mode=batched", *replay) == one
