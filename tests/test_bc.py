"""Tests for demonstrations (HDF5 layout, loading, errors) and behaviour cloning."""

from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import tasks
from harness.config import BCConfig, Seeds, StartPolicyConfig, StatePretrainConfig
from harness.demos import Demos, collect_demos, load_demos, rebuild_env
from harness.policies import actions_to_tokens, make, resolve_device, tokens_to_actions
from harness.policies.heads.tokens import token_cross_entropy
from harness.policies.mlp import MLPConfig
from harness.policies.tiny_vla import TinyVLAConfig
from harness.start_policy import cloned_start_policy
from harness.start_policy.bc import evaluate_policy, pretrain_bc, random_shift, split_by_episode
from harness.start_policy.state_pretraining import pretrain_state_features

torch.set_num_threads(1)

IMAGE = 32
PIXEL_KEYS = {"state": (14,), "pixels": (IMAGE, IMAGE, 3), "proprio": (8,), "instruction": (12,)}
PIXEL_DTYPES = {"state": np.float32, "pixels": np.uint8, "proprio": np.float32,
                "instruction": np.int64}


@pytest.fixture(scope="module")
def pixel_demos(tmp_path_factory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("demos") / "reach_pixels.hdf5"
    summary = collect_demos(path, "reach", episodes=3, obs_mode="pixels_state",
                            image_size=IMAGE, seed=5, progress=False)
    return path, summary


@pytest.fixture(scope="module")
def state_demos(tmp_path_factory) -> Demos:
    path = tmp_path_factory.mktemp("demos") / "reach_state.hdf5"
    collect_demos(path, "reach", episodes=30, obs_mode="state", progress=False)
    return load_demos(path)


# --- file layout ------------------------------------------------------------------------------


def test_demo_file_has_robomimic_layout(pixel_demos):
    path, summary = pixel_demos
    assert summary == {"path": str(path), "episodes": 3, "attempts": 3,
                       "steps": summary["steps"], "expert_success_rate": 1.0}
    with h5py.File(path, "r") as f:
        data = f["data"]
        assert sorted(data) == ["demo_0", "demo_1", "demo_2"]
        env_args = json.loads(data.attrs["env_args"])
        assert env_args["env_name"] == "reach"
        assert env_args["env_kwargs"]["obs_mode"] == "pixels_state"
        assert env_args["env_kwargs"]["image_size"] == IMAGE
        total = 0
        for i, name in enumerate(sorted(data)):
            demo = data[name]
            steps = int(demo.attrs["num_samples"])
            assert steps >= 1 and bool(demo.attrs["success"]) and demo.attrs["seed"] == 5 + i
            assert set(demo["obs"]) == set(PIXEL_KEYS)
            for key, shape in PIXEL_KEYS.items():
                assert demo["obs"][key].shape == (steps, *shape)
                assert demo["obs"][key].dtype == PIXEL_DTYPES[key]
            assert demo["actions"].shape == (steps, 4) and demo["actions"].dtype == np.float32
            assert np.all(np.abs(demo["actions"][()]) <= 1.0)
            assert demo["rewards"].shape == (steps,) and demo["rewards"].dtype == np.float32
            np.testing.assert_array_equal(demo["dones"][()], np.eye(steps)[-1])
            total += steps
        assert data.attrs["total"] == total == summary["steps"]


def test_load_round_trip_matches_the_file(pixel_demos):
    path, _ = pixel_demos
    demos = load_demos(path)
    with h5py.File(path, "r") as f:
        names = ["demo_0", "demo_1", "demo_2"]
        for key in PIXEL_KEYS:
            expected = np.concatenate([f["data"][n]["obs"][key][()] for n in names])
            np.testing.assert_array_equal(demos.obs[key], expected)
            assert demos.obs[key].dtype == PIXEL_DTYPES[key]
        lengths = [int(f["data"][n].attrs["num_samples"]) for n in names]
        actions = np.concatenate([f["data"][n]["actions"][()] for n in names])
    np.testing.assert_array_equal(demos.actions, actions)
    np.testing.assert_array_equal(demos.episode_ids, np.repeat(np.arange(3), lengths))
    np.testing.assert_array_equal(demos.seeds, [5, 6, 7])
    assert demos.num_episodes == 3 and len(demos) == sum(lengths)
    assert demos.dones.sum() == 3 and demos.successes.all()

    only_state = load_demos(path, keys=["state"])
    assert set(only_state.obs) == {"state"}
    with pytest.raises(ValueError, match="depth"):
        load_demos(path, keys=["state", "depth"])


def test_replaying_recorded_actions_reproduces_the_observations(pixel_demos):
    path, _ = pixel_demos
    demos = load_demos(path, keys=["state"])
    env = rebuild_env(demos.env_args, obs_mode="state")
    steps = demos.episode_ids == 1
    obs, _ = env.reset(seed=int(demos.seeds[1]))
    replayed = [obs["state"]]
    for action in demos.actions[steps][:-1]:
        obs, *_ = env.step(action)
        replayed.append(obs["state"])
    env.close()
    np.testing.assert_array_equal(np.stack(replayed), demos.obs["state"][steps])


def test_failures_are_kept_and_marked_only_when_asked(tmp_path):
    kwargs = {"obs_mode": "state", "max_episode_steps": 2, "progress": False}
    summary = collect_demos(tmp_path / "all.hdf5", "reach", 4, only_successes=False, **kwargs)
    demos = load_demos(tmp_path / "all.hdf5")
    assert summary["episodes"] == summary["attempts"] == demos.num_episodes == 4
    assert not demos.successes.all()
    assert summary["expert_success_rate"] == demos.successes.mean()

    # Two steps cannot reach a target 20 cm away: the collection fails and writes nothing.
    with pytest.raises(RuntimeError, match="succeeded in"):
        collect_demos(tmp_path / "none.hdf5", "reach", 1, difficulty=1.0, **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.hdf5"]


def test_missing_or_corrupt_demo_files_raise_clear_errors(tmp_path, pixel_demos):
    with pytest.raises(FileNotFoundError, match="no demo file"):
        load_demos(tmp_path / "absent.hdf5")
    garbage = tmp_path / "garbage.hdf5"
    garbage.write_bytes(b"not an hdf5 file at all")
    with pytest.raises(ValueError, match="not a readable HDF5"):
        load_demos(garbage)
    truncated = tmp_path / "truncated.hdf5"
    truncated.write_bytes(pixel_demos[0].read_bytes()[:2000])
    with pytest.raises(ValueError):
        load_demos(truncated)
    with h5py.File(tmp_path / "empty.hdf5", "w") as f:
        f.create_group("other")
    with pytest.raises(ValueError, match="'data' group"):
        load_demos(tmp_path / "empty.hdf5")
    with h5py.File(tmp_path / "nodemos.hdf5", "w") as f:
        f.create_group("data").attrs["env_args"] = "{}"
    with pytest.raises(ValueError, match="no demo_<i>"):
        load_demos(tmp_path / "nodemos.hdf5")


# --- pure pieces ------------------------------------------------------------------------------


def test_expert_actions_survive_tokenisation_to_within_half_a_bin(state_demos):
    for num_bins in (3, 11, 21):
        tokens = actions_to_tokens(state_demos.actions, num_bins)
        assert tokens.shape == state_demos.actions.shape and tokens.dtype == torch.int64
        rebuilt = tokens_to_actions(tokens, num_bins).numpy()
        assert np.max(np.abs(rebuilt - state_demos.actions)) <= 1.0 / (num_bins - 1) + 1e-6
        np.testing.assert_array_equal(actions_to_tokens(rebuilt, num_bins), tokens)


def test_random_shift_is_an_edge_padded_translation():
    images = torch.arange(2 * 6 * 5 * 3, dtype=torch.int64).view(2, 6, 5, 3).to(torch.uint8)
    generator = torch.Generator().manual_seed(0)
    assert random_shift(images, 0, generator) is images
    shifted = random_shift(images, 2, generator)
    assert shifted.shape == images.shape and shifted.dtype == torch.uint8
    for image, out in zip(images.numpy(), shifted.numpy(), strict=True):
        padded = np.pad(image, ((2, 2), (2, 2), (0, 0)), mode="edge")
        crops = [padded[dy:dy + 6, dx:dx + 5] for dy in range(5) for dx in range(5)]
        assert any(np.array_equal(out, crop) for crop in crops)


def test_token_cross_entropy_by_hand():
    uniform = torch.zeros(2, 4, 5)
    assert token_cross_entropy(uniform, torch.zeros(2, 4, dtype=torch.long)).item() == (
        pytest.approx(math.log(5))
    )
    # One confident right token (logit 10 vs 0) and three uniform ones.
    logits = torch.zeros(1, 4, 5)
    logits[0, 0, 2] = 10.0
    expected = (-math.log(math.exp(10) / (math.exp(10) + 4)) + 3 * math.log(5)) / 4
    assert token_cross_entropy(logits, torch.tensor([[2, 0, 0, 0]])).item() == (
        pytest.approx(expected, rel=1e-5)
    )


def test_split_is_by_whole_episodes():
    episode_ids = np.repeat(np.arange(10), 4)
    train, val = split_by_episode(episode_ids, 0.2, seed=0)
    assert len(train) + len(val) == 40 and len(val) == 8
    assert not set(episode_ids[train.numpy()]) & set(episode_ids[val.numpy()])
    train, val = split_by_episode(episode_ids, 0.0, seed=0)
    assert len(val) == 0 and len(train) == 40


# --- behaviour cloning ------------------------------------------------------------------------


def test_bc_on_reach_beats_an_untrained_policy(state_demos):
    env = rebuild_env(state_demos.env_args)
    torch.manual_seed(0)
    untrained = make(MLPConfig(use_instruction=True), env.observation_space)
    torch.manual_seed(0)
    policy = make(MLPConfig(use_instruction=True), env.observation_space)
    metrics = pretrain_bc(policy, state_demos, epochs=300, lr=3e-3, seed=0, progress=False)

    history = metrics["history"]
    assert len(history) == 300 and metrics["bc/kept_epoch"] == 300
    assert history[-1]["bc/train_loss"] < 0.5 * history[0]["bc/train_loss"]
    assert metrics["bc/val_accuracy"] > 0.8 and metrics["bc/val_steps"] > 0
    assert not policy.training

    before = evaluate_policy(untrained, env, episodes=40, seed=10_000)
    after = evaluate_policy(policy, env, episodes=40, seed=10_000)
    env.close()
    assert before["eval/success_rate"] <= 0.2
    assert after["eval/success_rate"] >= 0.6
    assert after["eval/success_low"] > before["eval/success_high"]


def test_keep_best_val_loss_restores_that_epoch(state_demos):
    env = rebuild_env(state_demos.env_args)
    torch.manual_seed(0)
    policy = make(MLPConfig(use_instruction=True, hidden=32), env.observation_space)
    env.close()
    metrics = pretrain_bc(policy, state_demos, epochs=8, lr=1e-2, keep="best_val_loss",
                          seed=0, progress=False)
    assert metrics["bc/kept_epoch"] == metrics["bc/best_epoch"]
    best = min(h["bc/val_loss"] for h in metrics["history"])
    assert metrics["bc/best_val_loss"] == best
    val_idx = split_by_episode(state_demos.episode_ids, 0.1, seed=0)[1].numpy()
    obs = {k: torch.as_tensor(v[val_idx]) for k, v in state_demos.obs.items()}
    with torch.no_grad():
        loss = token_cross_entropy(policy.head.logits(policy.features(obs)),
                                   actions_to_tokens(state_demos.actions[val_idx], 11))
    assert loss.item() == pytest.approx(best, rel=1e-5)


def test_bc_refuses_demos_without_what_the_policy_reads(pixel_demos):
    demos = load_demos(pixel_demos[0])
    config = TinyVLAConfig(hidden=16, conv_channels=(4,))
    env = rebuild_env(demos.env_args)
    vla = make(config, env.observation_space)
    env.close()
    with pytest.raises(ValueError, match="'pixels'"):
        pretrain_bc(vla, load_demos(pixel_demos[0], keys=["state", "proprio", "instruction"]),
                    epochs=1, progress=False)
    with pytest.raises(ValueError, match="keep="):
        pretrain_bc(vla, demos, keep="best", progress=False)
    larger = rebuild_env(demos.env_args, image_size=IMAGE + 8)
    vla_for_larger_images = make(config, larger.observation_space)
    larger.close()
    with pytest.raises(ValueError, match="shape"):
        pretrain_bc(vla_for_larger_images, demos, epochs=1, progress=False)


def test_bc_on_pixels_runs_with_augmentation(pixel_demos):
    demos = load_demos(pixel_demos[0])
    env = rebuild_env(demos.env_args)
    torch.manual_seed(0)
    vla = make(TinyVLAConfig(hidden=16, conv_channels=(4, 4)),
               env.observation_space)
    metrics = pretrain_bc(vla, demos, epochs=2, batch_size=16, progress=False)
    assert math.isfinite(metrics["bc/train_loss"]) and math.isfinite(metrics["bc/val_loss"])
    result = evaluate_policy(vla, env, episodes=2, seed=10_000, deterministic=False)
    assert result == evaluate_policy(vla, env, episodes=2, seed=10_000, deterministic=False)
    assert result["eval/episodes"] == 2
    assert result["eval/success_low"] <= result["eval/success_rate"] <= result["eval/success_high"]
    env.close()


def test_state_pretraining_teaches_pixel_features_where_things_are():
    # reach: the target sphere and the gripper move from episode to episode, and the state
    # holds their positions. The pretrained features must explain most of the variance of the
    # state on held-out episodes (the untrained, random features explain none of it through a
    # head that was never fitted), and the token head must be left as it was.
    torch.manual_seed(0)
    options = {"obs_mode": "pixels", "image_size": IMAGE, "max_episode_steps": 20}
    env = tasks.make("reach", **options)
    vla = make(TinyVLAConfig(hidden=32, conv_channels=(8, 16)),
               env.observation_space)
    env.close()
    head_before = vla.head.linear.weight.detach().clone()
    metrics = pretrain_state_features(vla, "reach", options, episodes=40, epochs=30, lr=3e-3,
                                      difficulty=1.0, seed=0, val_fraction=0.25,
                                      progress=False)
    assert metrics["pretrain/frames"] > 40
    assert metrics["pretrain/val_r2"] > 0.35  # 0.51 when written; an unfitted head gives <= 0
    assert torch.equal(vla.head.linear.weight, head_before)
    assert not vla.training


def test_state_pretraining_refuses_bad_input():
    options = {"obs_mode": "state"}
    env = tasks.make("reach", **options)
    mlp = make(MLPConfig(use_instruction=True, hidden=16), env.observation_space)
    env.close()
    with pytest.raises(ValueError, match="pixel policies.*mlp"):
        pretrain_state_features(mlp, "reach", options, episodes=2, progress=False)
    with pytest.raises(ValueError, match="episodes=0"):
        pretrain_state_features(mlp, "reach", options, episodes=0, progress=False)


def test_shift_augmentation_reaches_training_only_and_is_seeded(tmp_path):
    # The same seed gives the same clone; a shift in the state pretraining, or in BC, changes
    # what is learned; the clone's actions are then a function of the observation alone (no
    # shift at inference): two calls on the same frame agree.
    options = {"obs_mode": "pixels", "image_size": IMAGE, "max_episode_steps": 12}
    config = TinyVLAConfig(hidden=16, conv_channels=(4, 4))

    def clone(pretrain_pad: int, bc_pad: int) -> dict[str, torch.Tensor]:
        start = StartPolicyConfig(
            bc=BCConfig(demos=2, epochs=2, difficulty=1.0, shift_pad=bc_pad),
            state_pretrain=StatePretrainConfig(episodes=3, epochs=2, shift_pad=pretrain_pad))
        policy, metrics = cloned_start_policy("reach", options, config, start, Seeds(0, 0),
                                              progress=False, demo_dir=tmp_path)
        assert math.isfinite(metrics["pretrain/val_r2"])
        return policy

    plain = clone(0, 0)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(),
                                                 clone(0, 0).state_dict().values(), strict=True))
    for pads in ((3, 0), (0, 3)):
        shifted = clone(*pads)
        assert not torch.equal(shifted.image_encoder[0].weight, plain.image_encoder[0].weight)
    env = tasks.make("reach", **options)
    obs, _ = env.reset(seed=0)
    env.close()
    batch = {key: torch.as_tensor(value)[None] for key, value in obs.items()}
    with torch.no_grad():
        assert torch.equal(shifted.act(batch, deterministic=True)[0],
                           shifted.act(batch, deterministic=True)[0])
        assert torch.equal(shifted.features(batch), shifted.features(batch))
    with pytest.raises(ValueError, match="shift_pad=-1"):
        pretrain_state_features(shifted, "reach", options, episodes=1, shift_pad=-1,
                                progress=False)


# --- the cloned start policy ------------------------------------------------------------------


def clone_reach(demo_dir: Path, device: str = "cpu", **options):
    """``cloned_start_policy`` on 2 reach demos, 1 epoch, a small MLP."""
    return cloned_start_policy(
        "reach", {"obs_mode": "state", "max_episode_steps": 40, **options},
        MLPConfig(use_instruction=True, hidden=16),
        StartPolicyConfig(bc=BCConfig(demos=2, epochs=1, difficulty=0.0)), Seeds(0, 0),
        device=device, progress=False, demo_dir=demo_dir)


def test_demo_cache_is_keyed_by_every_env_option(tmp_path):
    _, stop = clone_reach(tmp_path, terminate_on_success=True)
    _, run_on = clone_reach(tmp_path, terminate_on_success=False)
    assert stop["bc/demo_file"] != run_on["bc/demo_file"]
    assert len(list(tmp_path.glob("*.hdf5"))) == 2
    stopping, running = load_demos(stop["bc/demo_file"]), load_demos(run_on["bc/demo_file"])
    # each file was recorded under its own options, which the env it rebuilds also has
    assert stopping.env_args["env_kwargs"]["terminate_on_success"] is True
    assert running.env_args["env_kwargs"]["terminate_on_success"] is False
    env = rebuild_env(running.env_args)
    assert env.config.terminate_on_success is False
    env.close()
    # without early termination every episode runs to the 40-step limit
    assert len(running) == 2 * 40 and len(stopping) < len(running)
    # the same options (a default spelled out or not, any task.difficulty: the demos' own
    # difficulty replaces it) reuse the file; randomization does not
    _, again = clone_reach(tmp_path, difficulty=0.7)
    assert again["bc/demo_file"] == stop["bc/demo_file"]
    _, randomized = clone_reach(tmp_path, randomization={"enabled": True})
    assert randomized["bc/demo_file"] not in (stop["bc/demo_file"], run_on["bc/demo_file"])
    assert load_demos(randomized["bc/demo_file"]).env_args["env_kwargs"]["randomization"] == {
        "enabled": True}
    assert len(list(tmp_path.glob("*.hdf5"))) == 3


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(),
                    reason="'auto' is the CPU only on a machine without CUDA or MPS")
def test_cloned_policy_is_trained_on_the_device_asked_for(tmp_path):
    for device in ("cpu", "auto"):
        policy, metrics = clone_reach(tmp_path, device=device)
        assert {p.device for p in policy.parameters()} == {torch.device("cpu")}
        assert math.isfinite(metrics["bc/train_loss"])
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="device='cuda'"):
        clone_reach(tmp_path, device="cuda")
    with pytest.raises(ValueError, match="device='cuda:1'"):
        resolve_device("cuda:1")
    with pytest.raises(ValueError, match="device='tpu'"):
        resolve_device("tpu")
