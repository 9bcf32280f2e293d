"""Every size of the policy configs is bounded, and so are the products of sizes that build one
large layer or record (issue 67): a value past its bound is refused by ``compose`` with the key
and the value in the message, in under a CPU second and before anything is built, so no run
folder is made, whether through the library or the training app.

The trainer is replaced by one that fails the test: a size these tests expect refused but that
is accepted must not go on to allocate the gigabytes it asks for."""

from __future__ import annotations

import time

import pytest

from harness import config as harness_config
from harness import trainers
from harness.apps import train as train_app
from harness.config.errors import ConfigError

HUGE = 1_000_000_000
MLP = ("task=reach", "algo=grpo", "policy=mlp", "logger=none")
FLOW = (*MLP, "policy/head=flow")
TINY_VLA = ("task=reach", "task.obs_mode=pixels", "algo=grpo", "policy=tiny_vla", "logger=none")
AVG_POOL = (*TINY_VLA, "policy.image_features=avg_pool")
SMOLVLA = ("task=reach", "task.obs_mode=pixels", "algo=grpo", "policy=smolvla", "logger=none")
HF_VLA = ("task=reach", "task.obs_mode=pixels", "algo=grpo", "policy=hf_vla", "logger=none")

# (overrides, what the refusal says: the key and the value, or the product and its bound)
REFUSED = [
    ((*MLP, f"policy.chunk_size={HUGE}"), f"policy.chunk_size={HUGE}; need an int in [1, 256]"),
    ((*MLP, "policy.chunk_size=0"), "policy.chunk_size=0; need an int in [1, 256]"),
    ((*MLP, "policy.chunk_size=4", f"policy.execute_steps={HUGE}"),
     f"policy.execute_steps={HUGE} with chunk_size=4"),
    ((*MLP, f"policy.action_dim={HUGE}"), f"policy.action_dim={HUGE}; need an int in [1, 64]"),
    ((*MLP, f"policy.hidden={HUGE}"), f"policy.hidden={HUGE}; need an int in [1, 8192]"),
    ((*MLP, "policy.hidden=16384"), "policy.hidden=16384; need an int in [1, 8192]"),
    ((*MLP, "policy.hidden=0"), "policy.hidden=0; need an int in [1, 8192]"),
    ((*MLP, f"policy.embed_dim={HUGE}"), f"policy.embed_dim={HUGE}; need an int in [1, 8192]"),
    ((*MLP, f"policy.head.num_bins={HUGE}"), f"num_bins={HUGE}; need an int in [2, 4096]"),
    ((*MLP, "policy.head.num_bins=1"), "num_bins=1; need an int in [2, 4096]"),
    ((*MLP, "policy.chunk_size=256", "policy.head.num_bins=4096"),
     "policy.chunk_size=256 x policy.action_dim=4 x policy.head.num_bins=4096 = 4,194,304 "
     "logits per decision; need at most 65,536"),
    ((*MLP, "policy.hidden=8192", "policy.chunk_size=16", "policy.head.num_bins=1024"),
     "policy.hidden=8192 x policy.chunk_size=16 x policy.action_dim=4 x "
     "policy.head.num_bins=1024 = 536,870,912 weights in the tokens head's layer; need at most "
     "268,435,456"),
    (("task=reach", "algo=ppo", "policy=mlp", f"policy.net_arch=[64,{HUGE}]"),
     f"policy.net_arch=[64, {HUGE}]; need at most 8 sizes, each an int in [1, 8192]"),
    (("task=reach", "algo=ppo", "policy=mlp", "policy.net_arch=[8,8,8,8,8,8,8,8,8]"),
     "policy.net_arch=[8, 8, 8, 8, 8, 8, 8, 8, 8]; need at most 8 sizes"),
    (("task=reach", "algo=ppo", "task.obs_mode=pixels", "policy=cnn",
      f"policy.features_dim={HUGE}"), f"policy.features_dim={HUGE}; need an int in [1, 8192]"),
    ((*FLOW, f"policy.head.steps={HUGE}"), f"steps={HUGE}; need an int in [1, 100]"),
    ((*FLOW, f"policy.head.hidden={HUGE}"), f"hidden={HUGE}; need an int in [1, 8192]"),
    ((*FLOW, "policy.head.hidden=16384"), "hidden=16384; need an int in [1, 8192]"),
    ((*FLOW, "policy.chunk_size=256", "policy.head.steps=100"),
     "policy.chunk_size=256 x policy.action_dim=4 x policy.head.steps=100 = 102,400 denoising "
     "values in each decision's record; need at most 65,536"),
    ((*TINY_VLA, f"policy.hidden={HUGE}"), f"policy.hidden={HUGE}; need an int in [1, 8192]"),
    ((*TINY_VLA, f"policy.conv_channels=[16,{HUGE}]"),
     f"policy.conv_channels=[16, {HUGE}]; need 1 to 8 ints in [1, 1024]"),
    ((*TINY_VLA, "policy.conv_channels=[2048]"),
     "policy.conv_channels=[2048]; need 1 to 8 ints in [1, 1024]"),
    ((*TINY_VLA, "policy.conv_channels=[8,8,8,8,8,8,8,8,8]"),
     "policy.conv_channels=[8, 8, 8, 8, 8, 8, 8, 8, 8]; need 1 to 8 ints"),
    ((*TINY_VLA, f"policy.pooled_size={HUGE}"), f"policy.pooled_size={HUGE}; need an int in "
                                                "[1, 64]"),
    ((*AVG_POOL, "policy.pooled_size=64"),
     "policy.conv_channels[-1]=32 x policy.pooled_size=64 x policy.pooled_size=64 = 131,072 "
     "image features; need at most 8,192"),
    ((*TINY_VLA, f"policy.instruction_keypoints={HUGE}"),
     f"policy.instruction_keypoints={HUGE}; need an int in [0, 1024]"),
    ((*TINY_VLA, "policy.embed_dim=8192", "policy.conv_channels=[1024]",
      "policy.instruction_keypoints=1024"),
     "policy.embed_dim=8192 x policy.instruction_keypoints=1024 x policy.conv_channels[-1]=1024 "
     "= 8,589,934,592 weights in the keypoint chooser's layer; need at most 268,435,456"),
    ((*SMOLVLA, f"policy.chunk_size={HUGE}"), f"policy.chunk_size={HUGE}; need an int in "
                                              "[1, 256]"),
    ((*SMOLVLA, f"policy.execute_steps={HUGE}"), f"policy.execute_steps={HUGE} with chunk_size=8"),
    ((*SMOLVLA, f"policy.action_dim={HUGE}"), f"policy.action_dim={HUGE}; need an int in [1, 64]"),
    ((*SMOLVLA, f"policy.flow_steps={HUGE}"), f"policy.flow_steps={HUGE}; need an int in "
                                              "[1, 100]"),
    ((*SMOLVLA, f"policy.hidden={HUGE}"), f"policy.hidden={HUGE}; need an int in [1, 8192]"),
    ((*SMOLVLA, "policy.lora_rank=1000000"), "policy.lora_rank=1000000, lora_alpha=16.0"),
    ((*SMOLVLA, "policy.lora_rank=33"),
     "policy.lora_rank=33 on 'tiny:smolvla', a backbone of width 64; need at most 32"),
    ((*SMOLVLA, "policy.chunk_size=256", "policy.flow_steps=100"),
     "policy.flow_steps=100 x policy.chunk_size=256 x policy.action_dim=4 = 102,400 denoising "
     "values in each decision's record; need at most 65,536"),
    ((*HF_VLA, f"policy.num_bins={HUGE}"), f"policy.num_bins={HUGE}; need an int in [2, 4096]"),
    ((*HF_VLA, f"policy.action_dim={HUGE}"), f"policy.action_dim={HUGE}; need an int in [1, 64]"),
    ((*HF_VLA, "policy.lora.rank=1000000"), "policy.lora: rank=1000000"),
]


def case_id(value: object) -> str | None:
    """A case's policy overrides (``None``, pytest's own id, for a message)."""
    if isinstance(value, tuple):
        return " ".join(o for o in value if o.startswith("policy"))
    return None


@pytest.fixture(scope="module", autouse=True)
def composed_once():
    """The first composition of each kind imports its modules; time the later ones."""
    for base in (MLP, FLOW, TINY_VLA, SMOLVLA, HF_VLA):
        harness_config.compose(list(base))


@pytest.fixture(autouse=True)
def no_training(monkeypatch):
    """``trainers.train`` fails the test instead of building the policy."""
    def accepted(config, run_dir):
        pytest.fail(f"policy {config.policy} was accepted and reached the trainer")

    monkeypatch.setattr(trainers, "train", accepted)


@pytest.mark.parametrize(("overrides", "message"), REFUSED, ids=case_id)
def test_an_oversized_policy_is_refused_at_compose_by_name(overrides, message, tmp_path):
    started = time.process_time()  # CPU seconds: the machine's load does not count
    with pytest.raises(ConfigError) as refused:
        trainers.train(harness_config.compose(list(overrides)), tmp_path / "run")
    assert message in str(refused.value)
    assert not (tmp_path / "run").exists()
    assert time.process_time() - started < 1.0


@pytest.mark.parametrize("overrides", [
    (*MLP, "policy.chunk_size=256", "policy.head.num_bins=64"),  # 65,536 logits
    (*MLP, "policy.hidden=8192", "policy.chunk_size=8", "policy.head.num_bins=1024"),
    (*FLOW, "policy.chunk_size=16", "policy.head.steps=100", "policy.head.hidden=8192"),
    (*AVG_POOL, "policy.conv_channels=[32]", "policy.pooled_size=16"),  # 8,192 features
    (*SMOLVLA, "policy.lora_rank=32", "policy.chunk_size=16", "policy.flow_steps=100"),
], ids=case_id)
def test_sizes_at_their_bounds_compose(overrides):
    harness_config.compose(list(overrides))  # refuses nothing at a bound


def test_the_train_app_refuses_an_oversized_policy_and_leaves_no_run_folder(tmp_path, capsys):
    run_dir = tmp_path / "run"
    status = train_app.main([*MLP, f"policy.hidden={HUGE}", f"hydra.run.dir={run_dir}",
                             "hydra/job_logging=none", "hydra/hydra_logging=none"])
    assert status == 1
    assert f"policy.hidden={HUGE}" in capsys.readouterr().err
    assert not run_dir.exists()
