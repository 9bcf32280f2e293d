"""The CUDA paths: policies on a GPU give the CPU's numbers, bfloat16 trains LoRA adapters, and
the group trainer and SB3 run end to end with ``device=cuda``. Real models, real pixels.

The CUDA tests are marked ``gpu`` and left out of the default run (``pyproject.toml``); on a
machine with a CUDA device run ``python -m pytest -m gpu tests/test_gpu.py`` (docs/vla.md says
when it last ran). The end-to-end set-ups also run with ``device=cpu`` in the default run, so
that a change elsewhere (a task's difficulty, a default) which breaks them shows on a machine
without a GPU too.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import tasks
from harness import config as harness_config
from harness import trainers
from harness.policies import make, obs_to_batch
from harness.policies.hf_vla import HFVLAConfig, LoRAConfig

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = [pytest.mark.gpu, needs_cuda]
ON_BOTH = [pytest.param("cpu"), pytest.param("cuda", marks=CUDA)]

MODELS = ["tiny:paligemma", "tiny:idefics3"]
QUIET = ["eval.every_steps=0", "eval.final_episodes=2", "logger.videos=false",
         "logger.tensorboard=false", "logger.progress_bar=false", "torch_threads=1"]


@pytest.fixture(autouse=True)
def exact_float32():
    """TF32 matrix products would put the GPU ~1e-3 away from the CPU; compare true float32."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def env():
    env = tasks.make("reach", obs_mode="pixels", image_size=32)
    yield env
    env.close()


@pytest.fixture(scope="module")
def obs(env):
    return obs_to_batch([env.reset(seed=seed)[0] for seed in range(4)])


def on(batch: dict, device: str) -> dict:
    return {key: value.to(device) for key, value in batch.items()}


def hf_policy(env, model: str, **options):
    options.setdefault("lora", None)  # every weight trains, unless a test asks for LoRA
    config = HFVLAConfig(model=model, num_bins=256, **options)
    return make(config, env.observation_space).eval()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("model", MODELS)
def test_hf_vla_on_cuda_gives_the_cpu_log_probs_and_actions(env, obs, model):
    cpu = hf_policy(env, model)
    gpu = copy.deepcopy(cpu).to("cuda")
    tokens = torch.randint(0, 256, (4, 4), generator=torch.Generator().manual_seed(0))
    uniforms = torch.rand(4, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = cpu.log_prob(obs, tokens)
        got = gpu.log_prob(on(obs, "cuda"), tokens.cuda())
        assert got.device.type == "cuda"
        assert torch.allclose(got.cpu(), expected, atol=1e-4), (got.cpu() - expected).abs().max()
        greedy_cpu = cpu.act(obs, deterministic=True)[0]
        greedy_gpu = gpu.act(on(obs, "cuda"), deterministic=True)[0]
        assert torch.equal(greedy_gpu.cpu(), greedy_cpu)
        # the callers' uniforms (made on the CPU, as the rollout workers make them) pick the
        # same tokens by the inverse CDF on either device
        assert torch.equal(gpu.act(on(obs, "cuda"), uniforms=uniforms)[0].cpu(),
                           cpu.act(obs, uniforms=uniforms)[0])


@pytest.mark.gpu
@needs_cuda
def test_hf_vla_bfloat16_on_cuda_trains_the_adapters_and_keeps_the_reference(env, obs):
    full = hf_policy(env, "tiny:paligemma", lora=LoRAConfig(rank=8)).to("cuda")
    half = hf_policy(env, "tiny:paligemma", lora=LoRAConfig(rank=8), dtype="bfloat16").to("cuda")
    assert next(half.vlm.parameters()).dtype == torch.bfloat16
    batch = on(obs, "cuda")
    tokens = torch.randint(0, 256, (4, 4), generator=torch.Generator().manual_seed(2)).cuda()
    with torch.no_grad():
        exact, rounded = full.log_prob(batch, tokens), half.log_prob(batch, tokens)
    assert torch.isfinite(rounded).all()
    assert float((rounded.float() - exact).abs().mean()) < 0.05  # bfloat16's ~3 digits

    reference = half.frozen_reference()
    with torch.no_grad():
        start = reference.log_prob(batch, tokens)
    trainable = [p for p in half.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        (-half.log_prob(batch, tokens).mean()).backward()
        grads = [p.grad for p in trainable if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
        optimizer.step()
    with torch.no_grad():
        after = half.log_prob(batch, tokens)
        assert float(after.float().mean()) > float(start.float().mean())
        assert torch.equal(reference.log_prob(batch, tokens), start)  # adapters off: unmoved


@pytest.mark.parametrize(("device", "mode", "dtype"), [
    ("cpu", "batched", "float32"),
    pytest.param("cuda", "batched", "float32", marks=CUDA),
    pytest.param("cuda", "per_worker", "float32", marks=CUDA),
    pytest.param("cuda", "batched", "bfloat16", marks=CUDA)])
def test_group_trainer_runs_hf_vla(tmp_path, monkeypatch, device, mode, dtype):
    """Demos -> BC -> 2 GRPO iterations -> evaluation with the learner on ``device``; batched
    mode plays every attempt with that one policy, per-worker mode with CPU copies in 2 workers."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    cfg = harness_config.compose([
        # difficulty 0.2: targets 8 cm away, which the expert reaches within 6 steps
        "task=reach", "task.obs_mode=pixels", "task.image_size=32", "task.max_episode_steps=6",
        "task.difficulty=0.2", "policy=hf_vla", "policy.model=tiny:paligemma",
        f"policy.dtype={dtype}", "algo=grpo", f"device={device}", f"algo.rollout.mode={mode}",
        "algo.workers=2", "algo.start_policy.bc.demos=2", "algo.start_policy.bc.epochs=2",
        "algo.num_start_states=2",
        "algo.group_size=4", "algo.minibatch_size=8", "algo.iterations=2", *QUIET])
    summary = trainers.train(cfg, tmp_path / "run")
    assert summary["iterations"] == 2 and summary["device"] == device
    assert math.isfinite(summary["success_rate"])
    from harness.algos.group.checkpoints import read_checkpoint

    state = read_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt")
    assert all(v.device.type == "cpu" for v in state["trainer"]["policy"].values())


@pytest.mark.parametrize("device", ON_BOTH)
@pytest.mark.parametrize("policy", ["tiny_vla", "mlp"])
def test_group_trainer_runs_the_small_policies(tmp_path, monkeypatch, policy, device):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    obs_mode = "pixels" if policy == "tiny_vla" else "state"
    cfg = harness_config.compose([
        "task=reach", f"task.obs_mode={obs_mode}", "task.image_size=32",
        "task.max_episode_steps=10", f"policy={policy}", "algo=grpo", f"device={device}",
        "algo.start_policy.bc.demos=2", "algo.start_policy.bc.epochs=2", "algo.num_start_states=2",
        "algo.group_size=4",
        "algo.minibatch_size=8", "algo.iterations=2", *QUIET])
    summary = trainers.train(cfg, tmp_path / "run")
    assert summary["iterations"] == 2 and summary["device"] == device


@pytest.mark.parametrize("device", ON_BOTH)
def test_sb3_ppo_runs(tmp_path, monkeypatch, device):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    cfg = harness_config.compose([
        "task=reach", "task.obs_mode=state", "task.max_episode_steps=20", "policy=mlp",
        "algo=ppo", f"device={device}", "total_timesteps=512", "algo.n_steps=128", *QUIET])
    summary = trainers.train(cfg, tmp_path / "run")
    assert summary["env_steps"] >= 512 and math.isfinite(summary["success_rate"])
