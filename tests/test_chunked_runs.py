"""Action chunks through the group trainer, on real reach environments: the rollout asks the
policy every ``execute_steps`` control steps and records what a replay reproduces; the update
moves only what the executed steps read; a chunked run trains end to end, evaluates chunk by
chunk in the pool and one episode at a time alike, exports and deploys."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tasks
from harness import config as harness_config
from harness import trainers
from harness.algos.group.checkpoints import policy_fn
from harness.algos.group.update import GroupTrainer
from harness.algos.rollout.pools import make_pool
from harness.algos.rollout.records import EngineSpec, Job
from harness.evaluation import evaluate
from harness.policies import make, tokens_to_actions
from harness.policies.saving import policy_record
from harness_common.files import read_metrics

torch.set_num_threads(1)

H, K = 4, 2  # chunk_size, execute_steps
LIMIT = 11  # control steps per attempt: not a multiple of K, so a last chunk can be cut short
FAST = [
    "task=reach", "task.obs_mode=state", "task.difficulty=0.1", f"task.max_episode_steps={LIMIT}",
    "policy=mlp", "policy.hidden=32", f"policy.chunk_size={H}", f"policy.execute_steps={K}",
    "algo=grpo", "algo.group_size=4", "algo.num_start_states=3", "algo.learning_rate=3e-3",
    "algo.num_iterations=2", "algo.minibatch_size=6", "eval.every_steps=0",
    "eval.final_episodes=6", "eval.episodes=4", "logger=none",
]
OPTIONS = {"obs_mode": "state", "max_episode_steps": LIMIT}


def _policy_and_jobs(groups: int = 3):
    cfg = harness_config.compose(FAST)
    env = tasks.make("reach", **OPTIONS)
    torch.manual_seed(0)
    policy = make(cfg.policy, env.observation_space)
    jobs = []
    for group in range(groups):
        env.reset(seed=group, options={"difficulty": 0.1})
        jobs += [Job(env.snapshot(), group, 0.1)] * cfg.algo.group_size
    env.close()
    return cfg, policy, jobs


def _rollout(cfg, policy, jobs, mode: str = "per_worker"):
    rollout_settings = harness_config.compose([*FAST, f"algo.rollout.mode={mode}"]).algo.rollout
    spec = EngineSpec("reach", OPTIONS, policy_record(policy), len(jobs))
    with make_pool(rollout_settings, 1, spec) as pool:
        return pool.run(policy, jobs, cfg.algo.temperature, seed=(0, 1))


def test_attempts_decide_every_execute_steps_and_replay_exactly():
    """Each decision's observation, tokens and executed steps are what the environment saw:
    restoring the attempt's snapshot and playing the first ``executed`` actions of each
    recorded chunk meets the same observations and ends at the same step, with the same
    outcome."""
    cfg, policy, jobs = _policy_and_jobs()
    rollout = _rollout(cfg, policy, jobs)
    assert rollout.decisions.shape == (len(rollout.executed), H * 4)
    assert len(rollout.obs["state"]) == len(rollout.executed)
    assert rollout.executed.min() >= 1 and rollout.executed.max() <= K
    assert np.array_equal(rollout.lengths, np.add.reduceat(rollout.executed, rollout.starts))
    assert (rollout.executed == 1).any(), "some attempt must end in the middle of a chunk"
    env = tasks.make("reach", **OPTIONS)
    for attempt, job in enumerate(jobs):
        obs, _ = env.reset(options={"noise_key": attempt, "snapshot": job.snapshot})
        first = rollout.starts[attempt]
        steps, done = 0, False
        for row in range(first, first + rollout.decision_counts[attempt]):
            assert not done
            np.testing.assert_array_equal(obs["state"], rollout.obs["state"][row])
            chunk = tokens_to_actions(rollout.decisions[row], policy.head.num_bins).view(H, 4)
            for action in chunk[: rollout.executed[row]].numpy():
                obs, _, terminated, truncated, info = env.step(action)
                steps += 1
                done = terminated or truncated
        assert done and steps == rollout.lengths[attempt]
        assert bool(info["is_success"]) == bool(rollout.success[attempt])
    env.close()


def test_both_rollout_modes_play_the_same_chunks():
    cfg, policy, jobs = _policy_and_jobs(groups=2)
    copies, batched = _rollout(cfg, policy, jobs), _rollout(cfg, policy, jobs, "batched")
    for name in ("decisions", "executed", "decision_counts", "lengths", "success"):
        assert np.array_equal(getattr(copies, name), getattr(batched, name)), name


def test_the_update_moves_only_what_the_executed_steps_read():
    """Tokens of the steps a decision never played carry no gradient: with ``k = 2`` of ``H =
    4`` the action head's rows of steps 2 and 3 stay as they were, those of 0 and 1 move, and
    the first step's ratio is exactly 1 (the old log-probs are the sampling ones)."""
    cfg, policy, jobs = _policy_and_jobs(groups=2)
    rollout = _rollout(cfg, policy, jobs)
    trainer = GroupTrainer(cfg, policy)
    trainer.max_tokens = LIMIT * 4
    before = policy.head.linear.weight.detach().clone().view(H, 4, 11, -1)
    rewards = np.array([1, 0, 0, 1, 0, 1, 1, 0], dtype=np.float32)
    metrics = trainer.update(rollout, rewards, trainer.advantages(rollout, rewards),
                             np.ones(2, dtype=bool))
    after = policy.head.linear.weight.detach().view(H, 4, 11, -1)
    assert torch.equal(after[K:], before[K:])
    assert (after[:K] - before[:K]).abs().amax(dim=(1, 2, 3)).min() > 0
    assert metrics["train/gradient_steps"] == 2.0 * cfg.algo.num_iterations
    assert math.isfinite(metrics["train/entropy"]) and metrics["train/kl_to_reference"] >= 0


def test_a_chunked_run_trains_end_to_end_and_evaluates_in_chunks(tmp_path, monkeypatch):
    """BC on chunks of demonstrations, two iterations of GRPO with ``H = 4, k = 2``, greedy
    evaluations: the run's checkpoint holds the chunked policy, and its evaluation asks the
    policy once per ``k`` steps, in the pool as one episode at a time."""
    from harness.algos.group.checkpoints import policy_from_state, read_checkpoint
    from harness.algos.group.collect import evaluate_in_pool

    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    config = harness_config.compose([*FAST, "algo.iterations=2", "algo.start_policy.bc.demos=4",
                                     "algo.start_policy.bc.epochs=20"])
    summary = trainers.train(config, tmp_path / "run")
    metrics = read_metrics(tmp_path / "run" / "metrics.csv")
    assert max(v for _, v in metrics["train/grad_norm"]) > 0, "no group had signal"
    assert summary["env_steps"] == pytest.approx(
        sum(12 * v for _, v in metrics["rollout/mean_length_steps"]))
    assert all(0 < v <= LIMIT for _, v in metrics["rollout/mean_length_steps"])
    assert "bc/train_loss" in metrics and math.isfinite(metrics["bc/train_loss"][0][1])
    policy = policy_from_state(read_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt"))
    assert (policy.config.chunk_size, policy.config.execute_steps) == (H, K)
    policy.eval()

    calls = []
    decide = policy_fn(policy)

    def counted(obs):
        chunk = decide(obs)
        calls.append(chunk.shape)
        return chunk

    sequential = evaluate(counted, lambda: tasks.make("reach", **OPTIONS), 5, [0.1, 0.6],
                          seed=300)
    assert set(calls) == {(K, 4)}
    assert len(calls) == sum(math.ceil(e.length / K) for e in sequential.episodes)
    env = tasks.make("reach", **OPTIONS)
    spec = EngineSpec("reach", OPTIONS, policy_record(policy), 4)
    with make_pool(config.algo.rollout, 1, spec) as pool:
        pooled = evaluate_in_pool(pool, policy, env, 5, [0.1, 0.6], seed=300)
    env.close()
    assert [(e.success, e.length) for e in pooled.episodes] == [
        (e.success, e.length) for e in sequential.episodes]
    assert [e.episode_return for e in pooled.episodes] == pytest.approx(
        [e.episode_return for e in sequential.episodes], rel=1e-12)


def test_an_exported_chunk_deploys_k_steps_per_decision(tmp_path):
    from harness.deploy import ExportedPolicy, deploy
    from harness.export import export_onnx, sample_observations

    cfg, policy, _ = _policy_and_jobs(groups=1)
    env = tasks.make("reach", **OPTIONS)
    model, info = export_onnx(policy, {"task": "reach", "task_options": OPTIONS},
                              sample_observations(env, 16))
    assert (info["chunk_size"], info["execute_steps"]) == (H, K)
    assert info["parity"]["token_mismatches"] == 0 and info["parity"]["action_mismatches"] == 0
    (tmp_path / "chunk.onnx").write_bytes(model)
    exported = ExportedPolicy(tmp_path / "chunk.onnx")
    obs, _ = env.reset(seed=3)
    greedy = policy_fn(policy.eval())(obs)
    np.testing.assert_array_equal(exported(obs), greedy)
    assert greedy.shape == (K, 4)
    result = deploy(exported, episodes=3, difficulties=[0.1], seed=7)
    steps = sum(e.length for e in result.evaluation.episodes)
    assert len(result.step_s) == steps
    assert len(result.inference_s) == sum(math.ceil(e.length / K)
                                          for e in result.evaluation.episodes)
    env.close()
