"""``algo=vla_ppo``: PPO with a learned value and GAE on the group trainer's policies. Its
per-decision targets match a hand-worked example, per-token advantages weigh the clipped
surrogate as worked by hand, and real reach runs (a tiny MLP token policy) resume to the very
run an uninterrupted one gives, survive a kill, and give the same metrics whatever the rollout
backend, the number of workers and the rollout mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tasks
from harness import config as harness_config
from harness import trainers
from harness.algos.group.update import GroupTrainer, explained_variance
from harness.config import ConfigError
from harness.objectives import policy_loss
from harness.policies import make
from harness_common.files import read_metrics

torch.set_num_threads(1)

FAST = [
    "task=reach", "task.obs_mode=state", "task.difficulty=0.3", "task.max_episode_steps=12",
    "policy=mlp", "policy.hidden=32", "algo=vla_ppo", "algo.group_size=4",
    "algo.num_start_states=3", "algo.learning_rate=3e-3", "algo.minibatch_size=6",
    "algo.iterations=3", "eval.every_steps=0", "eval.final_episodes=6", "logger=none",
]
OPERATIONAL = ("time/", "rollout/worker_restarts")  # wall clock and restarts differ by design


def _trainer(*overrides: str) -> GroupTrainer:
    cfg = harness_config.compose([*FAST, *overrides])
    torch.manual_seed(0)
    policy = make(cfg.policy,
                  tasks.make("reach", obs_mode="state").observation_space)
    return GroupTrainer(cfg, policy)


def test_decision_targets_match_the_hand_worked_example():
    """V = 0.5 everywhere (a value head of zero weights and bias 0.5), gamma = 0.9, lambda = 0.8.
    Attempt 0 (two decisions, reward 1): delta_1 = 1 - 0.5 = 0.5, delta_0 = 0.9 * 0.5 - 0.5 =
    -0.05, A_1 = 0.5, A_0 = -0.05 + 0.72 * 0.5 = 0.31; returns 0.81 and 1.0. Attempt 1 (one
    decision, reward 0): A = -0.5, return 0. Nothing follows an attempt's last decision."""
    trainer = _trainer("algo.gamma=0.9", "algo.gae_lambda=0.8", "algo.normalize_advantages=false")
    last = trainer.policy.value_head[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(0.5)
    obs = {"state": torch.randn(3, trainer.policy.obs_shapes["state"][0])}
    advantages, values, returns = trainer._decision_targets(obs, np.array([2, 1]),
                                                            torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(values, torch.full((3,), 0.5))
    torch.testing.assert_close(advantages, torch.tensor([0.31, 0.5, -0.5]))
    torch.testing.assert_close(returns, torch.tensor([0.81, 1.0, 0.0]))
    assert explained_variance(values, returns) == pytest.approx(
        1.0 - float((returns - values).var()) / float(returns.var()))
    normalized = _trainer()._decision_targets(obs, np.array([2, 1]), torch.tensor([1.0, 0.0]))
    assert float(normalized[0].mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(normalized[0].std()) == pytest.approx(1.0, abs=1e-5)


def test_per_token_advantages_weigh_the_clipped_surrogate_by_hand():
    """Two tokens with advantages +1 and -2; ratios e^0.1 (inside the clip) and e^0.5 (above
    1 + 0.2, but the advantage is negative, so the unclipped term is the smaller loss... of
    -min(rho A, clip(rho) A) = -(-2 e^0.5) = 2 e^0.5). Token mean: (-e^0.1 + 2 e^0.5) / 2."""
    logp = torch.tensor([[0.1, 0.5]])
    old = torch.zeros(1, 2)
    loss, stats = policy_loss(logp, old, torch.tensor([[1.0, -2.0]]), torch.ones(1, 2),
                              clip_low=0.2, aggregation="token_mean")
    expected = (-np.exp(0.1) + 2 * np.exp(0.5)) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert stats["clip_fraction"] == 0.0  # the clipped term was never the one chosen
    with pytest.raises(ValueError, match=r"one per token"):
        policy_loss(logp, old, torch.ones(1, 3), torch.ones(1, 2))


def test_bad_vla_ppo_settings_are_refused_by_name():
    for override, message in (("algo.gamma=1.5", "algo.gamma=1.5"),
                              ("algo.gae_lambda=-0.1", "algo.gae_lambda=-0.1"),
                              ("algo.vf_clip=0", "algo.vf_clip=0"),
                              ("algo.vf_coef=-1", "algo.vf_coef=-1"),
                              ("algo.critic.network=twin", "algo.critic.network='twin'"),
                              ("algo.critic=twin", "algo.critic is now algo.critic.network: "
                                                   "write algo.critic.network=twin")):
        with pytest.raises(ConfigError, match=message):
            harness_config.compose([*FAST, override])


def run(tmp_path, name: str, *overrides: str) -> dict[str, list]:
    config = harness_config.compose([*FAST, *overrides])
    summary = trainers.train(config, tmp_path / name)
    metrics = read_metrics(tmp_path / name / "metrics.csv")
    learned = {k: v for k, v in metrics.items() if not k.startswith(OPERATIONAL)}
    learned["final"] = [(0, summary["success_rate"]), (0, summary["env_steps"])]
    return learned


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run(tmp_path_factory.mktemp("one"), "run", "algo.workers=1",
               "algo.critic.network=separate")


def test_a_vla_ppo_run_learns_a_value_and_moves_the_policy(reference):
    for key in ("train/value_loss", "train/explained_variance", "train/grad_norm",
                "train/clip_fraction", "train/kl_to_reference"):
        assert key in reference, key
    assert all(np.isfinite(v) for _, v in reference["train/value_loss"])
    assert max(v for _, v in reference["train/kl_to_reference"]) > 0  # the policy moved


@pytest.mark.parametrize("overrides", [
    ("algo.workers=2",),
    ("algo.workers=2", "algo.rollout.mode=batched"),
])
def test_workers_and_rollout_modes_give_the_same_run(tmp_path, reference, overrides):
    assert run(tmp_path, "run", "algo.critic.network=separate", *overrides) == reference


@pytest.mark.ray
def test_ray_actors_give_the_same_run(tmp_path, reference, local_ray):
    assert run(tmp_path, "run", "algo.critic.network=separate", "algo.workers=2",
               "algo.rollout.backend=ray", "algo.rollout.mode=batched") == reference


def test_a_resumed_run_is_the_uninterrupted_run(tmp_path, reference):
    """Two iterations, then a resume to three: the separate critic, its optimiser state and
    the minibatch generator come back from the checkpoint."""
    run(tmp_path, "run", "algo.critic.network=separate", "algo.iterations=2")
    assert run(tmp_path, "run", "algo.critic.network=separate", "resume=true") == reference
