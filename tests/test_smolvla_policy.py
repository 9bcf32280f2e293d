"""``policy=smolvla``: SmolVLA's network (``tiny:smolvla``, random weights, offline) as a policy of
the group trainer, on real pixel reach environments. A sampled chain scores its own density,
greedy actions are SmolVLA's own sampler from zero noise, rollout modes agree, a run clones,
trains, saves and resumes to the uninterrupted run, and bad settings are refused by name before
the run folder exists."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tasks
from harness import config as harness_config
from harness import trainers
from harness.algos.group_update import GroupTrainer
from harness.algos.pools import make_pool
from harness.algos.records import EngineSpec, Job
from harness.config.errors import ConfigError
from harness.policies import TokenPolicyConfig, make, obs_to_batch
from harness.policies.head_base import gaussian_log_density
from harness_common.files import read_metrics

torch.set_num_threads(1)

H, K, A = 4, 2, 4  # chunk_size, execute_steps, action_dim
OPTIONS = {"obs_mode": "pixels", "image_size": 32, "max_episode_steps": 9}
FAST = [
    "task=reach", "task.obs_mode=pixels", "task.image_size=32", "task.max_episode_steps=9",
    "task.difficulty=0.1", "policy=smolvla", f"policy.chunk_size={H}",
    f"policy.execute_steps={K}", "policy.flow_steps=3", "algo=grpo", "algo.group_size=2",
    "algo.num_start_states=2", "algo.learning_rate=1e-3", "algo.minibatch_size=2",
    "eval.every_steps=0", "eval.final_episodes=4", "eval.episodes=2", "logger=none",
]
OPERATIONAL = ("time/", "rollout/worker_restarts")


def _policy(*overrides: str):
    cfg = harness_config.compose([*FAST, *overrides])
    env = tasks.make("reach", **OPTIONS)
    policy = make(cfg.policy.token_policy_config(), env.observation_space)
    obs = obs_to_batch([env.reset(seed=s)[0] for s in range(3)])
    env.close()
    return cfg, policy, obs


def test_a_sampled_chain_scores_its_own_density_and_greedy_is_smolvlas_sampler():
    _, policy, obs = _policy()
    uniforms = torch.rand(3, policy.noise_width, generator=torch.Generator().manual_seed(1))
    record, actions = policy.act(obs, temperature=0.8, uniforms=uniforms)
    steps, entries = policy.steps, policy.entries
    assert record.shape == (3, (steps + 1) * entries) and actions.shape == (3, H, A)
    # by hand: every step's Gaussian around x_k + dt * v(x_k, t_k), dt = -1 / K
    chain = record.view(3, steps + 1, entries)
    cache, pads = policy.encode(obs)
    sigma = policy.sigma()
    expected = gaussian_log_density(chain[:, 0], torch.zeros(1), torch.tensor(0.8)).sum(-1)
    for k in range(steps):
        time = torch.full((3,), 1.0 - k / steps)
        velocity = policy.smolvla.velocity(cache, pads, chain[:, k].view(3, H, -1), time)
        mean = chain[:, k] - velocity.flatten(1) / steps
        expected += gaussian_log_density(chain[:, k + 1], mean, 0.8 * sigma[k]).sum(-1)
    torch.testing.assert_close(policy.log_prob(obs, record, 0.8)[:, 0], expected)
    torch.testing.assert_close(actions, chain[:, -1].view(3, H, -1)[:, :, :A].clamp(-1, 1))
    # greedy: SmolVLA's own Euler sampler from zero noise, K steps
    _, greedy = policy.act(obs, deterministic=True)
    images, tokens, masks, state = policy.model_inputs(obs)
    own = policy.smolvla.sample_actions(images, tokens, masks, state,
                                        noise=torch.zeros(3, H, A), num_steps=steps)
    torch.testing.assert_close(greedy, own[:, :, :A].clamp(-1, 1))
    cold = policy.act(obs, temperature=1e-6, uniforms=uniforms)[1]
    torch.testing.assert_close(cold, greedy, rtol=0, atol=1e-4)
    assert policy.entropy(obs, 0.5).shape == (3, 1)
    with torch.no_grad():
        assert float(policy.entropy(obs, 0.5)[0, 0]) < float(policy.entropy(obs, 1.0)[0, 0])


@pytest.mark.parametrize("algo", ["grpo", "vla_ppo"])
def test_an_update_starts_at_ratio_one_and_moves_the_expert_and_the_noise(algo):
    cfg, policy, _ = _policy(f"algo={algo}")
    cfg.algo.num_iterations, cfg.algo.minibatch_size = 1, 4
    env = tasks.make("reach", **OPTIONS)
    jobs = []
    for group in range(2):
        env.reset(seed=group, options={"difficulty": 0.1})
        jobs += [Job(env.snapshot(), group, 0.1)] * 2
    env.close()
    spec = EngineSpec("reach", OPTIONS, policy.config, policy.obs_shapes, len(jobs))
    with make_pool(cfg.algo.rollout, 1, spec) as pool:
        rollout = pool.run(policy, jobs, 1.0, seed=(0, 1))
    trainer = GroupTrainer(cfg, policy)
    trainer.max_tokens = policy.max_units(9)
    expert = policy.smolvla.model.action_out_proj.weight.detach().clone()
    noise = policy.noise_logit.detach().clone()
    rewards = np.array([1, 0, 0, 1], dtype=np.float32)
    metrics = trainer.update(rollout, rewards, trainer.advantages(rollout, rewards),
                             np.ones(2, dtype=bool))
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["train/clip_fraction"] == 0.0
    assert not torch.equal(expert, policy.smolvla.model.action_out_proj.weight)
    assert not torch.equal(noise, policy.noise_logit)


def test_both_rollout_modes_play_the_same_decisions():
    cfg, policy, _ = _policy()
    env = tasks.make("reach", **OPTIONS)
    env.reset(seed=0, options={"difficulty": 0.1})
    jobs = [Job(env.snapshot(), 0, 0.1)] * 4
    env.close()
    spec = EngineSpec("reach", OPTIONS, policy.config, policy.obs_shapes, len(jobs))
    runs = []
    for mode in ("per_worker", "batched"):
        settings = harness_config.compose([*FAST, f"algo.rollout.mode={mode}"]).algo.rollout
        with make_pool(settings, 1, spec) as pool:
            runs.append(pool.run(policy, jobs, 1.0, seed=(0, 1)))
    for name in ("decisions", "executed", "lengths", "success"):
        assert np.array_equal(getattr(runs[0], name), getattr(runs[1], name)), name


def _run(tmp_path, name: str, *overrides: str) -> dict[str, list]:
    summary = trainers.train(harness_config.compose([*FAST, *overrides]), tmp_path / name)
    metrics = read_metrics(tmp_path / name / "metrics.csv")
    learned = {k: v for k, v in metrics.items()
               if not k.startswith(OPERATIONAL) and not k.endswith("seconds")}
    learned["final"] = [(0, summary["success_rate"]), (0, summary["env_steps"])]
    return learned


def test_a_smolvla_run_clones_trains_saves_and_resumes(tmp_path, monkeypatch):
    """Demos -> BC by SmolVLA's flow-matching loss -> GRPO -> greedy evaluation; the
    checkpoint reloads as a SmolVLA policy, and two iterations plus a resume give the run of
    three."""
    from harness.algos.group_checkpoints import policy_from_state, read_checkpoint

    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    extra = ["algo.bc_demos=2", "algo.bc_epochs=2"]
    straight = _run(tmp_path, "straight", *extra, "algo.iterations=3")
    assert math.isfinite(straight["bc/train_loss"][0][1])
    assert math.isfinite(straight["bc/val_action_error"][0][1])
    policy = policy_from_state(read_checkpoint(tmp_path / "straight" / "checkpoints"
                                               / "latest.pt"))
    assert policy.config.kind == "smolvla" and policy.noise_width > 0
    _run(tmp_path, "resumed", *extra, "algo.iterations=2")
    assert _run(tmp_path, "resumed", *extra, "algo.iterations=3", "resume=true") == straight


def test_bad_smolvla_settings_are_refused_by_name(tmp_path):
    (tmp_path / "not_a_checkpoint").mkdir()
    with pytest.raises(ConfigError, match="policy.model=.*not_a_checkpoint"):
        harness_config.compose([*FAST, f"policy.model={tmp_path / 'not_a_checkpoint'}"])
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="execute_steps=5 with chunk_size=4"):
        harness_config.compose([*FAST, "policy.execute_steps=5"])
    with pytest.raises(ConfigError, match="flow_steps=0"):
        harness_config.compose([*FAST, "policy.flow_steps=0"])
    with pytest.raises(ConfigError, match="policy='smolvla' reads 'pixels'"):
        harness_config.compose([*FAST, "task.obs_mode=state"])
    with pytest.raises(ValueError, match="kind='smolvla', whose action expert is a flow"):
        TokenPolicyConfig(kind="smolvla", action_head="gaussian")


def test_an_export_of_smolvla_is_refused_by_name():
    from harness.export import export_onnx

    _, policy, _ = _policy()
    with pytest.raises(ValueError, match="action_head='flow': ONNX export covers token"):
        export_onnx(policy, {"task": "reach", "task_options": OPTIONS})


def test_lora_trains_the_adapters_and_the_small_projections_only():
    """With ``policy.lora_rank``: adapters start at B = 0 (the same actions as without them), the
    backbone's and the expert's other weights are frozen, and an update moves the adapters."""
    _, plain, obs = _policy()
    cfg, policy, _ = _policy("policy.lora_rank=4", "algo.num_iterations=1",
                             "algo.minibatch_size=4")
    torch.testing.assert_close(policy.act(obs, deterministic=True)[1],
                               plain.act(obs, deterministic=True)[1])
    trainable = [n for n, p in policy.smolvla.named_parameters() if p.requires_grad]
    assert any(".lora_A." in n for n in trainable)
    assert all(".lora_" in n or "proj" in n or "action_time_mlp" in n for n in trainable)
    embeddings = [p for n, p in policy.smolvla.named_parameters() if "embed_tokens" in n]
    assert embeddings and not any(p.requires_grad for p in embeddings)
    frozen = sum(p.numel() for p in policy.smolvla.parameters() if not p.requires_grad)
    assert frozen > sum(p.numel() for p in policy.smolvla.parameters() if p.requires_grad)
    env = tasks.make("reach", **OPTIONS)
    env.reset(seed=0, options={"difficulty": 0.1})
    jobs = [Job(env.snapshot(), 0, 0.1)] * 2 + [Job(env.snapshot(), 1, 0.1)] * 2
    env.close()
    spec = EngineSpec("reach", OPTIONS, policy.config, policy.obs_shapes, len(jobs))
    with make_pool(cfg.algo.rollout, 1, spec) as pool:
        rollout = pool.run(policy, jobs, 1.0, seed=(0, 1))
    trainer = GroupTrainer(cfg, policy)
    trainer.max_tokens = policy.max_units(9)
    before = {n: p.detach().clone() for n, p in policy.smolvla.named_parameters()}
    rewards = np.array([1, 0, 0, 1], dtype=np.float32)
    trainer.update(rollout, rewards, trainer.advantages(rollout, rewards), np.ones(2, bool))
    moved = {n for n, p in policy.smolvla.named_parameters() if not torch.equal(before[n], p)}
    assert any(".lora_B." in n for n in moved)
    assert all(policy.smolvla.get_parameter(n).requires_grad for n in moved)
