"""``policy=hf_vla``: real ``transformers`` models (the named tiny builds), offline, no mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may come from a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import tasks
from harness import config as harness_config
from harness.config import ConfigError
from harness.policies import build_policy, make, obs_to_batch, tokens_to_actions
from harness.policies.hf_vla import HFVLAConfig, LoRAConfig
from harness.policies.hf_vla import models as hf_models
from harness.policies.hf_vla import tiny as hf_tiny
from harness.policies.hf_vla.policy import AdaptersOff, HFVLAPolicy, load_pretrained

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["tiny:paligemma", "tiny:idefics3"]
PIXELS = ["task=reach", "task.obs_mode=pixels", "task.image_size=32", "policy=hf_vla",
          "algo=grpo"]


@pytest.fixture(scope="module")
def env():
    env = tasks.make("reach", obs_mode="pixels", image_size=32)
    yield env
    env.close()


@pytest.fixture(scope="module")
def obs(env):
    return obs_to_batch([env.reset(seed=seed)[0] for seed in range(3)])


def policy_of(env, model: str, **options) -> HFVLAPolicy:
    options.setdefault("lora", None)  # every weight trains, unless a test asks for LoRA
    config = HFVLAConfig(model=model, num_bins=256, **options)
    return make(config, env.observation_space).eval()


@pytest.mark.parametrize("model", MODELS)
def test_named_models_build_offline_small_with_reserved_action_tokens(env, model):
    policy = policy_of(env, model)
    assert policy.vlm.config.model_type == model.split(":")[1]
    assert sum(p.numel() for p in policy.parameters()) < 1_000_000
    tokens = policy.processor.tokenizer.convert_ids_to_tokens(policy.action_ids.tolist())
    assert tokens == [f"<act_{k}>" for k in range(256)]  # bin k is <act_k>
    assert policy.prompt_text("reach the green target") == (
        "In: What action should the robot take to reach the green target?\nOut:")
    again = policy_of(env, model)  # a rollout worker's copy, rebuilt from the spec
    for (name, a), (_, b) in zip(policy.state_dict().items(), again.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("model", MODELS)
def test_act_samples_action_tokens_by_the_callers_uniforms(env, obs, model):
    policy = policy_of(env, model)
    uniforms = torch.rand(3, 4, generator=torch.Generator().manual_seed(0))
    tokens, actions = policy.act(obs, temperature=1.0, uniforms=uniforms)
    assert tokens.shape == (3, 4) and tokens.dtype == torch.int64
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 256
    assert torch.equal(actions[:, 0], tokens_to_actions(tokens, 256))  # one step per chunk
    assert torch.equal(policy.act(obs, uniforms=uniforms)[0], tokens)
    alone = policy.act({k: v[1:2] for k, v in obs.items()}, uniforms=uniforms[1:2])[0]
    assert torch.equal(alone, tokens[1:2])  # a row's draw depends on its own numbers only
    greedy = policy.act(obs, deterministic=True)[0]
    assert torch.equal(greedy, policy.logits(obs).argmax(dim=-1))
    with pytest.raises(ValueError, match="uniforms"):
        policy.act(obs, uniforms=torch.rand(3, 5))


@pytest.mark.parametrize("model", MODELS)
def test_teacher_forced_log_probs_equal_those_of_decoding(env, obs, model):
    policy = policy_of(env, model)
    tokens, _ = policy.act(obs, uniforms=torch.full((3, 4), 0.3))
    _, step_logits = policy._decode(obs, lambda logits, dim: tokens[:, dim])
    decoded = torch.log_softmax(step_logits / 0.7, dim=-1).gather(-1, tokens[..., None])[..., 0]
    assert torch.allclose(policy.log_prob(obs, tokens, temperature=0.7), decoded, atol=1e-5)

    # the prefix is what the model's own forward builds from the processor's inputs
    frame = obs["pixels"][0].numpy()
    text = policy.processor.image_token + policy.prompt_text("reach the green target")
    inputs = policy.processor(text=text, images=frame, return_tensors="pt")
    ids = torch.cat([inputs["input_ids"], policy.action_ids[tokens[:1, :-1]]], dim=1)
    extra = {}
    if "token_type_ids" in inputs:  # PaliGemma: the prompt is a bidirectional prefix
        extra["token_type_ids"] = torch.cat([inputs["token_type_ids"],
                                             torch.ones(1, 3, dtype=torch.long)], dim=1)
    bare = policy_of(env, model, proprio="none")
    with torch.no_grad():
        own = bare.vlm(input_ids=ids, pixel_values=inputs["pixel_values"], **extra).logits
        ours = bare.logits({k: v[:1] for k, v in obs.items()}, tokens[:1])
    assert torch.allclose(own[:, -4:, bare.action_ids], ours, atol=1e-5)


def test_lora_reference_is_the_model_with_adapters_off(env, obs):
    from harness.algos.group.update import GroupTrainer

    cfg = harness_config.compose([*PIXELS, "policy.model=tiny:idefics3", "algo.beta=0.1"])
    policy = make(cfg.policy, env.observation_space)
    tokens = torch.randint(0, 256, (3, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # adapters trained before (by BC) are merged into the start policy
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)
        start = policy.log_prob(obs, tokens)
    trainer = GroupTrainer(cfg, policy)
    reference = trainer.reference
    assert isinstance(reference, AdaptersOff) and reference.policy is policy  # no second copy
    assert not isinstance(reference, torch.nn.Module)
    assert all(("lora_" in name) or name.startswith("value_head.")
               for name, p in policy.named_parameters() if p.requires_grad)
    with torch.no_grad():
        assert torch.allclose(policy.log_prob(obs, tokens), start, atol=1e-5)
        assert torch.equal(reference.log_prob(obs, tokens), policy.log_prob(obs, tokens))

    loss = -policy.log_prob(obs, tokens).mean()
    trainer.optimizer.zero_grad()
    loss.backward()
    trainer.optimizer.step()
    with torch.no_grad():
        after, ref_after = policy.log_prob(obs, tokens), reference.log_prob(obs, tokens)
    assert torch.allclose(ref_after, start, atol=1e-5)  # the reference did not move
    kl = (torch.exp(ref_after - after) - (ref_after - after) - 1).mean()  # k3
    assert float(kl) > 0 and float(after.mean()) > float(start.mean())

    rebuilt = build_policy(policy.config, policy.obs_shapes)  # evaluate.py reference=true
    rebuilt.load_state_dict(reference.state_dict())
    with torch.no_grad():
        assert torch.allclose(rebuilt.log_prob(obs, tokens), ref_after, atol=1e-6)


@pytest.mark.parametrize(("model", "lora"), [("tiny:paligemma", 4), ("tiny:idefics3", 0)])
def test_save_pretrained_round_trip_gives_identical_log_probs(tmp_path, env, obs, model, lora):
    policy = policy_of(env, model, lora=LoRAConfig(rank=lora, target_modules=["all-linear"])
                       if lora else None)
    with torch.no_grad():
        for parameter in policy.parameters():  # trained weights, adapters included
            parameter.add_(0.01 * torch.randn_like(parameter))
    tokens = torch.randint(0, 256, (3, 4), generator=torch.Generator().manual_seed(2))
    folder = tmp_path / "latest_pretrained"
    policy.save_pretrained(folder)
    policy.save_pretrained(folder)  # replacing a folder leaves no trace of the old one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest_pretrained"]
    assert (folder / "model.safetensors").is_file() and (folder / "hf_vla.json").is_file()
    assert (folder / "adapter").is_dir() == bool(lora)
    spec = json.loads((folder / "hf_vla.json").read_text())
    assert spec["action_token_ids"] == policy.action_ids.tolist()
    loaded = load_pretrained(folder).eval()
    with torch.no_grad():
        assert torch.equal(loaded.log_prob(obs, tokens), policy.log_prob(obs, tokens))
    assert loaded.config.model == str(folder) and loaded.lora == bool(lora)
    with pytest.raises(ConfigError, match="saved with num_bins=256; set policy.num_bins"):
        harness_config.compose([*PIXELS, f"policy.model={folder}", "policy.num_bins=32"])


def test_bfloat16_and_gradient_checkpointing_run(env, obs):
    policy = policy_of(env, "tiny:paligemma", dtype="bfloat16")
    tokens, _ = policy.act(obs)
    assert torch.isfinite(policy.log_prob(obs, tokens)).all()
    plain = policy_of(env, "tiny:idefics3").train()
    checkpointed = policy_of(env, "tiny:idefics3", gradient_checkpointing=True).train()
    for which in (plain, checkpointed):
        which.log_prob(obs, tokens).sum().backward()
    assert torch.allclose(checkpointed.entropy(obs), plain.entropy(obs), atol=1e-5)
    grads = [(a.grad, b.grad) for a, b in zip(plain.parameters(), checkpointed.parameters(),
                                              strict=True) if a.grad is not None]
    assert grads and all(torch.allclose(a, b, atol=1e-5) for a, b in grads)


def test_cached_image_features_give_the_same_log_probs(env, obs):
    policy = policy_of(env, "tiny:idefics3")
    tokens = torch.randint(0, 256, (3, 4), generator=torch.Generator().manual_seed(3))
    cached = {"image_features": policy.encode_image(obs["pixels"]),
              **{k: v for k, v in obs.items() if k != "pixels"}}
    with torch.no_grad():
        assert torch.equal(policy.log_prob(cached, tokens), policy.log_prob(obs, tokens))


@pytest.mark.parametrize(
    ("override", "words"),
    [("policy.model=tiny:gpt2", ["tiny:gpt2", "tiny:idefics3"]),
     ("policy.model=NOWHERE", ["NOWHERE", "neither a local directory"]),
     ("policy.dtype=float16", ["float16", "bfloat16"]),
     ("policy.proprio=text", ["text", "projection"])],
)
def test_bad_options_fail_at_composition_naming_the_value(override, words):
    with pytest.raises(ConfigError) as error:
        harness_config.compose([*PIXELS, override])
    for word in words:
        assert word in str(error.value)


def test_bad_model_folders_fail_before_training(tmp_path, env):
    (tmp_path / "bare").mkdir()
    policy_of(env, "tiny:idefics3").vlm.save_pretrained(tmp_path / "bare")  # no processor
    with pytest.raises(ConfigError, match="holds no processor"):
        harness_config.compose([*PIXELS, f"policy.model={tmp_path / 'bare'}"])
    narrow = tmp_path / "narrow"  # a vocabulary built for 8 bins cannot hold 256
    model, processor = hf_tiny.build_named("tiny:idefics3", num_bins=8)
    model.save_pretrained(narrow)
    processor.save_pretrained(narrow)
    with pytest.raises(ConfigError, match=r"too few to hold policy.num_bins=256"):
        harness_config.compose([*PIXELS, f"policy.model={narrow}"])
    cfg = harness_config.compose([*PIXELS, f"policy.model={narrow}", "policy.num_bins=8"])
    assert make(cfg.policy, env.observation_space).action_ids.numel() == 8


def test_bfloat16_is_refused_on_a_device_without_it():
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        pytest.skip("this machine's CUDA device has bfloat16")
    with pytest.raises(ValueError, match="policy.dtype='bfloat16', but device='cuda'"):
        hf_models.check_dtype("bfloat16", "cuda")
    assert hf_models.check_dtype("bfloat16", "cpu") == torch.bfloat16


def test_policies_import_without_the_vla_extra_and_name_it_when_used():
    code = ("import sys; import harness.policies; "
            "assert 'transformers' not in sys.modules and 'peft' not in sys.modules; "
            "sys.modules['peft'] = None\n"
            "from harness.policies.hf_vla import models as hf_models\n"
            "try:\n    hf_models.require_transformers()\n"
            "except ImportError as error:\n    print(error)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "pip install -e .[vla]" in out


def test_lora_run_resumes_with_its_adapters_and_reference(tmp_path, monkeypatch):
    """A LoRA run killed after one iteration continues from its checkpoint: the fine-tuned
    adapters come back, and the reference is again the model with them switched off."""
    from harness import trainers
    from harness.algos.group.checkpoints import policy_from_state, read_checkpoint

    monkeypatch.chdir(tmp_path)

    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    options = [*PIXELS, "policy.model=tiny:paligemma", "task.max_episode_steps=4",
               "algo=critic", "algo.zero_signal=keep", "algo.num_start_states=2",
               "algo.group_size=2", "algo.minibatch_size=4", "eval.every_steps=0",
               "eval.final_episodes=1", "logger.videos=false", "logger.tensorboard=false",
               "logger.progress_bar=false"]
    trainers.train(harness_config.compose([*options, "algo.iterations=1"]), tmp_path / "run")
    first = read_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt")["trainer"]
    moved = [k for k, v in first["policy"].items() if "lora_B" in k and v.abs().sum() > 0]
    assert moved and all(first["reference"][k].abs().sum() == 0 for k in moved)
    summary = trainers.train(harness_config.compose(
        [*options, "algo.iterations=2", "resume=true"]), tmp_path / "run")
    assert summary["iterations"] == 2
    state = read_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt")
    tuned, start = (policy_from_state(state, which).eval()
                    for which in ("policy", "reference"))
    obs = obs_to_batch(tasks.make("reach", obs_mode="pixels", image_size=32).reset(seed=0)[0])
    tokens = torch.tensor([[0, 50, 100, 200]])
    with torch.no_grad():
        assert not torch.equal(tuned.log_prob(obs, tokens), start.log_prob(obs, tokens))


def test_tiny_pipeline_demos_bc_grpo_evaluation(tmp_path, monkeypatch, capsys):
    """``scripts/train.py``: demos -> BC -> 2 GRPO iterations -> final evaluation, then
    ``scripts/evaluate.py checkpoint=<run dir>`` loads the run. Both apps' ``main`` run in this
    process, as the scripts call them (tests/test_cli.py runs the scripts themselves)."""
    from harness.apps import evaluate, train

    # Hydra's logging set-up would close pytest's handlers (and its captured output).
    quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.chdir(tmp_path)  # the demo cache lands here
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    status = train.main([
        *PIXELS, "policy.model=tiny:idefics3",
        # difficulty 0.2: targets 8 cm away, which the expert reaches within 6 steps
        "task.max_episode_steps=6", "task.difficulty=0.2", "algo.start_policy.bc.demos=2",
        "algo.start_policy.bc.epochs=2",
        "algo.num_start_states=2", "algo.group_size=2", "algo.minibatch_size=4",
        "algo.iterations=2", "eval.every_steps=0", "eval.final_episodes=2",
        "logger.videos=false", "logger.tensorboard=false", "logger.progress_bar=false",
        "hydra.run.dir=run", "torch_threads=1", *quiet])
    assert status == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"] == 2 and "improvement_p_value" in summary
    assert (tmp_path / "run" / "checkpoints" / "best_pretrained" / "hf_vla.json").is_file()
    capsys.readouterr()
    status = evaluate.main(["checkpoint=run", "episodes=2", *quiet])
    printed, errors = capsys.readouterr()
    assert status == 0, errors[-3000:]
    assert "success" in printed
    loaded = load_pretrained(tmp_path / "run" / "checkpoints" / "best_pretrained")
    assert loaded.config.num_bins == 256
