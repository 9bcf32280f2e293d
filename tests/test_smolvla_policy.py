"""``policy=smolvla``: SmolVLA's network (``tiny:smolvla``, random weights, offline) as a policy of
the group trainer, on real pixel reach environments. A sampled chain scores its own density,
greedy actions are SmolVLA's own sampler from zero noise, rollout modes agree, a run clones,
trains, saves and resumes to the uninterrupted run, and bad settings are refused by name before
the run folder exists. bfloat16 weights and gradient checkpointing keep the numbers that must
stay, and a fine-tuned LoRA run writes back as a LeRobot folder that acts as it did."""

from __future__ import annotations

import importlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException

import tasks
from harness import config as harness_config
from harness import trainers
from harness.algos.group.checkpoints import policy_from_state
from harness.algos.group.update import GroupTrainer
from harness.algos.rollout.pools import make_pool
from harness.algos.rollout.records import EngineSpec, Job
from harness.config.errors import ConfigError
from harness.policies import make, obs_to_batch
from harness.policies.heads.base import gaussian_log_density
from harness.policies.saving import policy_record
from harness.policies.smolvla import SmolVLAPolicyConfig
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
    policy = make(cfg.policy, env.observation_space)
    obs = obs_to_batch([env.reset(seed=s)[0] for s in range(3)])
    env.close()
    return cfg, policy, obs


def _chain_log_prob(policy, obs, record: torch.Tensor, temperature: float) -> torch.Tensor:
    """By hand: ``x_0 ~ N(0, T^2)`` and every step's Gaussian around ``x_k + dt * v(x_k, t_k)``,
    ``dt = -1 / K``, of standard deviation ``T * sigma_k``; ``(B,)``."""
    rows, steps = len(record), policy.steps
    chain = record.view(rows, steps + 1, policy.entries)
    cache, pads = policy.encode(obs)
    sigma = policy.sigma()
    expected = gaussian_log_density(chain[:, 0], torch.zeros(1),
                                    torch.tensor(temperature)).sum(-1)
    for k in range(steps):
        time = torch.full((rows,), 1.0 - k / steps)
        velocity = policy.smolvla.velocity(cache, pads, chain[:, k].view(rows, H, -1), time)
        mean = chain[:, k] - velocity.flatten(1) / steps
        expected = expected + gaussian_log_density(chain[:, k + 1], mean,
                                                   temperature * sigma[k]).sum(-1)
    return expected


def _group_update(cfg, policy) -> dict[str, float]:
    """One update of ``cfg.algo`` on two groups of two attempts at reach, rewards 1, 0, 0, 1."""
    env = tasks.make("reach", **OPTIONS)
    jobs = []
    for group in range(2):
        env.reset(seed=group, options={"difficulty": 0.1})
        jobs += [Job(env.snapshot(), group, 0.1)] * 2
    env.close()
    spec = EngineSpec("reach", OPTIONS, policy_record(policy), len(jobs))
    with make_pool(cfg.algo.rollout, 1, spec, preferred=policy.spec.rollout_mode) as pool:
        rollout = pool.run(policy, jobs, 1.0, seed=(0, 1))
    trainer = GroupTrainer(cfg, policy)
    trainer.max_tokens = policy.spec.max_units(9)
    rewards = np.array([1, 0, 0, 1], dtype=np.float32)
    return trainer.update(rollout, rewards, trainer.advantages(rollout, rewards),
                          np.ones(2, dtype=bool))


def test_a_sampled_chain_scores_its_own_density_and_greedy_is_smolvlas_sampler():
    _, policy, obs = _policy()
    uniforms = torch.rand(3, policy.spec.noise_width, generator=torch.Generator().manual_seed(1))
    record, actions = policy.act(obs, temperature=0.8, uniforms=uniforms)
    steps, entries = policy.steps, policy.entries
    assert record.shape == (3, (steps + 1) * entries) and actions.shape == (3, H, A)
    chain = record.view(3, steps + 1, entries)
    torch.testing.assert_close(policy.log_prob(obs, record, 0.8)[:, 0],
                               _chain_log_prob(policy, obs, record, 0.8))
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
    expert = policy.smolvla.model.action_out_proj.weight.detach().clone()
    noise = policy.noise_logit.detach().clone()
    metrics = _group_update(cfg, policy)
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
    spec = EngineSpec("reach", OPTIONS, policy_record(policy), len(jobs))
    runs = []
    for mode in ("per_worker", "batched"):
        settings = harness_config.compose([*FAST, f"algo.rollout.mode={mode}"]).algo.rollout
        with make_pool(settings, 1, spec, preferred=policy.spec.rollout_mode) as pool:
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
    from harness.algos.group.checkpoints import read_checkpoint

    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    extra = ["algo.start_policy.bc.demos=2", "algo.start_policy.bc.epochs=2"]
    straight = _run(tmp_path, "straight", *extra, "algo.iterations=3")
    assert math.isfinite(straight["bc/train_loss"][0][1])
    assert math.isfinite(straight["bc/val_action_error"][0][1])
    policy = policy_from_state(read_checkpoint(tmp_path / "straight" / "checkpoints"
                                               / "latest.pt"))
    assert policy.config.name == policy.spec.kind == "smolvla" and policy.spec.noise_width > 0
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
    # its action expert is a flow: the smolvla config has no action head to choose
    with pytest.raises(TypeError, match="head"):
        SmolVLAPolicyConfig(head={"name": "gaussian"})
    with pytest.raises(ConfigCompositionException, match="'head' not in 'SmolVLAPolicyConfig'"):
        harness_config.compose([*FAST, "+policy/head=gaussian"])
    with pytest.raises(ConfigError, match=r"policy.dtype='float16'; choose one of "
                                          r"\('float32', 'bfloat16'\)"):
        harness_config.compose([*FAST, "policy.dtype=float16"])


def test_an_export_of_smolvla_is_refused_by_name():
    from harness.export import export_onnx

    _, policy, _ = _policy()
    with pytest.raises(TypeError, match="cannot export policy=smolvla to ONNX"):
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
    before = {n: p.detach().clone() for n, p in policy.smolvla.named_parameters()}
    _group_update(cfg, policy)
    moved = {n for n, p in policy.smolvla.named_parameters() if not torch.equal(before[n], p)}
    assert any(".lora_B." in n for n in moved)
    assert all(policy.smolvla.get_parameter(n).requires_grad for n in moved)


def test_a_bfloat16_policy_samples_scores_trains_and_reloads():
    """``policy.dtype=bfloat16``: the backbone and the expert in bfloat16; the projections,
    noise scales, value head, chains and log-densities float32. A sampled chain scores its own
    density, an update moves the bfloat16 weights too, and a checkpoint round trip keeps it."""
    cfg, policy, obs = _policy("policy.dtype=bfloat16", "algo.num_iterations=1",
                               "algo.minibatch_size=4")
    network = policy.smolvla.model
    assert {p.dtype for p in network.vlm_with_expert.parameters()} == {torch.bfloat16}
    kept = [policy.noise_logit, *policy.value_head.parameters(), network.state_proj.weight,
            network.action_in_proj.weight, network.action_out_proj.weight]
    assert all(p.dtype == torch.float32 for p in kept)
    uniforms = torch.rand(3, policy.spec.noise_width, generator=torch.Generator().manual_seed(1))
    record, actions = policy.act(obs, uniforms=uniforms)
    assert record.dtype == actions.dtype == torch.float32
    log_prob = policy.log_prob(obs, record)[:, 0]
    assert log_prob.dtype == torch.float32 and torch.isfinite(log_prob).all()
    torch.testing.assert_close(log_prob, _chain_log_prob(policy, obs, record, 1.0))
    assert policy.value(obs).dtype == torch.float32
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    metrics = _group_update(cfg, policy)
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    moved = {n for n, p in policy.named_parameters() if not torch.equal(before[n], p)}
    assert "noise_logit" in moved and any(".lm_expert." in n for n in moved)
    assert any(".text_model." in n for n in moved)
    saved = {"policy_config": policy.config.to_saved(), "obs_shapes": policy.obs_shapes,
             "trainer": {"policy": policy.state_dict()}}
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    again = policy_from_state(torch.load(buffer, weights_only=True))
    assert again.config.dtype == "bfloat16"
    for name, tensor in policy.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    assert torch.equal(again.act(obs, deterministic=True)[1],
                       policy.act(obs, deterministic=True)[1])


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    """``policy.gradient_checkpointing=true`` recomputes every backbone layer (vision tower
    included) and every expert layer in the backward pass, and changes no number."""

    def loss_and_gradients(*overrides: str):
        _, policy, obs = _policy(*overrides)
        parts = policy.smolvla.model.vlm_with_expert
        layers = {"backbone": parts.backbone.text_model.layers[1].mlp,
                  "vision": parts.backbone.vision_model.encoder.layers[0].mlp,
                  "expert": parts.lm_expert.layers[1].mlp}
        calls = dict.fromkeys(layers, 0)
        for name, layer in layers.items():
            layer.register_forward_pre_hook(
                lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
        uniforms = torch.rand(3, policy.spec.noise_width,
                              generator=torch.Generator().manual_seed(1))
        record, _ = policy.act(obs, uniforms=uniforms)
        chunks = torch.rand(3, H, A, generator=torch.Generator().manual_seed(2)) * 2 - 1
        policy.train()
        calls.update(dict.fromkeys(layers, 0))
        loss = (policy.bc_loss(obs, chunks, generator=torch.Generator().manual_seed(3))
                - policy.log_prob(obs, record).mean() + policy.value(obs).mean())
        loss.backward()
        gradients = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
        return loss.detach(), gradients, calls

    loss, gradients, calls = loss_and_gradients()
    loss_ckpt, gradients_ckpt, calls_ckpt = loss_and_gradients("policy.gradient_checkpointing=true")
    torch.testing.assert_close(loss_ckpt, loss)
    assert gradients_ckpt.keys() == gradients.keys() and len(gradients) > 50
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradients_ckpt[name], gradient, msg=name)
    # each forward of these layers runs once more in the backward pass
    assert all(calls_ckpt[name] == 2 * calls[name] > 0 for name in calls), (calls, calls_ckpt)


# --- writing a fine-tuned policy back as a LeRobot folder (scripts/export_policy.py) ---------

HYDRA_QUIET = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
export_app = importlib.import_module("harness.apps.export_policy")


def export(tmp_path: Path, *args: str) -> int:
    return export_app.main([*args, f"hydra.run.dir={tmp_path / 'hydra'}", *HYDRA_QUIET])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    """A tiny smolvla run with LoRA adapters: BC on two demos, then one GRPO iteration."""
    folder = tmp_path_factory.mktemp("smolvla_lora")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HARNESS_DATA", str(folder / "data"))
        trainers.train(harness_config.compose([
            *FAST, "policy.lora_rank=4", "algo.start_policy.bc.demos=2",
            "algo.start_policy.bc.epochs=1",
            "algo.iterations=1", "eval.final_episodes=2"]), folder / "run")
    return folder / "run"


def test_a_fine_tuned_smolvla_writes_back_as_a_lerobot_folder(lora_run, tmp_path, capsys):
    """``format=lerobot``: LoRA merged into LeRobot's parameter names, the folder loads with
    ``strict=True``, and ``policy.model=<folder>`` acts greedily as the fine-tuned policy did,
    with its noise scales and value head."""
    from safetensors import safe_open

    from harness.policies.smolvla.model import SmolVLAModel
    from harness.policies.smolvla.out_folder import MARKER_FILE
    from harness.policies.smolvla.policy import HEADS_FILE

    fine_tuned, _, _ = export_app.load_checkpoint_policy(str(lora_run))
    adapters = [p for n, p in fine_tuned.named_parameters() if ".lora_B." in n]
    assert adapters and any(p.abs().max() > 0 for p in adapters)  # BC moved them: merging matters
    out = tmp_path / "smolvla_reach"
    assert export(tmp_path, f"checkpoint={lora_run}", "format=lerobot", f"out={out}") == 0
    assert "LoRA adapters merged" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["config.json", "model.safetensors", "vlm_config.json", HEADS_FILE, MARKER_FILE])
    with safe_open(str(out / "model.safetensors"), "pt") as file:
        names = list(file.keys())
    assert not [n for n in names if "lora_" in n or "base_layer" in n]
    assert all(n.startswith("model.") for n in names)
    SmolVLAModel.from_folder(out)  # strict=True: exactly LeRobot's names and shapes
    written = json.loads((out / "config.json").read_text())
    assert (written["type"], written["num_steps"], written["n_action_steps"]) == ("smolvla", 3, K)
    cfg = harness_config.compose([*FAST, f"policy.model={out}"])
    env = tasks.make("reach", **OPTIONS)
    reloaded = make(cfg.policy, env.observation_space)
    obs = obs_to_batch([env.reset(seed=s)[0] for s in range(4)])
    env.close()
    with torch.no_grad():
        torch.testing.assert_close(reloaded.act(obs, deterministic=True)[1],
                                   fine_tuned.act(obs, deterministic=True)[1])
    for name, tensor in fine_tuned.heads_state().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_lerobot_export_refuses_bad_inputs_by_name(lora_run, tmp_path, capsys):
    out = tmp_path / "smolvla_reach"
    assert export(tmp_path, f"checkpoint={lora_run}", "format=lerobot", f"out={out}") == 0
    capsys.readouterr()
    written = (out / "model.safetensors").stat().st_mtime_ns

    def refused(*args: str) -> str:
        assert export(tmp_path, *args) == 1
        return capsys.readouterr().err

    assert "exists; pass overwrite=true" in refused(f"checkpoint={lora_run}", "format=lerobot",
                                                    f"out={out}")
    assert (out / "model.safetensors").stat().st_mtime_ns == written
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "keep.txt").write_text("mine")
    assert "holds no config.json" in refused(f"checkpoint={lora_run}", "format=lerobot",
                                             f"out={notes}", "overwrite=true")
    assert (notes / "keep.txt").read_text() == "mine"
    assert "format='safetensors'; choose one of ('onnx', 'lerobot')" in refused(
        f"checkpoint={lora_run}", "format=safetensors", f"out={tmp_path / 'x'}")
    mlp_run = tmp_path / "mlp"
    trainers.train(harness_config.compose([
        "task=reach", "task.max_episode_steps=9", "policy=mlp", "policy.hidden=16", "algo=grpo",
        "algo.iterations=1", "algo.group_size=2", "algo.num_start_states=2",
        "algo.minibatch_size=4", "eval.every_steps=0", "eval.final_episodes=2", "logger=none"]),
        mlp_run)
    assert ("policy='mlp'; format=lerobot writes policies in LeRobot's layout only "
            "(policy=smolvla") in refused(
        f"checkpoint={mlp_run}", "format=lerobot", f"out={tmp_path / 'x'}")
    assert not (tmp_path / "x").exists()
    assert export(tmp_path, f"checkpoint={lora_run}", "format=lerobot", f"out={out}",
                  "overwrite=true") == 0
    with pytest.raises(ConfigError, match=r"do not fit policy.flow_steps=2 and policy.hidden=64: "
                                          r"noise_logit \(3, 16\) \(need \(2, 16\)\)"):
        harness_config.compose([*FAST, f"policy.model={out}", "policy.flow_steps=2"])

