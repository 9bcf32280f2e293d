"""End-to-end tests of the group-relative fine-tuner in the training app (real envs, real nets)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from harness import config as harness_config
from harness import trainers
from harness_common.files import read_metrics

FAST = [
    "task=reach", "task.obs_mode=state", "task.difficulty=0.1", "task.max_episode_steps=25",
    "policy=mlp", "policy.hidden=32", "algo=grpo", "algo.group_size=6", "algo.num_start_states=6",
    "algo.learning_rate=3e-3", "algo.num_iterations=2", "algo.minibatch_size=36",
    "eval.every_steps=0", "eval.final_episodes=20", "eval.episodes=5", "logger.videos=false",
    "logger.tensorboard=false", "logger.progress_bar=false",
]


# For runs whose checks read no final-evaluation figure: 2 final episodes instead of FAST's 20
# (the learning, saved-start and checkpoint tests compare or read theirs, and keep 20).
FEW_FINAL = "eval.final_episodes=2"


def train(tmp_path, name, *overrides):
    config = harness_config.compose([*FAST, *overrides])
    return trainers.train(config, tmp_path / name), read_metrics(tmp_path / name / "metrics.csv")


@pytest.fixture(scope="module")
def weak_bc_policy(tmp_path_factory):
    """An MLP token policy cloned from 30 expert demos at difficulty 1 for 120 epochs: weak, not
    hopeless (its sampled attempts succeed about half the time there)."""
    import tasks
    from harness.demos import collect_demos, load_demos
    from harness.policies import make, save_policy
    from harness.policies.mlp import MLPConfig
    from harness.start_policy.bc import pretrain_bc

    folder = tmp_path_factory.mktemp("bc")
    collect_demos(folder / "demos.hdf5", "reach", 30, obs_mode="state", difficulty=1.0,
                  max_episode_steps=25, progress=False)
    env = tasks.make("reach", max_episode_steps=25)
    torch.manual_seed(0)  # the weights must not depend on which tests ran before
    policy = make(MLPConfig(use_instruction=True, hidden=32), env.observation_space)
    pretrain_bc(policy, load_demos(folder / "demos.hdf5"), epochs=120, lr=3e-3, seed=0,
                progress=False)
    save_policy(folder / "bc.pt", policy)
    return folder / "bc.pt"


def test_fine_tuning_raises_success_from_a_weak_start(tmp_path, weak_bc_policy):
    summary, metrics = train(tmp_path, "run", "algo.iterations=60", "task.difficulty=1.0",
                             f"algo.start_policy.file={weak_bc_policy}")
    success = [value for _, value in metrics["rollout/success_rate"]]
    # 180 attempts at first, 360 at the end: a window of five iterations swings by 0.1 or more
    # from one to the next (0.54 -> 0.62 after 40 iterations on one processor, 0.86 after 80)
    early, late = np.mean(success[:5]), np.mean(success[-10:])
    assert early < 0.7, f"the fresh policy should start weak, got {early:.2f}"
    assert late >= early + 0.15, f"success went {early:.2f} -> {late:.2f}"
    for key in ("rollout/zero_signal_fraction", "train/clip_fraction", "train/approx_kl",
                "train/kl_to_reference", "train/entropy", "rollout/mean_length_tokens",
                "time/rollout_s", "time/update_s", "curriculum/signal_fraction"):
        assert key in metrics, key
    assert summary["success_rate"] >= 0.0 and summary["env_steps"] > 0


def test_same_seed_gives_the_same_metrics(tmp_path):
    _, first = train(tmp_path, "a", "algo.iterations=2", "algo=dr_grpo", FEW_FINAL)
    _, second = train(tmp_path, "b", "algo.iterations=2", "algo=dr_grpo", FEW_FINAL)
    for key in first:
        if not key.startswith("time/"):
            assert first[key] == second[key], key


@pytest.mark.parametrize("algo", ["rloo", "critic", "reinforce"])
def test_every_estimator_updates_the_policy_and_checkpoints(tmp_path, algo, weak_bc_policy):
    """From a start that succeeds sometimes, each estimator takes gradient steps that move the
    policy away from its (frozen) reference, and the checkpoint holds both."""
    extra = ["algo.beta=0.05", "algo.zero_signal=resample"] if algo == "critic" else []
    summary, metrics = train(tmp_path, algo, f"algo={algo}", "algo.iterations=2",
                             f"algo.start_policy.file={weak_bc_policy}", FEW_FINAL, *extra)
    state = torch.load(tmp_path / algo / "checkpoints" / "latest.pt", weights_only=True)
    tuned, start = state["trainer"]["policy"], state["trainer"]["reference"]
    assert any(not torch.equal(tuned[k], start[k]) for k in tuned), "the policy never moved"
    assert sum(v for _, v in metrics["train/gradient_steps"]) > 0
    assert json.loads((tmp_path / algo / "summary.json").read_text())["algo"] == algo
    if algo == "critic":
        assert "train/value_loss" in metrics


def test_a_run_started_from_the_saved_start_policy_plays_the_same_run(tmp_path, monkeypatch):
    """A cloned start is kept as ``start_policy.pt``; an ablation arm that loads it through
    ``algo.start_policy.file`` skips the cloning and plays exactly the run that wrote it."""
    monkeypatch.chdir(tmp_path)  # the demo cache (HARNESS_DATA) lands here
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    cloned, first = train(tmp_path, "cloned", "algo.iterations=2", "algo.start_policy.bc.demos=10",
                          "algo.start_policy.bc.epochs=100")
    saved = tmp_path / "cloned" / "start_policy.pt"
    assert cloned["start_policy"] == str(saved) and saved.is_file()
    reused, second = train(tmp_path, "reused", "algo.iterations=2",
                           f"algo.start_policy.file={saved}")
    assert reused["start_policy"] == str(saved)
    assert not (tmp_path / "reused" / "start_policy.pt").exists()
    assert "bc/train_loss" in first and "bc/train_loss" not in second  # no second cloning
    assert sum(v for _, v in first["train/gradient_steps"]) > 0  # the policy did move
    assert cloned["start_success_rate"] > 0  # a start that succeeds sometimes, not all zeros
    for key in ("start_success_rate", "success_rate", "sampled_success_rate", "env_steps"):
        assert reused[key] == cloned[key], key
    assert reused["improvement"] == cloned["improvement"]
    for key in second:
        if not key.startswith("time/"):
            assert second[key] == first[key], key


def test_resume_continues_the_iteration_count(tmp_path):
    train(tmp_path, "run", "algo.iterations=2", FEW_FINAL)
    first = json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())
    summary, _ = train(tmp_path, "run", "algo.iterations=4", "resume=true", FEW_FINAL)
    latest = json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())
    assert first["iteration"] == 2 and latest["iteration"] == 4
    assert summary["iterations"] == 4 and latest["num_timesteps"] > first["num_timesteps"]


def test_group_size_one_is_refused_for_group_estimators(tmp_path):
    with pytest.raises(ValueError, match="group_size=1"):
        train(tmp_path, "bad", "algo.group_size=1", "algo.iterations=1")


def test_init_policy_of_another_observation_shape_is_refused(tmp_path):
    import tasks
    from harness.policies import make, save_policy
    from harness.policies.mlp import MLPConfig

    other = make(MLPConfig(use_instruction=True, hidden=32), tasks.make("push").observation_space)
    save_policy(tmp_path / "push_policy.pt", other)
    with pytest.raises(ValueError, match="shape|match"):
        train(tmp_path, "bad", f"algo.start_policy.file={tmp_path / 'push_policy.pt'}",
              "algo.iterations=1")


def test_main_job_runs_end_to_end_on_a_tiny_budget(tmp_path, monkeypatch, capsys):
    """``scripts/main.py``: demos -> state pretraining -> BC -> GRPO -> before/after summary."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("main_script", root / "scripts/main.py")
    main_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main_script)
    monkeypatch.chdir(tmp_path)  # the demo cache (HARNESS_DATA) lands here
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    main_script.main([
        "hydra.run.dir=run", "hydra/job_logging=none", "hydra/hydra_logging=none",
        "task=reach", "task.image_size=32",
        "task.max_episode_steps=10", "algo.start_policy.bc.demos=2",
        "algo.start_policy.bc.epochs=2",
        "algo.start_policy.state_pretrain.episodes=3", "algo.start_policy.state_pretrain.epochs=1",
        "algo.num_start_states=2", "algo.group_size=2", "algo.workers=1",
        "algo.minibatch_size=4", "policy.hidden=16", "policy.conv_channels=[4,4]",
        "algo.iterations=1", "eval.final_episodes=3", "eval.episodes=4", "logger.videos=false",
        "logger.tensorboard=false", "logger.progress_bar=false", "torch_threads=1",
    ])
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in ("bc_success", "final_success", "bc_success_interval", "pretrain/val_r2",
                "improvement", "improvement_interval", "improvement_p_value",
                "improvement_vs_best_start", "improvement_vs_best_start_interval",
                "improvement_vs_best_start_p_value", "best_start_decoding",
                "sampled_success_rate", "time_limit_reached", "main_job_wall_clock_s"):
        assert key in written
    assert written["bc_success"] == written["start_success_rate"]
    assert written["final_success"] == written["success_rate"]
    assert written["improvement"] == pytest.approx(written["final_success"]
                                                   - written["bc_success"])
    assert 0.0 <= written["bc_success"] <= 1.0 and 0.0 <= written["final_success"] <= 1.0
    assert written["pretrain/frames"] > 0
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 0
    assert not (tmp_path / "run" / "videos").exists()  # logger.videos=false: no empty folder
    assert (tmp_path / "run" / ".hydra" / "overrides.yaml").exists()
    assert list((tmp_path / "data" / "demos").glob("reach_*_n2*.hdf5"))
    printed = capsys.readouterr().out
    assert "| BC (2 demos) |" in printed and "run dir run;" in printed
    decoding = written["best_start_decoding"]
    assert ("gain over BC greedy: " in printed) == (decoding == "sampled")
    chosen = f"gain over BC {decoding}, its better decoding (greedy "
    assert chosen in printed and "on 4 validation episodes): " in printed
    assert f"{written['improvement_vs_best_start'] * 100:+.0f} points" in printed


def test_checkpoint_evaluates_the_fine_tuned_and_the_start_policy(tmp_path, weak_bc_policy):
    """Greedy evaluation of the last checkpoint reproduces the run's final and start figures;
    sampled evaluation is seeded, so it repeats exactly."""
    from harness.checkpoints import evaluate_checkpoint

    summary, _ = train(tmp_path, "run", "algo.iterations=3",
                       f"algo.start_policy.file={weak_bc_policy}")
    latest = tmp_path / "run" / "checkpoints" / "latest.pt"
    final, _ = evaluate_checkpoint(latest, episodes=20)
    start, _ = evaluate_checkpoint(latest, episodes=20, reference=True)
    assert final.success_rate == summary["success_rate"]
    assert start.success_rate == summary["start_success_rate"]
    sampled, _ = evaluate_checkpoint(latest, episodes=10, sampled=True)
    again, _ = evaluate_checkpoint(latest, episodes=10, sampled=True)
    assert [e.success for e in sampled.episodes] == [e.success for e in again.episodes]
    assert [e.length for e in sampled.episodes] == [e.length for e in again.episodes]


@pytest.mark.parametrize("options,workers", [
    ({"obs_mode": "state", "max_episode_steps": 25}, 2),
    ({"obs_mode": "state", "max_episode_steps": 25, "imperfections": {
        "action_noise": 0.2, "action_latency": 1, "observation_noise": 0.01}}, 1),
    ({"obs_mode": "pixels", "image_size": 32, "max_episode_steps": 12}, 2),
])
def test_greedy_evaluation_in_the_pool_plays_the_episodes_of_the_sequential_one(
        options, workers, weak_bc_policy):
    """The run's greedy evaluations go through the rollout pool: per episode the same start,
    success, length and return as :func:`harness.evaluation.evaluate` one episode at a time,
    imperfection noise included, at two difficulties."""
    import tasks
    from harness.algos.group.checkpoints import policy_fn
    from harness.algos.group.collect import evaluate_in_pool
    from harness.algos.rollout.pools import make_pool
    from harness.algos.rollout.records import EngineSpec, Job
    from harness.evaluation import evaluate
    from harness.policies import load_policy, make
    from harness.policies.saving import policy_record
    from harness.policies.tiny_vla import TinyVLAConfig

    env = tasks.make("reach", **options)
    if options["obs_mode"] == "state":
        policy = load_policy(weak_bc_policy)
    else:
        torch.manual_seed(0)
        policy = make(TinyVLAConfig(hidden=16, conv_channels=(4, 4)),
                      env.observation_space)
    policy.eval()
    difficulties = [0.1, 0.6]
    sequential = evaluate(policy_fn(policy), lambda: tasks.make("reach", **options), 12,
                          difficulties, seed=500)
    config = harness_config.compose([*FAST, f"algo.workers={workers}"])
    with make_pool(config.algo.rollout, workers,
                   EngineSpec("reach", options, policy_record(policy), 7)) as pool:
        pooled = evaluate_in_pool(pool, policy, env, 12, difficulties, seed=500)
        env.reset(seed=500, options={"difficulty": 0.1})
        greedy = pool.run(policy, [Job(env.unwrapped.snapshot(), 0, 0.1)] * 3, 0.0, seed=0)
    env.close()
    assert greedy.obs == {} and len(greedy.returns) == 3, "a greedy call keeps no frames"
    assert [(e.difficulty, e.seed) for e in pooled.episodes] == [
        (e.difficulty, e.seed) for e in sequential.episodes]
    assert [e.success for e in pooled.episodes] == [e.success for e in sequential.episodes]
    assert [e.length for e in pooled.episodes] == [e.length for e in sequential.episodes]
    assert [e.episode_return for e in pooled.episodes] == pytest.approx(
        [e.episode_return for e in sequential.episodes], rel=1e-12)
    assert len({round(e.episode_return, 6) for e in pooled.episodes}) > 1, "episodes differ"


def test_evaluation_in_the_pool_refuses_an_empty_request(weak_bc_policy):
    import tasks
    from harness.algos.group.collect import evaluate_in_pool
    from harness.policies import load_policy

    env = tasks.make("reach", obs_mode="state")
    with pytest.raises(ValueError, match="episodes=0"):
        evaluate_in_pool(None, load_policy(weak_bc_policy), env, 0, [0.1], seed=0)
    with pytest.raises(ValueError, match="difficulties is empty"):
        evaluate_in_pool(None, load_policy(weak_bc_policy), env, 3, [], seed=0)
    env.close()


PIXELS = [
    "task.obs_mode=pixels", "task.image_size=32", "task.max_episode_steps=10", "policy=tiny_vla",
    "policy.hidden=16", "policy.conv_channels=[4,4]", "algo.minibatch_size=12",
    "algo.iterations=2", "torch_threads=1",
]


def test_frozen_encoder_trains_only_what_reads_the_image_features(tmp_path):
    """``algo.freeze_encoder``: the encoder ends as it started, the rest moves, and the cached
    features give the very log-probabilities the pixels give."""
    import tasks
    from harness.algos.group.checkpoints import policy_from_state
    from harness.policies import obs_to_batch

    # critic: r - V(s0) moves the policy even when every attempt of a fresh policy fails
    train(tmp_path, "frozen", *PIXELS, "algo=critic", "algo.zero_signal=keep",
          "algo.freeze_encoder=true", FEW_FINAL)
    state = torch.load(tmp_path / "frozen" / "checkpoints" / "latest.pt", weights_only=True)
    tuned, start = state["trainer"]["policy"], state["trainer"]["reference"]
    encoder = [k for k in tuned if k.startswith("image_encoder.")]
    assert encoder and all(torch.equal(tuned[k], start[k]) for k in encoder)
    moved = [k for k in tuned if k.startswith(("fusion.", "action_head."))
             and not torch.equal(tuned[k], start[k])]
    assert moved, "nothing but the encoder should be frozen"

    policy = policy_from_state(state).eval()
    env = tasks.make("reach", obs_mode="pixels", image_size=32)
    obs = obs_to_batch(env.reset(seed=0)[0])
    tokens = torch.tensor([[1, 2, 3, 4][: policy.config.action_dim]])
    with torch.no_grad():
        cached = {**{k: v for k, v in obs.items() if k != "pixels"},
                  "image_features": policy.encode_image(obs["pixels"])}
        assert torch.allclose(policy.log_prob(cached, tokens), policy.log_prob(obs, tokens))


def test_frozen_encoder_needs_an_image_policy(tmp_path):
    with pytest.raises(ValueError, match="freeze_encoder.*tiny_vla"):
        train(tmp_path, "bad", "algo.freeze_encoder=true", "algo.iterations=1")


def test_workers_send_the_frozen_encoders_features_and_the_update_is_the_same():
    """With the encoder frozen the rollout workers send the image features they sampled from
    instead of the frames: the same attempts, features equal to encoding the frames afterwards
    to the last bit, and the very same update."""
    import copy

    import tasks
    from harness.algos.group.update import GroupTrainer
    from harness.algos.rollout.engine import RolloutEngine
    from harness.algos.rollout.records import EngineSpec, Job
    from harness.policies import make
    from harness.policies.saving import policy_record

    config = harness_config.compose([*FAST, *PIXELS, "algo.freeze_encoder=true",
                                     "algo.group_size=4", "algo.num_start_states=3"])
    options = config.task.env_options()
    torch.manual_seed(0)
    env = tasks.make("reach", **options)
    policy = make(config.policy, env.observation_space)
    starts = tasks.make("reach", **{**options, "obs_mode": "state"})
    jobs = []
    for group in range(3):
        starts.reset(seed=group, options={"difficulty": 0.1})
        jobs += [Job(starts.snapshot(), group, 0.1)] * 4
    frames, features = (
        RolloutEngine(EngineSpec("reach", options, policy_record(policy), 5,
                                 image_features=keep)).run(
            policy.state_dict(), jobs, 1.0, seed=(7, 1))
        for keep in (False, True))
    assert np.array_equal(frames.decisions, features.decisions)
    assert np.array_equal(frames.lengths, features.lengths)
    assert np.array_equal(frames.success, features.success)
    assert "pixels" not in features.obs and set(frames.obs) - {"pixels"} < set(features.obs)
    with torch.no_grad():
        encoded = policy.encode_image(torch.as_tensor(frames.obs["pixels"])).numpy()
    assert np.array_equal(features.obs["image_features"], encoded)

    after = []
    for rollout in (frames, features):
        trainer = GroupTrainer(config, copy.deepcopy(policy))
        trainer.max_tokens = 10 * policy.config.action_dim
        rewards = (np.arange(len(jobs)) % 2).astype(np.float32)  # every group carries signal
        trainer.update(rollout, rewards, trainer.advantages(rollout, rewards),
                       np.ones(3, dtype=bool))
        after.append(trainer.policy.state_dict())
    assert all(torch.equal(after[0][k], after[1][k]) for k in after[0])
    assert any(not torch.equal(after[0][k], policy.state_dict()[k]) for k in after[0])


def test_resume_with_another_freeze_encoder_names_it(tmp_path):
    train(tmp_path, "run", *PIXELS, "algo.iterations=1", FEW_FINAL)
    with pytest.raises(ValueError, match="freeze_encoder"):
        train(tmp_path, "run", *PIXELS, "algo.freeze_encoder=true", "resume=true", FEW_FINAL)
