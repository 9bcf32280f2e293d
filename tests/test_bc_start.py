"""The stronger BC start: demos recorded with noise injection and labelled by the expert (DART),
and the MLP token policy's state normalisation fitted on the demos. Real scenes and real
(tiny) networks: push and reach demos recorded here, a policy cloned and exported."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import onnxruntime as ort
import pytest
import torch

import tasks
from harness import config as harness_config
from harness.config import BCConfig, Seeds, StartPolicyConfig
from harness.config.errors import ConfigError
from harness.demos import collect_demos, demo_cache_dir, load_demos, rebuild_env
from harness.export import export_onnx, sample_observations
from harness.policies import load_policy, make, obs_to_batch, save_policy
from harness.policies.mlp import MLPConfig
from harness.start_policy import cloned_start_policy, demo_file
from harness.start_policy.bc import pretrain_bc, split_by_episode

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dart_demos(tmp_path_factory):
    path = tmp_path_factory.mktemp("dart") / "push_dart.hdf5"
    summary = collect_demos(path, "push", episodes=3, noise=0.5, obs_mode="state",
                            difficulty=1.0, seed=3, progress=False, label="expert")
    return path, summary


def test_expert_labels_are_the_expert_action_in_the_state_the_noise_led_to(dart_demos):
    path, summary = dart_demos
    demos = load_demos(path)
    assert summary["episodes"] == 3 and demos.successes.all()
    assert demos.env_args["collection"] == {"noise": 0.5, "seed": 3, "only_successes": True,
                                            "label": "expert"}
    env = rebuild_env(demos.env_args)

    with h5py.File(path, "r") as f:
        for name in sorted(f["data"]):
            group = f["data"][name]
            labels, executed = group["actions"][()], group["executed_actions"][()]
            # the noise moved the executed actions away from the labels...
            assert np.abs(executed - labels).mean() > 0.2
            for t in (0, len(labels) // 2, len(labels) - 1):
                env.unwrapped.restore(tasks.snapshot_from_bytes(bytes(group["snapshots"][t])))
                expert = np.clip(env.unwrapped.expert_action(), -1, 1).astype(np.float32)
                # ...and each label is the noise-free expert action where the noise led
                np.testing.assert_array_equal(labels[t], expert)
            # replaying the executed actions from the reset reproduces the recorded states
            obs, _ = env.reset(seed=int(group.attrs["seed"]), options={"difficulty": 1.0})
            for t in range(len(labels)):
                np.testing.assert_array_equal(obs["state"], group["obs/state"][t])
                obs, *_ = env.step(executed[t])
    env.close()


def test_default_label_keeps_the_executed_action_and_no_second_copy(tmp_path):
    path = tmp_path / "reach.hdf5"
    collect_demos(path, "reach", episodes=1, noise=0.3, obs_mode="state", progress=False)

    with h5py.File(path, "r") as f:
        assert "executed_actions" not in f["data/demo_0"]
        assert "label" not in load_demos(path).env_args["collection"]
    with pytest.raises(ValueError, match="label='clean'; choose one of"):
        collect_demos(tmp_path / "x.hdf5", "reach", 1, label="clean", progress=False)


def test_noisy_demos_are_cached_apart_and_named_by_their_noise(tmp_path):
    options = {"obs_mode": "state"}
    plain = demo_file(tmp_path, "push", options, 20, 1.0)
    noisy = demo_file(tmp_path, "push", options, 20, 1.0, noise=0.5)
    assert plain == demo_file(tmp_path, "push", options, 20, 1.0, noise=0.0)
    assert noisy != plain and "_dart0.5_d1_n20" in noisy.name
    policy, metrics = cloned_start_policy(
        "reach", {"obs_mode": "state", "max_episode_steps": 30},
        MLPConfig(use_instruction=True, hidden=16),
        StartPolicyConfig(bc=BCConfig(demos=2, epochs=1, difficulty=0.0, noise=0.4)),
        Seeds(0, 0), progress=False, demo_dir=tmp_path)
    assert "_dart0.4_" in metrics["bc/demo_file"]
    assert load_demos(metrics["bc/demo_file"]).env_args["collection"]["label"] == "expert"


def test_bc_keep_hands_on_the_best_validation_epoch_or_the_last(tmp_path):
    # 6 demos: one held out, so BC has a validation loss to choose an epoch by; at this high
    # learning rate it overfits the five others after a few epochs
    def clone(keep: str):
        return cloned_start_policy(
            "reach", {"obs_mode": "state", "max_episode_steps": 30},
            MLPConfig(use_instruction=True, hidden=16),
            StartPolicyConfig(bc=BCConfig(demos=6, epochs=8, difficulty=0.0, lr=0.05, keep=keep)),
            Seeds(0, 0), progress=False, demo_dir=tmp_path)

    (best_policy, best), (last_policy, last) = clone("best_val_loss"), clone("last")
    assert best["bc/best_epoch"] < 8 and best["bc/kept_epoch"] == best["bc/best_epoch"]
    assert last["bc/kept_epoch"] == 8
    # the same seed and demos: the same training either way, only the weights handed on differ
    assert best["bc/best_epoch"] == last["bc/best_epoch"]
    assert best["bc/best_val_loss"] < last["bc/val_loss"]
    assert not all(torch.equal(a, b) for a, b in zip(best_policy.state_dict().values(),
                                                     last_policy.state_dict().values(),
                                                     strict=True))


def test_start_policy_options_refuse_bad_values_by_name(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"algo.start_policy.bc.demos=-1; must be >= 0"):
        BCConfig(demos=-1)
    with pytest.raises(ConfigError, match=r"algo.start_policy.bc.epochs=0; must be >= 1"):
        BCConfig(demos=2, epochs=0)
    with pytest.raises(ConfigError, match=r"algo.start_policy.bc.shift_pad=-2"):
        BCConfig(demos=2, shift_pad=-2)
    with pytest.raises(ConfigError, match="algo.start_policy.bc.keep='best'; choose one of"):
        BCConfig(demos=2, keep="best")
    options, mlp = {"obs_mode": "state", "max_episode_steps": 30}, MLPConfig(hidden=16)
    with pytest.raises(ValueError, match="bc.demos=0 and no dataset: nothing to clone"):
        cloned_start_policy("reach", options, mlp, StartPolicyConfig(), Seeds(0, 0),
                            progress=False, demo_dir=tmp_path)
    # demos are cached in the one cache folder unless a run names another
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    _, metrics = cloned_start_policy("reach", options, mlp,
                                     StartPolicyConfig(bc=BCConfig(demos=1, epochs=1)),
                                     Seeds(0, 0), progress=False)
    assert Path(metrics["bc/demo_file"]).parent == demo_cache_dir()


def test_demos_of_an_older_task_version_are_not_reused(tmp_path, monkeypatch):
    # reach's version 2 moved its goals (2026-12-03): version-1 caches must not be read back
    current = demo_file(tmp_path, "reach", {"obs_mode": "state"}, 5, 1.0)
    monkeypatch.setattr(tasks.TASKS["reach"], "version", 1)
    older = demo_file(tmp_path, "reach", {"obs_mode": "state"}, 5, 1.0)
    assert older != current and older.name.endswith("_d1_n5.hdf5")


# --- state normalisation ----------------------------------------------------------------------


def test_bc_fits_the_state_normaliser_on_the_training_episodes(dart_demos):
    demos = load_demos(dart_demos[0])
    env = rebuild_env(demos.env_args)
    torch.manual_seed(0)
    policy = make(MLPConfig(use_instruction=True, hidden=16, normalize_state=True),
                  env.observation_space)
    np.testing.assert_array_equal(policy.state_mean.numpy(), 0.0)  # identity until fitted
    np.testing.assert_array_equal(policy.state_std.numpy(), 1.0)
    metrics = pretrain_bc(policy, demos, epochs=1, seed=0, val_fraction=0.34, progress=False)
    train_idx = split_by_episode(demos.episode_ids, 0.34, seed=0)[0].numpy()
    state = demos.obs["state"][train_idx].astype(np.float64)
    assert metrics["bc/normalizer_states"] == len(train_idx) < len(demos)
    np.testing.assert_allclose(policy.state_mean.numpy(), state.mean(0), rtol=1e-5, atol=1e-7)
    std = np.maximum(state.std(0, ddof=1), policy.MIN_STD)
    np.testing.assert_allclose(policy.state_std.numpy(), std, rtol=1e-5)
    assert (policy.state_std.numpy() == policy.MIN_STD).any()  # e.g. the cube's quaternion

    # the features read the standardised state: the same as an unnormalised twin fed it
    twin = make(MLPConfig(use_instruction=True, hidden=16), env.observation_space)
    twin.load_state_dict({k: v for k, v in policy.state_dict().items()
                          if not k.startswith("state_")})
    batch = obs_to_batch(demos.obs, batched=True)
    scaled = {**batch, "state": (batch["state"] - policy.state_mean) / policy.state_std}
    with torch.no_grad():
        torch.testing.assert_close(policy.head.logits(policy.features(batch)),
                                   twin.head.logits(twin.features(scaled)))
    env.close()


def test_the_normaliser_is_saved_reloaded_and_exported(dart_demos, tmp_path):
    demos = load_demos(dart_demos[0])
    env = rebuild_env(demos.env_args)
    policy = make(MLPConfig(use_instruction=True, hidden=16, normalize_state=True),
                  env.observation_space)
    pretrain_bc(policy, demos, epochs=2, seed=0, progress=False)
    save_policy(tmp_path / "p.pt", policy)
    loaded = load_policy(tmp_path / "p.pt", env.observation_space)
    assert loaded.config.normalize_state
    torch.testing.assert_close(loaded.state_std, policy.state_std, rtol=0, atol=0)
    # a policy without the option has no buffers, so older checkpoints load as they did
    plain = make(MLPConfig(use_instruction=True, hidden=16), env.observation_space)
    assert not any(k.startswith("state_") for k in plain.state_dict())
    assert plain.fit_normalizer({"state": torch.zeros(4, 22)}) == {}

    observations = sample_observations(env, 40, seed=1)
    model, record = export_onnx(policy, {"task": "push", "task_options": {"obs_mode": "state"}},
                                observations)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    batch = obs_to_batch(observations)
    feeds = {node.name: batch[node.name].numpy() for node in session.get_inputs()}
    (logits,) = session.run(["logits"], feeds)
    with torch.no_grad():
        expected = policy.head.logits(policy.features(batch)).numpy()
        assert np.abs(logits - expected).max() <= 1e-4
    env.close()
    with pytest.raises(ValueError, match="at least 2 states"):
        policy.fit_normalizer({"state": torch.zeros(1, 22)})


def test_bad_options_are_refused_by_name(tmp_path):
    base = ["task=push", "algo=grpo", "policy=mlp"]
    with pytest.raises(ConfigError, match="algo.start_policy.bc.noise=-0.1; must be >= 0"):
        harness_config.compose([*base, "algo.start_policy.bc.noise=-0.1"])
    with pytest.raises(ConfigError, match="policy.normalize_state=true is read by the group"):
        harness_config.compose(["task=push", "algo=ppo", "policy=mlp",
                                "policy.normalize_state=true"])
    with pytest.raises(ConfigError, match="algo.start_policy.bc.noise=0.5 shapes the demos"):
        harness_config.compose([*base,
                                "algo.start_policy.bc.noise=0.5"])  # no algo.start_policy.bc.demos
    with pytest.raises(ConfigError, match="algo.start_policy.bc.lr=0.0; must be > 0"):
        harness_config.compose([*base, "algo.start_policy.bc.lr=0.0"])
    with pytest.raises(ConfigError, match="algo.start_policy.bc.keep='best'; choose one of"):
        harness_config.compose([*base, "algo.start_policy.bc.keep=best"])
    for key, value in (("start_policy.state_pretrain.shift_pad", -1),
                       ("start_policy.bc.shift_pad", -4)):
        with pytest.raises(ConfigError, match=f"algo.{key}={value}; must be >= 0"):
            harness_config.compose([*base, f"algo.{key}={value}"])
    cfg = harness_config.compose([*base, "policy.normalize_state=true",
                                  "algo.start_policy.bc.noise=0.5",
                                  "algo.start_policy.bc.demos=5"])
    with pytest.raises(ConfigError, match="algo.start_policy.file='missing.pt': no such file"):
        harness_config.compose([*base, "algo.start_policy.file=missing.pt"])
    # an arm loading another arm's saved start keeps the experiment's (unused) BC options
    (tmp_path / "start_policy.pt").write_bytes(b"")
    harness_config.compose([*base, "algo.start_policy.bc.noise=0.5",
                            "algo.start_policy.bc.demos=5",
                            f"algo.start_policy.file={tmp_path / 'start_policy.pt'}"])
    assert cfg.policy.normalize_state and cfg.algo.start_policy.bc.noise == 0.5
    # today's recipe unless switched on: BC shifts pixels by up to 4, pretraining does not
    assert (cfg.algo.start_policy.bc.shift_pad,
            cfg.algo.start_policy.state_pretrain.shift_pad) == (4, 0)
    assert cfg.algo.start_policy.bc.lr == 3e-3  # pretrain_bc's own default
    assert cfg.algo.start_policy.bc.keep == "last"  # likewise


def test_collect_demos_script_records_expert_labels_and_refuses_a_bad_one(tmp_path, capsys):
    """The demo app (``scripts/collect_demos.py``'s ``main``, in this process)."""
    from harness.apps import collect_demos as app

    common = ["task=reach", "task.obs_mode=state", "episodes=1", "noise=0.3",
              f"hydra.run.dir={tmp_path / 'hydra'}",
              # Hydra's logging set-up would close pytest's handlers (and its captured output)
              "hydra/job_logging=none", "hydra/hydra_logging=none"]
    out = tmp_path / "reach.hdf5"
    assert app.main([*common, "label=expert", f"out={out}"]) == 0, capsys.readouterr().err
    with h5py.File(out, "r") as f:
        assert "executed_actions" in f["data/demo_0"]
    capsys.readouterr()
    assert app.main([*common, "label=noisy", f"out={tmp_path / 'x.hdf5'}"]) == 1
    assert "label='noisy'; choose one of ('executed', 'expert')" in capsys.readouterr().err
    assert not (tmp_path / "x.hdf5").exists()
