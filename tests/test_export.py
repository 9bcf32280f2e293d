"""Exported policies: the ONNX graph of a group-trainer run gives the torch policy's logits and
greedy actions on real env observations, carries what deploying it needs, and plays in the
simulator through onnxruntime in a process that never imports torch; bad inputs are refused by
name. Real components throughout: two tiny group-trainer runs (MLP on state, TinyVLA on 32 px),
and two with continuous action heads (MLP, gaussian and flow), whose graphs give the torch
policy's greedy actions."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import tasks
from harness import config as harness_config
from harness import trainers
from harness.checkpoints import evaluate_checkpoint
from harness.deploy import ACTION_HEADS, METADATA_KEY, DeployLimits, ExportedPolicy, deploy
from harness.export import WindowAveragePool, export_onnx, sample_observations
from harness.policies import head_class, head_names, obs_to_batch, tokens_to_actions
from harness.policies import make as make_policy
from harness.policies.mlp import MLPConfig
from harness.policies.tiny_vla import TinyVLAConfig
from harness.runs import resolve_checkpoint, write_checkpoint
from harness_common.files import read_metrics, sha256_of

ROOT = Path(__file__).resolve().parent.parent
TINY = ["task=reach", "task.max_episode_steps=10", "algo=grpo", "algo.iterations=1",
        "algo.group_size=2", "algo.num_start_states=2", "algo.minibatch_size=4",
        "eval.final_episodes=2", "eval.every_steps=0", "logger=none", "torch_threads=1"]
POLICIES = {
    "mlp": ["policy=mlp", "policy.hidden=32", "policy.use_instruction=true"],
    "tiny_vla": ["task.obs_mode=pixels", "task.image_size=32", "policy=tiny_vla",
                 "policy.hidden=16", "policy.conv_channels=[4,4]"],
}
HYDRA_QUIET = ["hydra/job_logging=none", "hydra/hydra_logging=none"]


# The apps behind scripts/export_policy.py and scripts/deploy_policy.py.
export_app = importlib.import_module("harness.apps.export_policy")
deploy_app = importlib.import_module("harness.apps.deploy_policy")


def export(tmp_path: Path, *args: str) -> int:
    return export_app.main([*args, f"hydra.run.dir={tmp_path / 'hydra'}", *HYDRA_QUIET])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One tiny group-trainer run per policy kind, each exported to ``<run>.onnx``."""
    folder = tmp_path_factory.mktemp("export")
    for kind, overrides in POLICIES.items():
        trainers.train(harness_config.compose([*TINY, *overrides]), folder / kind)
        assert read_metrics(folder / kind / "metrics.csv")
        assert export(folder, f"checkpoint={folder / kind}", f"out={folder / kind}.onnx") == 0
    return {kind: folder / kind for kind in POLICIES}


def greedy_observations(policy, env, episodes: int = 2) -> list[dict[str, np.ndarray]]:
    """Observations of real env steps under the torch policy's greedy actions."""
    observations = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        done = False
        while not done:
            observations.append(obs)
            _, actions = policy.act(obs_to_batch(obs), deterministic=True)
            obs, _, terminated, truncated, _ = env.step(actions[0, 0].numpy())
            done = terminated or truncated
    return observations


@pytest.mark.parametrize("kind", POLICIES)
def test_the_graph_gives_the_torch_logits_and_greedy_actions(runs, kind):
    policy, _, metadata = export_app.load_checkpoint_policy(str(runs[kind]))
    env = tasks.make(metadata["task"], **metadata["task_options"])
    observations = greedy_observations(policy, env)
    session = ort.InferenceSession(f"{runs[kind]}.onnx", providers=["CPUExecutionProvider"])
    batch = obs_to_batch(observations)
    feeds = {node.name: batch[node.name].numpy() for node in session.get_inputs()}
    logits, tokens, actions = session.run(["logits", "tokens", "actions"], feeds)
    with torch.no_grad():
        expected_logits = policy.head.logits(policy.features(batch))
        expected_tokens, expected_actions = policy.act(batch, deterministic=True)
    expected_actions = expected_actions[:, 0]  # a chunk of one action: (B, action_dim) out

    assert logits.shape == (len(observations), 4, policy.config.head["num_bins"])
    assert np.abs(logits - expected_logits.numpy()).max() <= 1e-4
    np.testing.assert_array_equal(tokens, expected_tokens.numpy())
    np.testing.assert_array_equal(actions, expected_actions.numpy())
    np.testing.assert_array_equal(actions, tokens_to_actions(tokens, 11).numpy())
    exported = ExportedPolicy(f"{runs[kind]}.onnx")  # one raw observation at a time, batch of 1
    for obs, action in zip(observations, expected_actions.numpy(), strict=True):
        np.testing.assert_array_equal(exported(obs), action)


@pytest.mark.parametrize(("size", "pooled"), [(11, 4), (5, 4), (8, 4), (7, 3), (4, 4)])
def test_window_average_pool_is_adaptive_average_pooling(size, pooled):
    features = torch.randn(2, 3, size, size + 1)
    expected = torch.nn.AdaptiveAvgPool2d(pooled)(features)
    assert torch.allclose(WindowAveragePool((size, size + 1), pooled)(features), expected,
                          atol=1e-6)


def test_an_avg_pool_tiny_vla_exports_where_onnx_has_no_adaptive_pool():
    """40 px: 40 -> 20 -> 10 -> 5 after the convolutions, pooled to 4 x 4 (5 is no multiple)."""
    env = tasks.make("reach", obs_mode="pixels", image_size=40)
    torch.manual_seed(0)
    policy = make_policy(TinyVLAConfig(hidden=16, conv_channels=[4, 4, 4],
                                       image_features="avg_pool"), env.observation_space)
    _, info = export_onnx(policy, {"task": "reach", "task_options": {}},
                          sample_observations(env, 16))
    assert info["parity"]["max_abs_logit_diff"] <= 1e-4 and not info["parity"]["token_mismatches"]


def test_a_tiny_vla_with_instruction_keypoints_exports_for_any_batch():
    """The main job's policy chooses keypoints by the instruction: the graph must not fix the
    batch size it was traced with (1) and still give the torch logits on 16 observations."""
    env = tasks.make("push", obs_mode="pixels", image_size=32)
    torch.manual_seed(0)
    policy = make_policy(TinyVLAConfig(hidden=16, conv_channels=[4, 4],
                                       instruction_keypoints=2), env.observation_space)
    _, info = export_onnx(policy, {"task": "push", "task_options": {}},
                          sample_observations(env, 16))
    assert info["parity"]["max_abs_logit_diff"] <= 1e-4 and not info["parity"]["token_mismatches"]


def test_the_file_says_what_deploy_needs(runs):
    info = ExportedPolicy(f"{runs['tiny_vla']}.onnx").info
    checkpoint, metadata = resolve_checkpoint(runs["tiny_vla"])
    assert info["task"] == "reach" and info["task_options"] == metadata["task_options"]
    assert info["inputs"] == [
        {"name": "pixels", "shape": [32, 32, 3], "dtype": "uint8"},
        {"name": "instruction", "shape": [12], "dtype": "int64"},
        {"name": "proprio", "shape": [8], "dtype": "float32"},
    ]
    assert info["outputs"] == ["logits", "tokens", "actions"]
    assert (info["num_bins"], info["action_dim"]) == (11, 4)
    assert info["bin_centres"] == pytest.approx(np.linspace(-1, 1, 11).tolist())
    assert info["source"]["sha256"] == sha256_of(checkpoint) == metadata["sha256"]
    assert info["source"]["algo"] == "grpo" and info["source"]["policy"] == "fine-tuned"
    assert info["evaluation"] == metadata["evaluation"]
    assert info["control_period_s"] == pytest.approx(0.04)
    assert info["exported_at"].startswith(datetime.now(UTC).date().isoformat())
    assert info["parity"]["max_abs_logit_diff"] <= 1e-4 and info["parity"]["observations"] == 32
    assert [i["name"] for i in ExportedPolicy(f"{runs['mlp']}.onnx").info["inputs"]] == [
        "state", "instruction"]


def test_the_start_policy_exports_with_reference(runs, tmp_path):
    assert export(tmp_path, f"checkpoint={runs['mlp']}", "reference=true",
                  f"out={tmp_path / 'start.onnx'}") == 0
    start, _, _ = export_app.load_checkpoint_policy(str(runs["mlp"]), reference=True)
    obs, _ = tasks.make("reach", max_episode_steps=10).reset(seed=5)
    exported = ExportedPolicy(tmp_path / "start.onnx")
    assert exported.info["source"]["policy"].startswith("reference")
    _, action = start.act(obs_to_batch(obs), deterministic=True)
    np.testing.assert_array_equal(exported(obs), action[0, 0].numpy())


def test_deployment_plays_the_episodes_evaluate_plays(runs):
    """Same held-out seeds and greedy actions: the same episodes as ``scripts/evaluate.py``."""
    expected, _ = evaluate_checkpoint(runs["tiny_vla"], episodes=3)
    result = deploy(ExportedPolicy(f"{runs['tiny_vla']}.onnx"), episodes=3)
    assert [(e.seed, e.success, e.length) for e in result.evaluation.episodes] == [
        (e.seed, e.success, e.length) for e in expected.episodes]
    steps = sum(e.length for e in expected.episodes)
    assert len(result.inference_s) == len(result.step_s) == steps
    assert all(0 < a < b for a, b in zip(result.inference_s, result.step_s, strict=True))
    summary = result.summary()
    assert summary["control_period_ms"] == pytest.approx(40.0)
    assert 0 < summary["inference_ms"]["p50"] <= summary["inference_ms"]["p99"]


def test_deployment_plays_the_runs_evaluation_horizon(tmp_path):
    """A run trained on 6-step attempts and evaluated on 14-step episodes (as the main job trains
    on 60 and evaluates on the task's 100): deploying its export plays the 14-step episodes
    ``scripts/evaluate.py`` plays, and an explicit ``max_episode_steps`` still wins."""
    trainers.train(harness_config.compose([*TINY, *POLICIES["mlp"], "task.max_episode_steps=6",
                                           "eval.max_episode_steps=14"]), tmp_path / "run")
    assert export(tmp_path, f"checkpoint={tmp_path / 'run'}", f"out={tmp_path / 'run.onnx'}") == 0
    expected, _ = evaluate_checkpoint(tmp_path / "run", episodes=3)
    exported = ExportedPolicy(tmp_path / "run.onnx")
    assert exported.info["evaluation"]["max_episode_steps"] == 14
    result = deploy(exported, episodes=3)
    assert [(e.seed, e.success, e.length) for e in result.evaluation.episodes] == [
        (e.seed, e.success, e.length) for e in expected.episodes]
    assert max(e.length for e in expected.episodes) > 6
    short = deploy(exported, episodes=3, task_options={"max_episode_steps": 6})
    assert max(e.length for e in short.evaluation.episodes) <= 6


def test_the_deploy_script_never_imports_torch(runs, tmp_path):
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "scripts/deploy_policy.py",
         f"model={runs['tiny_vla']}.onnx", "episodes=2", f"output={tmp_path / 'deploy.json'}",
         f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", done.stderr, re.MULTILINE)
    assert "onnxruntime" in imported and "mujoco" in imported
    assert not [name for name in imported if name.split(".")[0] == "torch"]
    assert "success" in done.stdout and "p99" in done.stdout
    written = json.loads((tmp_path / "deploy.json").read_text())
    assert written["episodes"] == 2 and written["step_ms"]["p99"] > 0


def test_deploy_takes_task_options_spelt_as_in_train(runs, tmp_path):
    """``+task.<option>`` over the exported task options changes the episodes played."""
    def deployed(name: str, *overrides: str) -> dict:
        output = tmp_path / f"{name}.json"
        assert deploy_app.main([f"model={runs['mlp']}.onnx", "episodes=2", f"output={output}",
                                f"hydra.run.dir={tmp_path / name}", *HYDRA_QUIET,
                                *overrides]) == 0
        return json.loads(output.read_text())

    exported, short = deployed("exported"), deployed("short", "+task.max_episode_steps=3")
    assert exported["mean_episode_length"] > 3 == short["mean_episode_length"]
    assert short["task_options"]["max_episode_steps"] == 3


def fake_checkpoint(run_dir: Path, algo: str, payload: bytes = b"weights") -> Path:
    write_checkpoint(run_dir / "checkpoints", "latest", ".pt" if algo == "grpo" else ".zip",
                     lambda file: file.write(payload),
                     {"algo": algo, "task": "reach", "task_options": {}})
    return run_dir


@pytest.mark.parametrize(("make_args", "named"), [
    (lambda tmp, runs: [f"checkpoint={fake_checkpoint(tmp / 'sb3', 'ppo')}"], "algo='ppo'"),
    (lambda tmp, runs: [f"checkpoint={fake_checkpoint(tmp / 'new', 'foo')}"], "algo='foo'"),
    (lambda tmp, runs: [f"checkpoint={tmp / 'nowhere'}"], "nowhere"),
    (lambda tmp, runs: [f"checkpoint={runs['mlp']}", "format=tflite"], "format='tflite'"),
])
def test_export_refuses_what_it_cannot_export_by_name(runs, tmp_path, capsys, make_args, named):
    assert export(tmp_path, *make_args(tmp_path, runs), f"out={tmp_path / 'x.onnx'}") == 1
    assert named in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


def test_export_refuses_an_unknown_policy_kind(runs, tmp_path, capsys):
    checkpoint, _ = resolve_checkpoint(runs["mlp"])
    state = torch.load(checkpoint, weights_only=True)
    state["policy_config"]["name"] = "cnn"
    run = tmp_path / "cnn_run"
    fake_checkpoint(run, "grpo", b"")
    torch.save(state, run / "checkpoints" / "latest.pt")  # then mend the recorded SHA-256
    meta = json.loads((run / "checkpoints" / "latest.json").read_text())
    meta["sha256"] = sha256_of(run / "checkpoints" / "latest.pt")
    (run / "checkpoints" / "latest.json").write_text(json.dumps(meta))
    assert export(tmp_path, f"checkpoint={run}", f"out={tmp_path / 'x.onnx'}") == 1
    assert "policy='cnn'" in capsys.readouterr().err


def test_a_failed_parity_check_leaves_the_old_file(runs, tmp_path, monkeypatch, capsys):
    import harness.export

    out = tmp_path / "policy.onnx"
    out.write_bytes(b"the previous export")
    monkeypatch.setattr(harness.export, "compare_with_torch", lambda *args: {
        "observations": 32, "max_abs_logit_diff": 0.5, "token_mismatches": 3,
        "action_mismatches": 3})
    assert export(tmp_path, f"checkpoint={runs['mlp']}", f"out={out}") == 1
    assert "does not reproduce" in capsys.readouterr().err
    assert out.read_bytes() == b"the previous export"
    assert [p.name for p in tmp_path.iterdir() if p.name != "hydra"] == ["policy.onnx"]


def test_deploy_refuses_bad_models_and_tasks_by_name(runs, tmp_path, capsys):
    def refused(*args: str) -> str:
        code = deploy_app.main([*args, "episodes=1", f"hydra.run.dir={tmp_path / 'h'}",
                                *HYDRA_QUIET])
        assert code == 1
        return capsys.readouterr().err

    assert "no exported policy at" in refused(f"model={tmp_path / 'missing.onnx'}")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    assert "not an ONNX model" in refused(f"model={tmp_path / 'junk.onnx'}")
    plain = tmp_path / "plain.onnx"
    tensor = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "plain", [tensor],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])), plain)
    assert "no 'vla_rl_harness' metadata" in refused(f"model={plain}")
    model = f"model={runs['mlp']}.onnx"
    message = refused(model, "task_name=push")
    assert "'state' of shape (14,)" in message and "(30,)" in message and "'reach'" in message
    assert "task.obs_mode='state' would change what the policy sees" in refused(
        f"model={runs['tiny_vla']}.onnx", "+task.obs_mode=state")
    assert "task.camera='side' would change what the policy sees" in refused(
        f"model={runs['tiny_vla']}.onnx", "+task.camera=side")  # same shape, another view
    assert "write +task.max_episode_steps=100" in refused(
        model, "+task_options.max_episode_steps=100")
    assert "unknown task 'nope'" in refused(model, "task_name=nope")
    assert "difficulties=[2.0]" in refused(model, "difficulties=[2.0]")


# --- continuous action heads ------------------------------------------------------------------
HEAD_RUNS = {  # one action per decision for the Gaussian, a chunk of 3 playing 2 for the flow
    "gaussian": ["policy/head=gaussian"],
    "flow": ["policy/head=flow", "policy.head.steps=3", "policy.chunk_size=3",
             "policy.execute_steps=2"],
}
ACTION_TOLERANCE = 1e-5  # float32 rounding of tanh and of the Euler steps; measured below 1e-7


@pytest.fixture(scope="module")
def head_runs(tmp_path_factory) -> dict[str, Path]:
    """One tiny group-trainer MLP run per continuous head, exported by the app to
    ``<run>.onnx``."""
    folder = tmp_path_factory.mktemp("heads")
    for head, overrides in HEAD_RUNS.items():
        trainers.train(harness_config.compose([*TINY, *POLICIES["mlp"], *overrides]),
                       folder / head)
        assert export(folder, f"checkpoint={folder / head}", f"out={folder / head}.onnx") == 0
    return {head: folder / head for head in HEAD_RUNS}


@pytest.mark.parametrize("head", HEAD_RUNS)
def test_a_continuous_head_graph_gives_the_torch_greedy_actions(head_runs, head):
    """On real episodes of the torch policy: the whole chunk as one batch, and the played
    ``execute_steps`` one observation at a time through the deploy side."""
    policy, _, metadata = export_app.load_checkpoint_policy(str(head_runs[head]))
    assert policy.config.head["name"] == policy.spec.head == head
    env = tasks.make(metadata["task"], **metadata["task_options"])
    observations = greedy_observations(policy, env)
    session = ort.InferenceSession(f"{head_runs[head]}.onnx", providers=["CPUExecutionProvider"])
    assert [node.name for node in session.get_outputs()] == ["actions"]
    batch = obs_to_batch(observations)
    (actions,) = session.run(["actions"], {node.name: batch[node.name].numpy()
                                           for node in session.get_inputs()})
    with torch.no_grad():
        _, expected = policy.act(batch, deterministic=True)  # (B, chunk_size, action_dim)
    chunk, played = policy.config.chunk_size, policy.config.steps_per_decision
    expected = expected.numpy() if chunk > 1 else expected[:, 0].numpy()
    assert actions.shape == expected.shape and np.abs(actions).max() <= 1.0
    np.testing.assert_allclose(actions, expected, rtol=0, atol=ACTION_TOLERANCE)
    exported = ExportedPolicy(f"{head_runs[head]}.onnx")
    assert exported.action_head == head
    for obs, action in zip(observations, expected, strict=True):
        np.testing.assert_allclose(exported(obs), action if chunk == 1 else action[:played],
                                   rtol=0, atol=ACTION_TOLERANCE)


@pytest.mark.parametrize("head", HEAD_RUNS)
def test_a_continuous_head_file_says_its_head_and_rule(head_runs, head):
    info = ExportedPolicy(f"{head_runs[head]}.onnx").info
    assert info["action_head"] == info["policy"]["head"]["name"] == head
    assert info["outputs"] == ["actions"]
    assert info["greedy_rule"] == head_class(head).greedy_rule
    assert not {"num_bins", "bin_centres", "bin_centres_rule"} & set(info)
    assert (info["chunk_size"], info["execute_steps"]) == ((1, 1) if head == "gaussian"
                                                           else (3, 2))
    assert info["parity"]["observations"] == 32
    assert info["parity"]["max_abs_action_diff"] <= info["parity"]["tolerance"] == 1e-4


def test_a_token_policy_file_names_its_head():
    env = tasks.make("reach")
    policy = make_policy(MLPConfig(use_instruction=True, hidden=16), env.observation_space)
    _, info = export_onnx(policy, {"task": "reach", "task_options": {}})
    assert info["action_head"] == "tokens" and info["outputs"] == ["logits", "tokens", "actions"]
    assert info["num_bins"] == 11 and "greedy_rule" not in info


@pytest.mark.parametrize("head", HEAD_RUNS)
def test_deployment_of_a_continuous_head_plays_the_episodes_evaluate_plays(head_runs, head):
    expected, _ = evaluate_checkpoint(head_runs[head], episodes=3)
    result = deploy(ExportedPolicy(f"{head_runs[head]}.onnx"), episodes=3)
    assert [(e.seed, e.success, e.length) for e in result.evaluation.episodes] == [
        (e.seed, e.success, e.length) for e in expected.episodes]
    assert [e.episode_return for e in result.evaluation.episodes] == pytest.approx(
        [e.episode_return for e in expected.episodes], abs=1e-4)
    played = 1 if head == "gaussian" else 2
    assert len(result.inference_s) == sum(-(-e.length // played) for e in expected.episodes)


def test_deploy_policy_plays_a_flow_graph(head_runs, tmp_path, capsys):
    output = tmp_path / "deploy.json"
    assert deploy_app.main([f"model={head_runs['flow']}.onnx", "episodes=2", f"output={output}",
                            f"hydra.run.dir={tmp_path / 'hydra'}", *HYDRA_QUIET]) == 0
    printed = capsys.readouterr().out
    assert "(mlp, flow head," in printed and "per decision of 2 steps" in printed
    written = json.loads(output.read_text())
    assert written["episodes"] == 2 and written["inference_ms"]["p50"] > 0


@pytest.mark.parametrize("head", HEAD_RUNS)
def test_a_tiny_vla_with_a_continuous_head_exports(head, tmp_path):
    """Random weights on 32 px pixels, instruction and proprio: the graph reproduces the greedy
    actions on real observations and plays through the deploy side."""
    env = tasks.make("reach", obs_mode="pixels", image_size=32, max_episode_steps=4)
    torch.manual_seed(0)
    options = {"steps": 2} if head == "flow" else {}
    policy = make_policy(TinyVLAConfig(hidden=16, conv_channels=[4, 4], chunk_size=2,
                                       head={"name": head, **options}),
                         env.observation_space)
    with torch.no_grad():  # outputs from -3 to 3: the flow's clip and tanh's saturation act
        last = policy.head.velocity[-1] if head == "flow" else policy.head.mean
        last.bias.copy_(torch.linspace(-3.0, 3.0, last.bias.numel()))
    model, info = export_onnx(policy, {"task": "reach", "task_options": {"obs_mode": "pixels",
                                       "image_size": 32, "max_episode_steps": 4}},
                              sample_observations(env, 16))
    assert info["parity"]["max_abs_action_diff"] <= ACTION_TOLERANCE
    (tmp_path / "vla.onnx").write_bytes(model)
    obs, _ = env.reset(seed=1)
    with torch.no_grad():
        _, expected = policy.eval().act(obs_to_batch(obs), deterministic=True)
    actions = ExportedPolicy(tmp_path / "vla.onnx")(obs)
    np.testing.assert_allclose(actions, expected[0].numpy(), rtol=0, atol=ACTION_TOLERANCE)
    assert (np.abs(actions).max() == 1.0) == (head == "flow") and np.abs(actions).max() > 0.99


def test_a_continuous_head_export_that_does_not_reproduce_the_policy_is_refused(
        head_runs, tmp_path, monkeypatch, capsys):
    import harness.export

    out = tmp_path / "flow.onnx"
    monkeypatch.setattr(harness.export, "compare_with_torch", lambda *args: {
        "observations": 32, "max_abs_action_diff": float("nan")})
    assert export(tmp_path, f"checkpoint={head_runs['flow']}", f"out={out}") == 1
    assert "does not reproduce the mlp policy's flow head" in capsys.readouterr().err
    assert not out.exists()


def test_a_crafted_action_head_is_refused_by_field(head_runs, tmp_path):
    """A head's name is any identifier (a plugin's head exports as the built-in continuous
    ones do: greedy actions); anything else in the field is refused by name."""
    model = onnx.load(f"{head_runs['gaussian']}.onnx")
    info = json.loads({prop.key: prop.value for prop in model.metadata_props}[METADATA_KEY])
    for head, refused in (("be ta", True), (7, True), ("laplace", False)):
        onnx.helper.set_model_props(model, {METADATA_KEY: json.dumps({**info,
                                                                      "action_head": head})})
        onnx.save(model, tmp_path / "crafted.onnx")
        if refused:
            with pytest.raises(ValueError, match=f"crafted.onnx.*action_head={head!r}"):
                ExportedPolicy(tmp_path / "crafted.onnx")
        else:
            assert ExportedPolicy(tmp_path / "crafted.onnx").action_head == head
    assert ACTION_HEADS == head_names()  # the deploy side's torch-free copy of the built-ins


# --- bounds of the deploy side ----------------------------------------------------------------
STATE_DIM = 14  # reach's state observation


@pytest.fixture(scope="module")
def state_record() -> dict:
    """The deploy record of a real export (an MLP on reach's state, random weights), its inputs
    cut to ``state`` for the crafted graphs below."""
    env = tasks.make("reach")
    torch.manual_seed(0)
    policy = make_policy(MLPConfig(hidden=8), env.observation_space)
    _, info = export_onnx(policy, {"task": "reach", "task_options": {}})
    return {**info, "inputs": [{"name": "state", "shape": [STATE_DIM], "dtype": "float32"}]}


def crafted_model(path: Path, record: dict | str, nodes: list, constants: dict,
                  actions: tuple = ("batch", 4)) -> Path:
    """A graph from ``state`` to ``actions`` built with ``onnx.helper``: ``nodes`` reading
    ``constants`` (name -> int64 values) and ending in ``actions``; ``record`` in its
    metadata."""
    helper = onnx.helper
    graph = helper.make_graph(
        nodes, "crafted",
        [helper.make_tensor_value_info("state", onnx.TensorProto.FLOAT, ["batch", STATE_DIM])],
        [helper.make_tensor_value_info("actions", onnx.TensorProto.FLOAT, list(actions))],
        initializer=[onnx.numpy_helper.from_array(np.asarray(values, np.int64), name)
                     for name, values in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, {METADATA_KEY: record if isinstance(record, str)
                                   else json.dumps(record)})
    onnx.save(model, path)
    return path


SLICE = {"zero": [0], "four": [4], "one": [1]}  # state[:, 0:4], the crafted graphs' actions


def first_four(into: str) -> list:
    return [onnx.helper.make_node("Slice", ["state", "zero", "four", "one"], [into])]


def loop_body() -> onnx.GraphProto:
    helper, tensor = onnx.helper, onnx.TensorProto
    return helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", tensor.INT64, []),
         helper.make_tensor_value_info("cond_in", tensor.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", tensor.BOOL, [])])


make_node = onnx.helper.make_node
CRAFTED = {  # name: (nodes, constants, what the refusal names)
    "a 6.4 GB ConstantOfShape summed": (
        [make_node("ConstantOfShape", ["huge"], ["filled"], name="fill"),
         make_node("ReduceSum", ["filled"], ["total"], keepdims=0, name="sum"),
         *first_four("part"), make_node("Add", ["part", "total"], ["actions"])],
        {"huge": [40000, 40000], **SLICE},
        r"node 'fill' \(ConstantOfShape\) makes a tensor of 1,600,000,000 elements; the limit "
        r"is tensor_elements=16,777,216"),
    "a Loop of 1e15 iterations": (
        [make_node("Loop", ["trips", ""], [], body=loop_body(), name="forever"),
         *first_four("actions")],
        {"trips": 10**15, **SLICE},
        r"node 'forever' \(Loop\) of domain 'ai.onnx' is not an operator the exporter emits; "
        r"allowed: Add, ArgMax"),
    "a size read from the observation": (
        [*first_four("part"), make_node("Cast", ["part"], ["sizes"], to=onnx.TensorProto.INT64),
         make_node("ConstantOfShape", ["sizes"], ["filled"], name="fill"),
         make_node("ReduceSum", ["filled"], ["total"], keepdims=0),
         make_node("Add", ["part", "total"], ["actions"])],
        SLICE,
        r"node 'fill' \(ConstantOfShape\): its input 0 \('sizes'\), which sets a size or a "
        r"shape, is computed from observation values"),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_a_graph_that_could_allocate_or_loop_without_bound_is_refused_before_it_runs(
        state_record, tmp_path, case):
    """Refused by its operator or its constant sizes before any process loads the graph: the
    test allocates nothing of the sizes the graphs ask for, and the Loop never starts."""
    nodes, constants, named = CRAFTED[case]
    path = crafted_model(tmp_path / "crafted.onnx", state_record, nodes, constants)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=named) as error:
        ExportedPolicy(path)
    assert str(error.value).startswith(str(path)) and time.perf_counter() - start < 2.0


def test_the_exported_graphs_meet_the_bounds_and_a_sane_crafted_one_plays(state_record,
                                                                         tmp_path):
    """The bounds refuse by what a graph does, not by who built it: a small graph of the
    exporter's operators deploys."""
    path = crafted_model(tmp_path / "sane.onnx", state_record, first_four("actions"), SLICE)
    policy = ExportedPolicy(path)
    obs = {"state": np.arange(STATE_DIM, dtype=np.float32)}
    np.testing.assert_array_equal(policy(obs), [0, 1, 2, 3])


def test_a_graph_whose_actions_differ_from_the_record_is_refused(state_record, tmp_path):
    path = crafted_model(tmp_path / "wide.onnx", state_record,
                         [onnx.helper.make_node("Slice", ["state", "zero", "five", "one"],
                                                ["actions"])],
                         {**SLICE, "five": [5]}, actions=("batch", 5))
    with pytest.raises(ValueError, match=r"wide.onnx: the graph takes .* gives \{'actions': "
                                         r"\(5,\)\}.*action_dim=4"):
        ExportedPolicy(path)
    named = crafted_model(tmp_path / "named.onnx", state_record,  # a side left named
                          [onnx.helper.make_node("Slice", ["state", "zero", "five", "one"],
                                                 ["actions"])],
                          {**SLICE, "five": [5]}, actions=("batch", "width"))
    with pytest.raises(ValueError, match=r"named.onnx: the warm-up decision gives actions of "
                                         r"shape \(1, 5\).*declares \(1, 4\)"):
        ExportedPolicy(named)


def test_a_huge_metadata_record_is_refused_by_its_size_before_it_is_parsed(state_record,
                                                                          tmp_path):
    """2 MiB of record that is not even JSON: the size, read from the file's bytes, refuses it
    first (a 200 MB record once cost 1.1 GB to load and parse)."""
    path = crafted_model(tmp_path / "chatty.onnx", "{" + "x" * 2**21, first_four("actions"),
                         SLICE)
    with pytest.raises(ValueError, match=r"chatty.onnx: its metadata and descriptions are "
                                         r"\{'metadata_props': 20971\d\d\} bytes, 2,097,1\d\d in "
                                         r"all; the limit is record_bytes=1,048,576"):
        ExportedPolicy(path)


def test_the_warm_up_decision_is_bounded_in_memory_and_time(state_record, tmp_path, capsys):
    """A size computed from the input's shape (allowed: every decision allocates the same) that
    asks for 1.7 GB: the trial decision's process hits its address-space bound, so nothing of
    that size is ever allocated; and a trial over its time bound is killed."""
    nodes = [make_node("Shape", ["state"], ["shape"]),
             make_node("Mul", ["shape", "scale"], ["sizes"]),
             make_node("ConstantOfShape", ["sizes"], ["filled"]),
             make_node("ReduceSum", ["filled"], ["total"], keepdims=0),
             *first_four("part"), make_node("Add", ["part", "total"], ["actions"])]
    path = crafted_model(tmp_path / "hungry.onnx", state_record, nodes,
                         {**SLICE, "scale": [20000, 1500]})  # (20000, 21000) float32
    assert deploy_app.main([f"model={path}", f"hydra.run.dir={tmp_path / 'h'}",
                            *HYDRA_QUIET]) == 1
    assert re.search(r"hungry.onnx: the warm-up decision on zero observations .* failed within "
                     r"warm_up_bytes=1,073,741,824 of address space", capsys.readouterr().err)
    sane = crafted_model(tmp_path / "sane.onnx", state_record, first_four("actions"), SLICE)
    with pytest.raises(ValueError, match=r"sane.onnx: the warm-up decision did not finish "
                                         r"within warm_up_seconds=0.01"):
        ExportedPolicy(sane, limits=DeployLimits(warm_up_seconds=0.01))


# --- format=lerobot: what overwrite=true may replace -------------------------------------------
SMOLVLA = ["task=reach", "task.obs_mode=pixels", "task.image_size=32", "task.max_episode_steps=9",
           "task.difficulty=0.1", "policy=smolvla", "policy.chunk_size=4",
           "policy.execute_steps=2", "policy.flow_steps=2", "algo=grpo", "algo.iterations=1",
           "algo.group_size=2", "algo.num_start_states=2", "algo.minibatch_size=2",
           "eval.every_steps=0", "eval.final_episodes=2", "logger=none", "torch_threads=1"]


@pytest.fixture(scope="module")
def smolvla_run(tmp_path_factory) -> Path:
    """A tiny ``policy=smolvla`` run (``tiny:smolvla``, random weights, offline), one GRPO
    iteration."""
    folder = tmp_path_factory.mktemp("smolvla")
    trainers.train(harness_config.compose(SMOLVLA), folder / "run")
    return folder / "run"


def listing(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (``None`` for a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
            for p in sorted(folder.rglob("*"))}


def test_overwrite_moves_a_folder_the_exporter_did_not_write_aside_whole(smolvla_run, tmp_path,
                                                                         capsys):
    """A folder with another policy's config.json, notes and data: moved aside whole, as
    training moves a run's earlier files, and said so; nothing lost (it was once deleted but
    for the config.json)."""
    out = tmp_path / "out" / "mine"
    (out / "data").mkdir(parents=True)
    (out / "config.json").write_text('{"type": "act"}')
    (out / "precious.txt").write_text("mine")
    (out / "data" / "episode.bin").write_bytes(b"\x00\x01")
    before = listing(out)
    assert export(tmp_path, f"checkpoint={smolvla_run}", "format=lerobot", f"out={out}",
                  "overwrite=true") == 0
    printed = capsys.readouterr().out
    (aside,) = [p for p in (tmp_path / "out").iterdir() if p.name.startswith("mine.replaced-")]
    assert f"moved it aside whole to {aside}" in printed
    assert listing(aside) == before
    assert (out / "harness_export.json").is_file()


@pytest.mark.parametrize("out", [".", ".."])
def test_an_out_that_is_the_working_directory_or_above_is_refused(smolvla_run, tmp_path,
                                                                  monkeypatch, capsys, out):
    """Refused before anything is built, leaving no staging folder (it once failed half-way
    with Errno 16 and left ``..old.*`` behind)."""
    inner = tmp_path / "work" / "inner"
    inner.mkdir(parents=True)
    for folder in (inner, inner.parent):
        (folder / "config.json").write_text('{"type": "smolvla"}')
        (folder / "precious.txt").write_text("mine")
    before = listing(tmp_path / "work")
    monkeypatch.chdir(inner)
    assert export(tmp_path, f"checkpoint={smolvla_run}", "format=lerobot", f"out={out}",
                  "overwrite=true") == 1
    what = "the working directory" if out == "." else "a folder above the working directory"
    assert f"out={out}: {out} is {what}" in capsys.readouterr().err
    assert listing(tmp_path / "work") == before


def test_overwrite_replaces_a_folder_the_exporter_wrote_and_nothing_else(smolvla_run, tmp_path,
                                                                        capsys):
    from harness.policies.smolvla.out_folder import MARKER_FILE

    out = tmp_path / "smolvla_reach"
    assert export(tmp_path, f"checkpoint={smolvla_run}", "format=lerobot", f"out={out}") == 0
    marker = json.loads((out / MARKER_FILE).read_text())
    files = ["config.json", "harness_heads.safetensors", "model.safetensors", "vlm_config.json"]
    assert marker["files"] == files and marker["format"] == "lerobot smolvla"
    assert "export_policy.py" in marker["written_by"]
    assert export(tmp_path, f"checkpoint={smolvla_run}", "format=lerobot", f"out={out}",
                  "overwrite=true") == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*files, MARKER_FILE])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hydra", "smolvla_reach"]  # no staging
    (out / "README.md").write_text("my notes")  # added since: the exporter did not write it
    capsys.readouterr()
    assert export(tmp_path, f"checkpoint={smolvla_run}", "format=lerobot", f"out={out}",
                  "overwrite=true") == 0
    assert "holds ['README.md'], which its writer did not write" in capsys.readouterr().out
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("smolvla_reach.replaced-")]
    assert (aside / "README.md").read_text() == "my notes"
    assert sorted(p.name for p in out.iterdir()) == sorted([*files, MARKER_FILE])


def test_an_onnx_out_never_replaces_a_folder_or_a_link(runs, tmp_path, capsys):
    folder = tmp_path / "policy.onnx"
    (folder / "keep").mkdir(parents=True)
    link = tmp_path / "link.onnx"
    link.symlink_to(tmp_path / "elsewhere.onnx")
    for out in (folder, link):
        assert export(tmp_path, f"checkpoint={runs['mlp']}", f"out={out}") == 1
        assert f"out={out} exists and is not a regular file" in capsys.readouterr().err
    assert (folder / "keep").is_dir() and link.is_symlink()
    assert not (tmp_path / "elsewhere.onnx").exists()
