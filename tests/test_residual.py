"""The residual option (``algo.residual``): a zero-initialised Gaussian head on the frozen start,
whose greedy actions start as the start's own; it trains only the head, saves and reloads,
plays the same in spawned workers, and resumes to the uninterrupted run."""

from __future__ import annotations

import pytest
import torch

from harness import config as harness_config
from harness import trainers
from harness.config.errors import ConfigError
from harness.policies import load_policy, obs_to_batch
from harness.policies import make as make_policy
from harness.policies.residual.model import residual_of
from harness_common.files import read_metrics

STATE = ["task=reach", "task.obs_mode=state", "task.difficulty=0.05", "task.max_episode_steps=12",
         "policy=mlp", "policy.hidden=16", "policy.chunk_size=2"]
SMALL = ["algo.group_size=3", "algo.num_start_states=2", "algo.minibatch_size=3",
         "algo.start_policy.bc.demos=2", "algo.start_policy.bc.epochs=2", "eval.every_steps=0",
         "eval.final_episodes=4", "eval.episodes=2", "logger=none", "seed=2",
         "algo.residual.scale=0.2", "algo.learning_rate=0.01"]
OPERATIONAL = ("time/", "rollout/worker_restarts", "bc/seconds", "pretrain/seconds")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))


def _run(tmp_path, name: str, *overrides: str) -> tuple[dict, dict]:
    config = harness_config.compose([*STATE, *SMALL, *overrides])
    summary = trainers.train(config, tmp_path / name)
    series = read_metrics(tmp_path / name / "metrics.csv")
    return summary, {k: [v for _, v in rows] for k, rows in series.items()
                     if not k.startswith(OPERATIONAL)}


@pytest.mark.parametrize("head", ["tokens", "flow"])
def test_the_residual_starts_as_its_base_and_trains_only_its_head(head):
    import tasks

    config = harness_config.compose([*STATE, f"policy/head={head}", "algo=grpo"]).policy
    env = tasks.make("reach", obs_mode="state")
    torch.manual_seed(0)
    base = make_policy(config, env.observation_space)
    obs = obs_to_batch(env.reset(seed=3)[0])
    env.close()
    _, greedy = base.act(obs, deterministic=True)
    residual = residual_of(base, 0.2)
    torch.testing.assert_close(residual.act(obs, deterministic=True)[1], greedy, rtol=0, atol=0)
    assert all(not p.requires_grad for p in residual.base.parameters())
    records, actions = residual.act(obs, temperature=1.0)
    assert (actions - greedy).abs().max() <= 0.2 + 1e-6  # a residual of at most the scale
    trained = {name for name, p in residual.named_parameters() if p.requires_grad}
    assert trained == {"head.mean.weight", "head.mean.bias", "head.log_std",
                       "value_head.0.weight", "value_head.0.bias", "value_head.2.weight",
                       "value_head.2.bias"}
    assert residual.log_prob(obs, records).shape == (1, residual.spec.units_per_decision)


def test_a_residual_run_trains_saves_reloads_and_resumes(tmp_path, data_dir):
    straight, metrics = _run(tmp_path, "straight", "algo=grpo", "algo.iterations=2",
                             "algo.bc_coef=0.5", "algo.exploration.high=0.3")
    # the head moved (the BC anchor alone moves it), within its bounded noise
    assert metrics["train/kl_to_reference"][-1] > 0
    assert all(v > 0 for v in metrics["train/bc_loss"])
    assert metrics["train/std_max"][-1] <= 0.3 + 1e-6
    import tasks

    env = tasks.make("reach", obs_mode="state")
    start = load_policy(tmp_path / "straight" / "start_policy.pt", env.observation_space)
    env.close()
    assert start.spec.kind == "mlp"  # the start file holds the clone, not the residual
    _run(tmp_path, "resumed", "algo=grpo", "algo.iterations=1", "algo.bc_coef=0.5",
         "algo.exploration.high=0.3")
    resumed_summary, resumed = _run(tmp_path, "resumed", "algo=grpo", "algo.iterations=2",
                                    "algo.bc_coef=0.5", "algo.exploration.high=0.3",
                                    "resume=true")
    assert resumed == metrics
    assert resumed_summary["success_rate"] == straight["success_rate"]


def test_a_residual_plays_the_same_in_spawned_workers(tmp_path, data_dir):
    _, one = _run(tmp_path, "one", "algo=grpo", "algo.iterations=1")
    _, two = _run(tmp_path, "two", "algo=grpo", "algo.iterations=1", "algo.workers=2")
    assert one == two


def test_a_residual_reloads_from_its_checkpoint(tmp_path, data_dir):
    from harness.algos.group.checkpoints import policy_from_state, read_checkpoint

    _run(tmp_path, "run", "algo=grpo", "algo.iterations=1")
    state = read_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt")
    policy = policy_from_state(state)
    assert policy.spec.kind == "residual" and policy.config.base["name"] == "mlp"
    path = tmp_path / "residual.pt"
    policy.save(path)
    again = load_policy(path)
    for (name, a), (_, b) in zip(policy.state_dict().items(), again.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_the_residual_is_refused_where_it_cannot_sit():
    with pytest.raises(ConfigError, match=r"algo.residual.scale=3"):
        harness_config.compose(["algo=grpo", "algo.residual.scale=3"])


@pytest.mark.parametrize(("obs_mode", "base_head"), [("state", "tokens"), ("pixels", "flow")])
def test_a_residual_exports_to_onnx_and_deploys_its_greedy_actions(obs_mode, base_head, tmp_path):
    """The graph gives the residual's greedy actions (the base's greedy chunk plus a residual
    far from zero, saturating the clip), through the deploy side too."""
    import numpy as np

    import tasks
    from harness.deploy import ExportedPolicy
    from harness.export import export_onnx, sample_observations
    from harness.policies.tiny_vla import TinyVLAConfig

    options = {"obs_mode": obs_mode, "max_episode_steps": 4}
    if obs_mode == "pixels":
        options["image_size"] = 32
        config = TinyVLAConfig(hidden=16, conv_channels=[4, 4], chunk_size=2,
                               head={"name": base_head, "steps": 2})
    else:
        config = harness_config.compose([*STATE, "algo=grpo", f"policy/head={base_head}"]).policy
    env = tasks.make("reach", **options)
    torch.manual_seed(0)
    residual = residual_of(make_policy(config, env.observation_space), 1.0)
    with torch.no_grad():
        residual.head.mean.bias.copy_(torch.linspace(-3.0, 3.0, residual.head.mean.bias.numel()))
    model, info = export_onnx(residual, {"task": "reach", "task_options": options},
                              sample_observations(env, 16))
    assert info["action_head"] == "residual" and info["outputs"] == ["actions"]
    assert info["base"]["action_head"] == base_head and info["policy"]["kind"] == "residual"
    assert (info["chunk_size"], info["execute_steps"]) == (2, 2)
    assert info["parity"]["max_abs_action_diff"] <= 1e-5
    (tmp_path / "residual.onnx").write_bytes(model)
    exported = ExportedPolicy(tmp_path / "residual.onnx")
    obs, _ = env.reset(seed=1)
    env.close()
    with torch.no_grad():
        _, expected = residual.eval().act(obs_to_batch(obs), deterministic=True)
        _, base = residual.base.act(obs_to_batch(obs), deterministic=True)
    actions = exported(obs)
    np.testing.assert_allclose(actions, expected[0].numpy(), rtol=0, atol=1e-5)
    assert np.abs(actions).max() == 1.0 and not np.allclose(actions, base[0].numpy())


def test_a_residual_run_exports_and_deploys_as_it_evaluates(tmp_path, data_dir):
    import importlib

    from harness.checkpoints import evaluate_checkpoint
    from harness.deploy import ExportedPolicy, deploy

    _run(tmp_path, "run", "algo=grpo", "algo.iterations=1")
    export_app = importlib.import_module("harness.apps.export_policy")
    assert export_app.main([f"checkpoint={tmp_path / 'run'}", f"out={tmp_path / 'run.onnx'}",
                            f"hydra.run.dir={tmp_path / 'hydra'}", "hydra/job_logging=none",
                            "hydra/hydra_logging=none"]) == 0
    expected, _ = evaluate_checkpoint(tmp_path / "run", episodes=3)
    result = deploy(ExportedPolicy(tmp_path / "run.onnx"), episodes=3)
    assert [(e.seed, e.success, e.length) for e in result.evaluation.episodes] == [
        (e.seed, e.success, e.length) for e in expected.episodes]
    assert [e.episode_return for e in result.evaluation.episodes] == pytest.approx(
        [e.episode_return for e in expected.episodes], abs=1e-4)


@pytest.mark.parametrize(("overrides", "named"), [
    (["policy=smolvla", "algo.residual.scale=0.2"],
     "algo.residual puts a residual head on an mlp or tiny_vla start; policy=smolvla"),
    (["policy=smolvla", "algo.exploration.high=0.3"],
     "algo.exploration bounds the noise scale .* policy=smolvla"),
    (["policy=tiny_vla", "policy/head=tokens", "algo.exploration.high=0.3"],
     "algo.exploration .* head 'tokens' has none .* algo.temperature"),
])
def test_residual_and_exploration_are_refused_where_they_cannot_act(tmp_path, overrides, named):
    """By name, before the run folder exists."""
    config = harness_config.compose([*STATE[:3], "task.obs_mode=pixels", "task.image_size=32",
                                     "algo=grpo", "logger=none", *overrides])
    with pytest.raises(ValueError, match=named):
        trainers.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
