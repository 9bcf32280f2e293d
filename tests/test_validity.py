"""Results you can trust: no ground truth leaks into a learned verifier's run, every option is
honoured or refused, evaluation uses disjoint seed ranges, and the update's ratio starts at 1.

Each test here failed on the code before its fix (the leak, the ignored option, the shared
permutation...), on real environments and real (tiny) networks.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tasks
from harness import config as harness_config
from harness import trainers
from harness.config import ConfigError
from harness_common.files import read_metrics

FAST = [
    "task=reach", "task.obs_mode=state", "task.difficulty=0.1", "task.max_episode_steps=15",
    "policy=mlp", "policy.hidden=32", "algo=grpo", "algo.group_size=4", "algo.num_start_states=4",
    "algo.learning_rate=3e-3", "eval.every_steps=0", "eval.final_episodes=10", "eval.episodes=4",
    "logger.videos=false", "logger.tensorboard=false", "logger.progress_bar=false",
]


def compose(*overrides):
    return harness_config.compose([*FAST, *overrides])


def train(tmp_path, name, *overrides):
    config = compose(*overrides)
    return trainers.train(config, tmp_path / name), read_metrics(tmp_path / name / "metrics.csv")


@pytest.fixture(scope="module")
def random_cnn(tmp_path_factory):
    """Untrained CNN detectors for reach and for push on the front camera (16 px): real
    checkpoints, whose verdicts have nothing to do with the ground truth."""
    from success_detectors.cnn import CNNDetector, SuccessCNN
    from success_detectors.data import camera_mounts

    folder = tmp_path_factory.mktemp("cnn")
    torch.manual_seed(0)
    for task in ("reach", "push"):
        CNNDetector(SuccessCNN(), task=task, camera="front", image_size=16,
                    camera_mounts=camera_mounts(task, "front")).save(folder / f"{task}.pt")
    return folder


# ------------------------------------------------------------------- leaks and refusals
def test_learned_detector_with_terminate_on_success_is_refused_at_load(tmp_path):
    """The scripted check would choose the frame the CNN scores; refused before any file."""
    with pytest.raises(ConfigError, match="task.terminate_on_success"):
        compose("detector=cnn", f"detector.checkpoint={tmp_path / 'never_opened.pt'}")
    assert not list(tmp_path.iterdir())


def test_group_algorithms_refuse_a_dense_reward():
    with pytest.raises(ConfigError, match="reward='dense' with algo='grpo'"):
        compose("reward=dense")


@pytest.mark.parametrize("override", ["verifier.when=every_step", "verifier.mode=add"])
def test_group_algorithms_refuse_verifier_options_they_cannot_honour(override):
    with pytest.raises(ConfigError, match="these verifier options are SB3's"):
        compose(override)


def test_reward_auto_resolves_per_family():
    assert compose().reward == "verifier"
    assert harness_config.compose(["algo=ppo"]).reward == "dense"


def test_learned_detector_needs_a_verifier_reward(random_cnn):
    with pytest.raises(ConfigError, match="only read with reward=verifier"):
        harness_config.compose(["algo=ppo", "detector=cnn", "task.terminate_on_success=false",
                                f"detector.checkpoint={random_cnn / 'reach.pt'}"])


def test_group_run_refuses_a_detector_of_another_task(random_cnn):
    with pytest.raises(ConfigError, match="push"):
        compose("detector=cnn", f"detector.checkpoint={random_cnn / 'push.pt'}",
                "task.terminate_on_success=false")


def test_sb3_curriculum_learns_from_the_verifier_not_the_ground_truth(tmp_path, random_cnn):
    """With threshold 0 the CNN calls every episode a success while reach at difficulty 1 is
    nearly never solved by a fresh PPO policy: the curriculum must see only successes."""
    config = harness_config.compose([
        "task=reach", "task.max_episode_steps=10", "task.terminate_on_success=false",
        "algo=ppo", "algo.n_steps=64", "algo.batch_size=32", "algo.n_epochs=1",
        "policy.net_arch=[8]", "reward=verifier", "detector=cnn",
        f"detector.checkpoint={random_cnn / 'reach.pt'}", "detector.threshold=0.0",
        "total_timesteps=128", "eval.every_steps=0", "eval.final_episodes=2",
        "logger.videos=false", "logger.tensorboard=false", "logger.progress_bar=false",
    ])
    summary = trainers.train(config, tmp_path / "run")
    # SB3 runs have no start policy: their summary claims no gain over one
    assert not [key for key in summary if key.startswith(("improvement", "best_start", "start_"))]
    metadata = json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())
    table = metadata["trainer_state"]["curriculum"]["table"]
    truth = [value for _, value in read_metrics(tmp_path / "run" / "metrics.csv")[
        "detector/false_positive_rate"]]
    assert sum(table["samples"]) >= 10
    assert sum(table["failures"]) == 0.0 and sum(table["successes"]) > 0
    assert max(truth) > 0.5, "the ground truth must disagree for this test to mean anything"


# --------------------------------------------------------------------------- the update
def _rollout_and_trainer(*overrides):
    """A real rollout of 2 groups of 4 attempts on reach, and a trainer for it."""
    from harness.algos.group.update import GroupTrainer
    from harness.algos.rollout.pools import PerWorkerPool
    from harness.algos.rollout.records import EngineSpec, Job
    from harness.policies import make
    from harness.policies.saving import policy_record

    cfg = compose(*overrides)
    env = tasks.make("reach", obs_mode="state", max_episode_steps=15)
    torch.manual_seed(0)
    policy = make(cfg.policy, env.observation_space)
    jobs = []
    for group in range(2):
        env.reset(seed=100 + group, options={"difficulty": 0.1})
        jobs += [Job(env.snapshot(), group, 0.1)] * cfg.algo.group_size
    pool = PerWorkerPool(EngineSpec("reach", cfg.task.env_options(), policy_record(policy),
                                    len(jobs)), 1)
    rollout = pool.run(policy, jobs, cfg.algo.temperature, seed=0)
    pool.close()
    env.close()
    trainer = GroupTrainer(cfg, policy)
    trainer.max_tokens = 15 * policy.config.action_dim
    return rollout, trainer


def test_attempts_of_a_group_start_from_the_same_observation():
    rollout, _ = _rollout_and_trainer()
    first = rollout.obs["state"][rollout.starts]
    for group in range(2):
        rows = first[rollout.group == group]
        assert all(np.array_equal(row, rows[0]) for row in rows)
    assert not np.array_equal(first[0], first[-1])


def test_log_probs_are_those_of_the_sampling_temperature():
    """At T = 0.5 the sampled tokens follow softmax(logits / T); the trainer's old log-probs
    are those, and the first minibatch step sees a ratio of exactly 1."""
    from harness.policies import obs_to_batch

    rollout, trainer = _rollout_and_trainer("algo.temperature=0.5", "algo.num_iterations=1",
                                            "algo.minibatch_size=64")
    obs = obs_to_batch(rollout.obs, batched=True)
    tokens = torch.as_tensor(rollout.decisions)
    with torch.no_grad():
        logits = trainer.policy.head.logits(trainer.policy.features(obs))
        expected = torch.log_softmax(logits / 0.5, dim=-1).gather(
            -1, tokens.unsqueeze(-1)).squeeze(-1)
        executed = torch.as_tensor(rollout.executed)
        assert torch.allclose(trainer._log_probs(trainer.policy, obs, tokens, executed), expected)
    rewards = np.array([1, 0, 0, 0, 1, 1, 0, 0], dtype=np.float32)
    advantages = trainer.advantages(rollout, rewards)
    metrics = trainer.update(rollout, rewards, advantages, np.ones(2, dtype=bool))
    assert metrics["train/gradient_steps"] == 1.0
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["train/clip_fraction"] == 0.0


def test_sampling_at_a_temperature_matches_its_log_probs():
    """4,000 tokens sampled at T = 0.5 from one observation: each bin's frequency matches
    exp(log_prob(..., temperature=0.5))."""
    from harness.policies import make, obs_to_batch
    from harness.policies.mlp import MLPConfig

    env = tasks.make("reach")
    torch.manual_seed(1)
    policy = make(MLPConfig(use_instruction=True, hidden=16,
                            head={"name": "tokens", "num_bins": 5}), env.observation_space)
    obs = obs_to_batch([env.reset(seed=3)[0]] * 4000)
    tokens, _ = policy.act(obs, temperature=0.5)
    one, dims = {k: v[:1] for k, v in obs.items()}, policy.config.action_dim
    with torch.no_grad():
        expected = torch.stack([policy.log_prob(one, torch.full((1, dims), b), 0.5).exp()[0]
                                for b in range(5)], dim=1)  # (action_dim, bins)
    observed = torch.stack([torch.bincount(tokens[:, d], minlength=5) / 4000.0
                            for d in range(dims)])
    assert torch.allclose(observed, expected, atol=0.03)
    with torch.no_grad():
        logits = policy.head.logits(policy.features(one))
    assert not torch.allclose(expected, torch.softmax(logits[0], -1), atol=0.03)


@pytest.mark.parametrize(("algo", "rewards", "signal"), [
    ("grpo", [0, 0, 0, 0, 1, 1, 1, 1], [False, False]),
    ("rloo", [0, 1, 0, 0, 1, 1, 1, 1], [True, False]),
    ("reinforce", [0, 0, 0, 0, 1, 1, 1, 1], [False, True]),  # r itself: successes move it
])
def test_zero_signal_is_the_estimators_own(algo, rewards, signal):
    rollout, trainer = _rollout_and_trainer(f"algo={algo}")
    advantages = trainer.advantages(rollout, np.array(rewards, dtype=np.float32))
    assert trainer.group_has_signal(advantages).tolist() == signal


@pytest.fixture(scope="module")
def cloned_policy(tmp_path_factory):
    """An MLP token policy cloned on 20 expert demos of reach at difficulty 0: it succeeds
    often enough that some groups are all successes."""
    from harness.demos import collect_demos, load_demos
    from harness.policies import make, save_policy
    from harness.policies.mlp import MLPConfig
    from harness.start_policy.bc import pretrain_bc

    folder = tmp_path_factory.mktemp("bc")
    collect_demos(folder / "demos.hdf5", "reach", 20, obs_mode="state", difficulty=0.0,
                  max_episode_steps=15, progress=False)
    torch.manual_seed(0)
    policy = make(MLPConfig(use_instruction=True, hidden=32),
                  tasks.make("reach", max_episode_steps=15).observation_space)
    pretrain_bc(policy, load_demos(folder / "demos.hdf5"), epochs=300, lr=3e-3, seed=0,
                progress=False)
    save_policy(folder / "bc.pt", policy)
    return folder / "bc.pt"


def test_drop_keeps_all_success_groups_for_reinforce(tmp_path, cloned_policy):
    """REINFORCE's advantage is r: an all-success group pushes the policy, so ``drop`` must
    keep it (the all-equal rule dropped every such group); all-failed groups are dropped."""
    _, metrics = train(tmp_path, "run", "algo=reinforce", "algo.zero_signal=drop",
                       "algo.iterations=3", "task.difficulty=0.0", "seed=1",
                       f"algo.start_policy.file={cloned_policy}")
    success = np.array([v for _, v in metrics["rollout/success_rate"]])
    signal = np.array([v for _, v in metrics["rollout/signal_fraction"]])
    mixed = np.array([v for _, v in metrics["rollout/mixed_outcome_fraction"]])
    updated = np.array([v for _, v in metrics["train/updated_attempts"]])
    assert (signal > mixed).any(), "some group should be all successes"
    assert np.array_equal(updated, signal * 4 * 4)  # B = 4 groups of G = 4, signal ones kept
    assert success.max() > 0.2


def test_drop_divides_by_the_kept_attempts_only():
    """An update on [informative group, all-failed group] with ``drop`` is the update on the
    informative group alone: the dropped group is neither in the numerator nor the divisor
    (with ``keep`` it dilutes the step)."""
    from harness.algos.rollout.core import RolloutBatch

    def sub(batch: RolloutBatch, group: int) -> RolloutBatch:
        attempts = np.flatnonzero(batch.group == group)
        rows = np.concatenate([np.arange(batch.starts[a], batch.starts[a]
                                         + batch.decision_counts[a]) for a in attempts])
        return RolloutBatch({k: v[rows] for k, v in batch.obs.items()}, batch.decisions[rows],
                            batch.executed[rows], batch.decision_counts[attempts],
                            batch.lengths[attempts], batch.success[attempts], None,
                            batch.group[attempts], batch.difficulty[attempts], batch.timing)

    rewards = np.array([1, 0, 1, 0, 0, 0, 0, 0], dtype=np.float32)
    after = {}
    for name, keep in (("drop", [True, False]), ("keep", [True, True]), ("alone", None)):
        rollout, trainer = _rollout_and_trainer("algo.num_iterations=1",
                                                "algo.minibatch_size=64")
        batch, r = (sub(rollout, 0), rewards[:4]) if keep is None else (rollout, rewards)
        trainer.update(batch, r, trainer.advantages(batch, r),
                       np.array(keep if keep is not None else [True]))
        after[name] = torch.cat([p.detach().flatten() for p in trainer.policy.parameters()])
    assert torch.equal(after["drop"], after["alone"])
    assert not torch.equal(after["keep"], after["alone"])


def test_minibatch_order_changes_between_iterations_and_resumes():
    """One generator for the run: each draw gives a new order, and a checkpoint restores it."""
    _, trainer = _rollout_and_trainer()
    first, second = (trainer.generator.permutation(16).tolist() for _ in range(2))
    assert first != second
    _, resumed = _rollout_and_trainer()
    resumed.load_state_dict(trainer.state_dict())
    assert resumed.generator.permutation(16).tolist() == trainer.generator.permutation(16).tolist()


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "rloo", "critic", "reinforce", "vla_ppo"])
def test_shipped_group_configs_take_several_steps_per_batch(algo):
    cfg = harness_config.compose([f"algo={algo}"])
    attempts = cfg.algo.num_start_states * cfg.algo.group_size
    assert cfg.algo.num_iterations * -(-attempts // cfg.algo.minibatch_size) > 1


# ---------------------------------------------------------------- curriculum and seeds
def test_success_band_takes_its_group_size_from_the_algorithm():
    config = compose("curriculum=success_band", "algo.group_size=5")
    assert config.curriculum_params()["group_size"] == 5
    with pytest.raises(Exception, match="group_size"):
        compose("curriculum=success_band", "curriculum.group_size=8")


@pytest.fixture(scope="module")
def saved_start_policy(tmp_path_factory):
    """A real start policy file for ``algo.start_policy.file``: a fresh MLP token policy of
    reach."""
    from harness.policies import make, save_policy
    from harness.policies.mlp import MLPConfig

    path = tmp_path_factory.mktemp("start") / "start_policy.pt"
    torch.manual_seed(0)
    save_policy(path, make(MLPConfig(use_instruction=True, hidden=8),
                           tasks.make("reach", obs_mode="state").observation_space))
    return path


PIXEL_START = ["task.obs_mode=pixels_state", "algo.start_policy.state_pretrain.episodes=5"]


@pytest.mark.parametrize("with_init_policy", [False, True])
@pytest.mark.parametrize("overrides,named", [
    (["eval.validation_seed=4000000005"], ("test", "validation")),    # inside the test range
    (["eval.seed=5000003"], ("demo", "test")),                        # inside the BC demos
    (["eval.validation_seed=5000003"], ("demo", "validation")),
    (["algo.start_policy.bc.demos=0", "algo.starts.source=demo", "algo.starts.demos=20",
      "eval.seed=5000150"],
     ("start_demo", "test")),                                         # inside the demo starts'
    (["algo.start_policy.bc.demos=0", "algo.starts.source=demo", "eval.validation_seed=5000000"],
     ("validation", "start_demo")),
    ([*PIXEL_START, "eval.seed=3000004"], ("state_pretrain", "test")),  # pretraining episodes
    ([*PIXEL_START, "eval.validation_seed=2999999"], ("validation", "state_pretrain")),
    (["seed=0", "eval.seed=10000010"], ("train", "test")),            # inside the training starts
])
def test_overlapping_seed_ranges_are_refused(overrides, named, with_init_policy,
                                             saved_start_policy):
    """Validation, test, BC demos, demo starts' demos and state pretraining never share a seed
    with a held-out range, whether the start is cloned here or loaded by ``algo.start_policy.file``
    (whose ``bc_*`` options say how it was cloned)."""
    init = [f"algo.start_policy.file={saved_start_policy}"] if with_init_policy else []
    first, second = named
    with pytest.raises(ConfigError, match=rf"seed ranges overlap: {first} plays reset seeds "
                                          rf"\[\d+, \d+\) \(first, stop\) and {second} plays"):
        compose("algo.start_policy.bc.demos=2", *overrides, *init)


def test_training_ranges_may_share_seeds_and_every_used_range_is_listed(saved_start_policy):
    """BC demos and the demos of demo starts are both recorded from the run's demo seed:
    training data on both sides, so they may share seeds; the ranges a run plays are all
    listed."""
    config = compose("algo.start_policy.bc.demos=20", "algo.starts.source=demo",
                     "algo.starts.demos=20",
                     f"algo.start_policy.file={saved_start_policy}")
    ranges = config.seed_ranges()
    assert ranges["demo"] == [5_000_000, 5_000_200] == ranges["start_demo"]
    assert ranges["validation"] == [2_000_000, 2_000_004]  # the start's decoding is chosen there
    assert "start_demo" not in compose("algo.starts.source=reset").seed_ranges()
    pixels = compose("algo.start_policy.bc.demos=2", *PIXEL_START).seed_ranges()
    assert pixels["state_pretrain"] == [3_000_000, 3_000_005]


def test_seeds_differ_in_their_demonstrations_and_demo_seed_overrides(saved_start_policy):
    """Run seed s records its demos from s * 10^7 + 5 * 10^6, so the seeds of a sweep clone on
    different demonstrations; ``algo.demo_seed`` names the first seed instead, and its range is
    checked like any other."""
    first = {seed: compose("algo.start_policy.bc.demos=20", f"seed={seed}").seed_ranges()["demo"]
             for seed in (0, 1, 4)}
    assert first == {0: [5_000_000, 5_000_200], 1: [15_000_000, 15_000_200],
                     4: [45_000_000, 45_000_200]}
    assert compose("algo.start_policy.bc.demos=20",
                   "algo.demo_seed=0").seed_ranges()["demo"] == [0, 200]
    with pytest.raises(ConfigError,
                       match=r"seed ranges overlap: demo plays .* and validation plays"):
        compose("algo.start_policy.bc.demos=20", "algo.demo_seed=1999990",
                f"algo.start_policy.file={saved_start_policy}")
    with pytest.raises(ConfigError, match=r"algo.demo_seed=-1; must be >= 0"):
        compose("algo.demo_seed=-1")


def test_summary_reports_seed_ranges_paired_statistics_and_both_decodings(tmp_path):
    summary, metrics = train(tmp_path, "run", "algo.iterations=2", "eval.every_steps=100")
    ranges = summary["seed_ranges"]
    assert ranges["test"] == [4_000_000_000, 4_000_000_010]
    assert ranges["validation"] == [2_000_000, 2_000_004]
    assert summary["improvement"] == pytest.approx(
        summary["success_rate"] - summary["start_success_rate"])
    low, high = summary["improvement_interval"]
    assert low <= summary["improvement"] <= high
    assert 0.0 <= summary["improvement_p_value"] <= 1.0
    assert 0.0 <= summary["sampled_success_rate"] <= 1.0
    assert summary["time_limit_reached"] is False and summary["iterations"] == 2
    assert summary["device"] == "cpu"
    best = json.loads((tmp_path / "run" / "checkpoints" / "best.json").read_text())
    assert "validation_success_rate" in best
    assert "final_sampled/success_rate" in metrics and "start_sampled/success_rate" in metrics
    # the start's better decoding is chosen on the validation seeds, then paired on the test
    validation = {decoding: metrics[f"start_validation{suffix}/success_rate"][0][1]
                  for decoding, suffix in (("greedy", ""), ("sampled", "_sampled"))}
    assert summary["best_start_decoding"] == (
        "sampled" if validation["sampled"] > validation["greedy"] else "greedy")
    assert summary["start_validation_success_rate"] == validation["greedy"]
    start = {"greedy": summary["start_success_rate"],
             "sampled": summary["start_sampled_success_rate"]}[summary["best_start_decoding"]]
    assert summary["improvement_vs_best_start"] == pytest.approx(summary["success_rate"] - start)
    low, high = summary["improvement_vs_best_start_interval"]
    assert low <= summary["improvement_vs_best_start"] <= high
    assert 0.0 <= summary["improvement_vs_best_start_p_value"] <= 1.0


def test_the_start_decoding_is_chosen_on_validation_and_paired_on_test():
    """The sampled start is the baseline only when it beats greedy on the validation seeds;
    the gain pairs the final greedy outcomes with that decoding's test outcomes."""
    from harness.algos.group.summary import StartBaseline, paired_gains
    from harness.evaluation import Episode, EvaluationResult

    def result(successes):
        return EvaluationResult([Episode(difficulty=1.0, seed=seed, success=success, length=10,
                                         episode_return=float(success))
                                 for seed, success in enumerate(successes)])

    baseline = StartBaseline()
    baseline.choose_decoding(result([True, False, False]), result([True, True, False]))
    baseline.keep_test(result([False, False, True, False]), result([True, True, False, False]))
    gains = baseline.gains(result([True, True, True, False]))
    assert gains["best_start_decoding"] == "sampled"
    assert gains["improvement"] == 0.5 and gains["improvement_vs_best_start"] == 0.25
    assert gains["discordant_vs_best_start"] == {"before_only": 0, "after_only": 1}
    assert gains["start_validation_sampled_success_rate"] == pytest.approx(2 / 3)
    tie = StartBaseline()
    tie.choose_decoding(result([True, False]), result([False, True]))
    assert tie.decoding == "greedy"  # a tie keeps the decoding of the reported figure
    greedy_only = paired_gains([True, False], {"greedy": [False, False]}, None)
    assert "improvement_vs_best_start" not in greedy_only and greedy_only["improvement"] == 0.5
    assert paired_gains([True], {"greedy": [True, False]}, "greedy") == {}  # no pairs
    with pytest.raises(ValueError, match="decoding='beam'"):
        paired_gains([True], {"greedy": [True]}, "beam")


def test_periodic_evaluations_play_the_validation_seeds(tmp_path, monkeypatch):
    import harness.algos.group.run as group

    seeds = []
    real = group.evaluate

    def spy(policy_fn, env_factory, episodes, difficulties, seed, *rest):
        seeds.append((seed, episodes))
        return real(policy_fn, env_factory, episodes, difficulties, seed, *rest)

    real_pooled = group.evaluate_in_pool

    def spy_pooled(pool, policy, env, episodes, difficulties, seed, *rest):  # the greedy ones
        seeds.append((seed, episodes))
        return real_pooled(pool, policy, env, episodes, difficulties, seed, *rest)

    monkeypatch.setattr(group, "evaluate", spy)
    monkeypatch.setattr(group, "evaluate_in_pool", spy_pooled)
    train(tmp_path, "run", "algo.iterations=2", "eval.every_steps=50")
    periodic = [seed for seed, episodes in seeds if episodes == 4]
    final = [seed for seed, episodes in seeds if episodes == 10]
    assert periodic and set(periodic) == {2_000_000}
    assert final and set(final) == {4_000_000_000}


def _short_attempts_long_evaluations(tmp_path, *overrides):
    # reach at difficulty 1 with 3 attempt steps and 9 evaluation steps: nothing succeeds that
    # fast, so every evaluation episode runs to its limit
    summary, metrics = train(tmp_path, "run", "task.difficulty=1.0", "task.max_episode_steps=3",
                             "eval.max_episode_steps=9", "algo.iterations=1", *overrides)
    assert summary["mean_episode_length"] == 9
    assert metrics["start/mean_length"][0][1] == 9
    assert metrics["final_sampled/mean_length"][0][1] == 9  # sampled, in this process
    assert metrics["rollout/mean_length_steps"][0][1] == 3


@pytest.mark.ray
def test_ray_actors_evaluate_with_the_evaluation_step_limit(tmp_path, local_ray):
    """The greedy evaluations in Ray actors play eval.max_episode_steps, the attempts the
    task's limit, as in the process pool."""
    _short_attempts_long_evaluations(tmp_path, "algo.rollout.backend=ray", "algo.workers=2",
                                     "algo.rollout.mode=per_worker")


@pytest.mark.parametrize("mode", ["per_worker", "batched"])
def test_evaluation_plays_its_own_step_limit_and_training_keeps_the_tasks(tmp_path, mode):
    from harness.checkpoints import evaluate_checkpoint

    _short_attempts_long_evaluations(tmp_path, f"algo.rollout.mode={mode}")
    metadata = json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())
    assert metadata["evaluation"]["max_episode_steps"] == 9
    result, _ = evaluate_checkpoint(tmp_path / "run" / "checkpoints" / "latest.json", 2)
    assert [e.length for e in result.episodes] == [9, 9]  # the run's limit, by default
    for limit in (4, 12):  # task.max_episode_steps replaces the run's evaluation limit
        result, _ = evaluate_checkpoint(tmp_path / "run" / "checkpoints" / "latest.json", 2,
                                        task_overrides={"max_episode_steps": limit})
        assert [e.length for e in result.episodes] == [limit, limit]
    with pytest.raises(ConfigError, match=r"eval.max_episode_steps=0; must be >= 1 or null"):
        compose("eval.max_episode_steps=0")


def test_time_guard_is_recorded(tmp_path):
    summary, _ = train(tmp_path, "run", "algo.iterations=1000", "max_minutes=0.0001")
    assert summary["time_limit_reached"] is True and summary["iterations"] < 1000


def test_device_auto_trains_and_checkpoints_load_on_the_cpu(tmp_path):
    from harness.checkpoints import evaluate_checkpoint

    summary, _ = train(tmp_path, "run", "algo.iterations=1", "device=auto")
    assert summary["device"] == "cpu"  # this machine has no accelerator
    result, _ = evaluate_checkpoint(tmp_path / "run", episodes=3, device="auto")
    assert len(result.episodes) == 3
