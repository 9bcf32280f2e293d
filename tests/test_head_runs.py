"""The continuous action heads (``policy/head=gaussian|flow``) through the group trainer,
on real reach environments: rollouts record what a replay reproduces, a sampled record scores
its own sampling density, every group algorithm updates every head with a first ratio of
exactly 1, a run trains end to end (BC on chunks, GRPO, checkpoint, evaluation), and settings a
head cannot take are refused by name."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException

import tasks
from harness import config as harness_config
from harness import trainers
from harness.algos.group.update import GroupTrainer
from harness.algos.rollout.pools import make_pool
from harness.algos.rollout.records import EngineSpec, Job
from harness.config.errors import ConfigError
from harness.policies import make, obs_to_batch
from harness.policies.heads.base import gaussian_log_density
from harness.policies.heads.gaussian import log1m_tanh_squared
from harness.policies.saving import policy_record
from harness_common.files import read_metrics

torch.set_num_threads(1)

H, K, A = 4, 2, 4  # chunk_size, execute_steps, action_dim
LIMIT = 11  # control steps per attempt: not a multiple of K, so a last chunk can be cut short
HEADS = ("gaussian", "flow")
OPTIONS = {"obs_mode": "state", "max_episode_steps": LIMIT}


def _fast(head: str, algo: str = "grpo") -> list[str]:
    return [
        "task=reach", "task.obs_mode=state", "task.difficulty=0.1",
        f"task.max_episode_steps={LIMIT}", "policy=mlp", "policy.hidden=32",
        f"policy.chunk_size={H}", f"policy.execute_steps={K}", f"policy/head={head}",
        f"algo={algo}", "algo.group_size=4", "algo.num_start_states=3",
        "algo.learning_rate=1e-3", "algo.num_iterations=2", "algo.minibatch_size=6",
        "eval.every_steps=0", "eval.final_episodes=6", "eval.episodes=4", "logger=none",
    ]


def _policy_and_jobs(head: str, groups: int = 3, algo: str = "grpo"):
    cfg = harness_config.compose(_fast(head, algo))
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
    settings = harness_config.compose([*_fast(policy.spec.head),
                                       f"algo.rollout.mode={mode}"]).algo.rollout
    spec = EngineSpec("reach", OPTIONS, policy_record(policy), len(jobs))
    with make_pool(settings, 1, spec) as pool:
        return pool.run(policy, jobs, cfg.algo.temperature, seed=(0, 1))


def _chunk_of(policy, record: np.ndarray) -> np.ndarray:
    """The actions ``(H, A)`` a record stands for: ``tanh(u)`` for the Gaussian, the chain's
    last point clipped to the box for the flow."""
    record = torch.as_tensor(record)
    if policy.spec.head == "gaussian":
        return torch.tanh(record).view(H, A).numpy()
    return record[-H * A:].clamp(-1.0, 1.0).view(H, A).numpy()


@pytest.mark.parametrize("head", HEADS)
def test_attempts_record_float_decisions_that_replay_exactly(head):
    cfg, policy, jobs = _policy_and_jobs(head)
    rollout = _rollout(cfg, policy, jobs)
    assert rollout.decisions.dtype == np.float32
    assert rollout.decisions.shape == (len(rollout.executed), policy.head.record_dim)
    assert rollout.executed.max() <= K and (rollout.executed == 1).any()
    env = tasks.make("reach", **OPTIONS)
    for attempt, job in enumerate(jobs):
        obs, _ = env.reset(options={"noise_key": attempt, "snapshot": job.snapshot})
        first, steps, done = rollout.starts[attempt], 0, False
        for row in range(first, first + rollout.decision_counts[attempt]):
            assert not done
            np.testing.assert_array_equal(obs["state"], rollout.obs["state"][row])
            for action in _chunk_of(policy, rollout.decisions[row])[: rollout.executed[row]]:
                obs, _, terminated, truncated, info = env.step(action)
                steps += 1
                done = terminated or truncated
        assert done and steps == rollout.lengths[attempt]
        assert bool(info["is_success"]) == bool(rollout.success[attempt])
    env.close()


@pytest.mark.parametrize("head", HEADS)
def test_both_rollout_modes_play_the_same_decisions(head):
    cfg, policy, jobs = _policy_and_jobs(head, groups=2)
    copies, batched = _rollout(cfg, policy, jobs), _rollout(cfg, policy, jobs, "batched")
    for name in ("decisions", "executed", "decision_counts", "lengths", "success"):
        assert np.array_equal(getattr(copies, name), getattr(batched, name)), name


def test_a_gaussian_record_scores_its_own_sampling_density():
    """``act`` turns each row's uniforms into normals by the inverse CDF: the record is ``u =
    mean + T std ndtri(uniform)``, and ``log_prob`` gives, per chunk entry, the density of
    ``tanh(u)`` by the change of variables, at the same temperature."""
    _, policy, _ = _policy_and_jobs("gaussian")
    env = tasks.make("reach", **OPTIONS)
    obs = obs_to_batch([env.reset(seed=s)[0] for s in range(5)])
    env.close()
    uniforms = torch.rand(5, policy.spec.noise_width, generator=torch.Generator().manual_seed(4))
    record, actions = policy.act(obs, temperature=0.7, uniforms=uniforms)
    mean, log_std = policy.head.mean_and_log_std(policy.features(obs))
    std = 0.7 * log_std.exp()
    expected_u = mean + std * torch.special.ndtri(uniforms.double()).float()
    torch.testing.assert_close(record, expected_u, rtol=0, atol=1e-6)
    torch.testing.assert_close(actions, torch.tanh(record).view(5, H, A))
    by_hand = gaussian_log_density(record, mean, std) - log1m_tanh_squared(record)
    torch.testing.assert_close(policy.log_prob(obs, record, 0.7), by_hand)
    assert policy.log_prob(obs, record, 0.7).shape == (5, H * A)
    # greedy is the mean's tanh, the T -> 0 limit of sampling
    _, greedy = policy.act(obs, deterministic=True)
    cold = policy.act(obs, temperature=1e-6, uniforms=uniforms)[1]
    torch.testing.assert_close(cold, greedy, rtol=0, atol=1e-5)


def test_a_flow_record_is_its_chain_and_scores_as_the_head_does():
    """The flow's record is the noisy chain ``x_0 .. x_K`` drawn from the row's uniforms; its
    one unit per decision is the chain's log-density, the head's own."""
    _, policy, _ = _policy_and_jobs("flow")
    env = tasks.make("reach", **OPTIONS)
    obs = obs_to_batch([env.reset(seed=s)[0] for s in range(5)])
    env.close()
    uniforms = torch.rand(5, policy.spec.noise_width, generator=torch.Generator().manual_seed(4))
    record, actions = policy.act(obs, temperature=0.8, uniforms=uniforms)
    steps = policy.head.steps
    assert record.shape == (5, (steps + 1) * H * A)
    normals = torch.special.ndtri(uniforms.double()).float()
    torch.testing.assert_close(record[:, :H * A], 0.8 * normals[:, :H * A])
    features = policy.features(obs)
    again = policy.head.sample(features, 0.8, noise=normals)
    torch.testing.assert_close(record, again.record)
    torch.testing.assert_close(actions, again.actions)
    unit = policy.log_prob(obs, record, 0.8)
    assert unit.shape == (5, 1)
    torch.testing.assert_close(unit[:, 0], again.log_prob)
    mask = policy.spec.executed_mask(torch.tensor([1, 2, 1, 2, 2]))
    assert mask.shape == (5, 1) and bool(mask.all())
    assert policy.spec.max_units(LIMIT) == math.ceil(LIMIT / K)


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "rloo", "critic", "reinforce", "vla_ppo"])
def test_every_group_algorithm_updates_every_head(head, algo):
    """One epoch, one minibatch: the policy's ratio is exactly 1 at the first (only) step, so
    nothing is clipped and the approximate KL is 0, and the head's weights move."""
    cfg, policy, jobs = _policy_and_jobs(head, groups=2, algo=algo)
    cfg.algo.num_iterations, cfg.algo.minibatch_size = 1, 8
    rollout = _rollout(cfg, policy, jobs)
    trainer = GroupTrainer(cfg, policy)
    trainer.max_tokens = policy.spec.max_units(LIMIT)
    before = [p.detach().clone() for p in policy.head.parameters()]
    rewards = np.array([1, 0, 0, 1, 0, 1, 1, 0], dtype=np.float32)
    metrics = trainer.update(rollout, rewards, trainer.advantages(rollout, rewards),
                             np.ones(2, dtype=bool))
    assert metrics["train/gradient_steps"] == 1.0
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["train/clip_fraction"] == 0.0
    assert metrics["train/approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["train/kl_to_reference"] == pytest.approx(0.0, abs=1e-7)
    assert math.isfinite(metrics["train/entropy"])
    moved = [not torch.equal(b, p) for b, p in zip(before, policy.head.parameters(), strict=True)]
    assert any(moved)


@pytest.mark.parametrize("head", HEADS)
def test_a_head_run_clones_trains_saves_and_evaluates(head, tmp_path, monkeypatch):
    """BC on chunks of demonstrations by the head's own loss, two iterations of GRPO, greedy
    evaluations; the checkpoint holds the head, and a reload acts as the run's policy did."""
    from harness.algos.group.checkpoints import policy_from_state, read_checkpoint

    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    config = harness_config.compose([*_fast(head), "algo.iterations=2",
                                     "algo.start_policy.bc.demos=4",
                                     "algo.start_policy.bc.epochs=10"])
    summary = trainers.train(config, tmp_path / "run")
    metrics = read_metrics(tmp_path / "run" / "metrics.csv")
    assert math.isfinite(metrics["bc/train_loss"][0][1])
    assert math.isfinite(metrics["bc/val_action_error"][0][1])
    assert "bc/val_accuracy" not in metrics  # no tokens to count: NaN, which is not logged
    assert all(math.isfinite(v) for _, v in metrics["train/entropy"])
    assert 0.0 <= summary["success_rate"] <= 1.0
    policy = policy_from_state(read_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt"))
    assert policy.spec.head == head and policy.config.head["name"] == head
    env = tasks.make("reach", **OPTIONS)
    obs = obs_to_batch([env.reset(seed=s)[0] for s in range(3)])
    env.close()
    _, greedy = policy.eval().act(obs, deterministic=True)
    assert greedy.shape == (3, H, A) and float(greedy.abs().max()) <= 1.0


def test_settings_a_head_cannot_take_are_refused_by_name():
    with pytest.raises(ConfigCompositionException, match=r"(?s)beta.*flow.*gaussian.*tokens"):
        harness_config.compose(_fast("beta"))
    with pytest.raises(ConfigError, match=r"policy.head \(flow\): steps=0"):
        harness_config.compose([*_fast("flow"), "policy.head.steps=0"])
    with pytest.raises(ConfigError, match="noise='loud'"):
        harness_config.compose([*_fast("flow"), "policy.head.noise=loud"])
    with pytest.raises(ConfigError, match="policy/head='gaussian' is read by the group"):
        harness_config.compose(["algo=ppo", "task=reach", "task.obs_mode=state", "policy=mlp",
                                "policy/head=gaussian"])
    with pytest.raises(ConfigCompositionException, match="policy/head"):  # its LM head decodes
        harness_config.compose(["algo=grpo", "task=reach", "task.obs_mode=pixels",
                                "policy=hf_vla", "policy/head=flow"])


def test_a_continuous_head_exports_greedy_actions_only():
    """No token logits: its ONNX graph gives greedy actions (``tests/test_export.py``)."""
    _, policy, _ = _policy_and_jobs("gaussian", groups=1)
    record = policy.export_record()
    assert record["outputs"] == ["actions"] and "num_bins" not in record
    assert record["greedy_rule"].startswith("actions = tanh(mean(f))")
