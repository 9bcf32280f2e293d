"""Oracle tests for harness.objectives against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from harness.objectives import (
    AGGREGATIONS,
    ESTIMATORS,
    aggregate_token_loss,
    gae,
    group_advantages,
    kl_k3,
    policy_loss,
    value_loss,
)

torch.set_num_threads(1)

ONE_RIGHT = torch.tensor([1.0, 0.0, 0.0, 0.0])


# --- group_advantages -------------------------------------------------------------------------


def test_grpo_one_right_of_four():
    # mean 0.25, population std sqrt(0.25 * 0.75) = 0.4330
    adv = group_advantages(ONE_RIGHT, group_size=4, estimator="grpo")
    assert adv[0].item() == pytest.approx(0.75 / math.sqrt(0.1875), rel=1e-5)
    assert adv[0].item() == pytest.approx(1.732, abs=1e-3)
    for wrong in adv[1:]:
        assert wrong.item() == pytest.approx(-0.577, abs=1e-3)


def test_dr_grpo_one_right_of_four():
    adv = group_advantages(ONE_RIGHT, group_size=4, estimator="dr_grpo")
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_rloo_one_right_of_four():
    adv = group_advantages(ONE_RIGHT, group_size=4, estimator="rloo")
    torch.testing.assert_close(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


def test_grpo_all_equal_group_gives_zero_not_nan():
    adv = group_advantages(torch.ones(4), group_size=4, estimator="grpo")
    torch.testing.assert_close(adv, torch.zeros(4))


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_groups_are_independent(estimator):
    second = torch.tensor([1.0, 1.0, 0.0, 0.0])
    both = group_advantages(torch.cat([ONE_RIGHT, second]), group_size=4, estimator=estimator)
    torch.testing.assert_close(both[:4], group_advantages(ONE_RIGHT, 4, estimator))
    torch.testing.assert_close(both[4:], group_advantages(second, 4, estimator))


def test_grpo_second_group_by_hand():
    # (1, 1, 0, 0): mean 0.5, population std 0.5
    adv = group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4, "grpo")
    torch.testing.assert_close(adv, torch.tensor([1.0, 1.0, -1.0, -1.0]), atol=1e-5, rtol=0)


def test_critic_subtracts_values():
    rewards = torch.tensor([1.0, 0.0, 0.5])
    values = torch.tensor([0.6, 0.2, 0.5])
    adv = group_advantages(rewards, group_size=1, estimator="critic", values=values)
    torch.testing.assert_close(adv, torch.tensor([0.4, -0.2, 0.0]))


def test_reinforce_is_the_reward():
    rewards = torch.tensor([1.0, 0.0, 2.0, 3.0])
    torch.testing.assert_close(group_advantages(rewards, 2, "reinforce"), rewards)
    torch.testing.assert_close(group_advantages(rewards, 1, "reinforce"), rewards)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_need_two_attempts(estimator):
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.ones(4), group_size=1, estimator=estimator)


def test_critic_without_values_raises():
    with pytest.raises(ValueError, match="values"):
        group_advantages(ONE_RIGHT, group_size=4, estimator="critic")


def test_critic_values_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape"):
        group_advantages(ONE_RIGHT, 4, "critic", values=torch.zeros(3))


def test_length_not_divisible_raises():
    with pytest.raises(ValueError, match="group_size=4"):
        group_advantages(torch.ones(6), group_size=4)


def test_unknown_estimator_lists_choices():
    with pytest.raises(ValueError, match="rloo"):
        group_advantages(ONE_RIGHT, 4, estimator="ppo")
    assert set(ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "critic", "reinforce"}


# --- kl_k3 ------------------------------------------------------------------------------------


def test_kl_k3_zero_at_equality():
    logp = torch.log(torch.rand(5, 7) + 0.01)
    torch.testing.assert_close(kl_k3(logp, logp), torch.zeros(5, 7))


def test_kl_k3_non_negative():
    generator = torch.Generator().manual_seed(0)
    logp = torch.randn(100, 20, generator=generator) * 3
    ref = torch.randn(100, 20, generator=generator) * 3
    assert (kl_k3(logp, ref) >= 0).all()


def test_kl_k3_by_hand():
    # ref - logp = log 2: 2 - log 2 - 1
    value = kl_k3(torch.tensor([0.0]), torch.tensor([math.log(2.0)]))
    assert value.item() == pytest.approx(1.0 - math.log(2.0), rel=1e-6)


# --- policy_loss: clipping gradients ----------------------------------------------------------


def _grad_at_ratio(ratio: float, advantage: float, **kwargs: float) -> float:
    """d loss / d logp for a single token whose probability ratio is ``ratio``."""
    logp = torch.zeros(1, 1, requires_grad=True)
    old_logp = torch.full((1, 1), -math.log(ratio))
    loss, _ = policy_loss(logp, old_logp, torch.tensor([advantage]), torch.ones(1, 1), **kwargs)
    loss.backward()
    return logp.grad.item()


def test_positive_advantage_above_clip_has_zero_gradient():
    assert _grad_at_ratio(1.3, +1.0, clip_low=0.2) == 0.0


def test_positive_advantage_below_clip_has_gradient():
    # d/dlogp of -rho * A is -rho * A
    assert _grad_at_ratio(1.1, +1.0, clip_low=0.2) == pytest.approx(-1.1, rel=1e-6)
    assert _grad_at_ratio(0.7, +1.0, clip_low=0.2) == pytest.approx(-0.7, rel=1e-6)


def test_negative_advantage_below_clip_has_zero_gradient():
    assert _grad_at_ratio(0.7, -1.0, clip_low=0.2) == 0.0


def test_negative_advantage_inside_clip_has_gradient():
    assert _grad_at_ratio(0.9, -1.0, clip_low=0.2) == pytest.approx(0.9, rel=1e-6)
    assert _grad_at_ratio(1.3, -1.0, clip_low=0.2) == pytest.approx(1.3, rel=1e-6)


def test_clip_high_is_asymmetric():
    # ratio 1.25: clipped by the symmetric 0.2, not by a DAPO-style clip_high of 0.28
    assert _grad_at_ratio(1.25, +1.0, clip_low=0.2) == 0.0
    assert _grad_at_ratio(1.25, +1.0, clip_low=0.2, clip_high=0.28) != 0.0
    # the lower bound still uses clip_low
    assert _grad_at_ratio(0.75, -1.0, clip_low=0.2, clip_high=0.28) == 0.0
    assert _grad_at_ratio(0.75, -1.0, clip_low=0.3, clip_high=0.28) != 0.0


# --- policy_loss: aggregation -----------------------------------------------------------------


def _per_token_grads(aggregation: str, **kwargs: int) -> torch.Tensor:
    """Gradients for two wrong attempts (A = -1) of 2 and 4 tokens, at ratio 1."""
    logp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    advantages = torch.tensor([-1.0, -1.0])
    loss, _ = policy_loss(logp, logp.detach(), advantages, mask, aggregation=aggregation, **kwargs)
    loss.backward()
    return logp.grad


def test_seq_mean_token_mean_punishes_long_wrong_attempts_less():
    grad = _per_token_grads("seq_mean_token_mean")
    short, long = grad[0, 0].item(), grad[1, 0].item()
    assert short == pytest.approx(1 / (2 * 2))  # 1 / (len * B)
    assert long == pytest.approx(1 / (4 * 2))
    assert abs(long) < abs(short)
    assert (grad[0, 2:] == 0).all()  # padding gets nothing


def test_token_sum_const_weighs_every_token_the_same():
    grad = _per_token_grads("token_sum_const", max_tokens=4)
    torch.testing.assert_close(grad[0, :2], torch.full((2,), 1 / (2 * 4)))
    torch.testing.assert_close(grad[1], torch.full((4,), 1 / (2 * 4)))
    assert (grad[0, 2:] == 0).all()


def test_token_mean_divides_by_valid_tokens():
    grad = _per_token_grads("token_mean")
    torch.testing.assert_close(grad[grad != 0], torch.full((6,), 1 / 6))


def test_aggregations_of_token_losses_by_hand():
    # rows of 1 and 3 valid tokens (losses 2 | 1, 3, 5), padding holding 100 that must not count
    per_token = torch.tensor([[2.0, 100.0, 100.0], [1.0, 3.0, 5.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert aggregate_token_loss(per_token, mask).item() == pytest.approx((2 + 3) / 2)
    assert aggregate_token_loss(per_token, mask, "token_sum_const", max_tokens=3).item() == (
        pytest.approx(11 / (2 * 3)))
    assert aggregate_token_loss(per_token, mask, "token_mean").item() == pytest.approx(11 / 4)
    with pytest.raises(ValueError, match="max_tokens >= 1, got 0"):
        aggregate_token_loss(per_token, mask, "token_sum_const", max_tokens=0)


# --- policy_loss: values and metrics on a hand-computed case ----------------------------------


def _hand_case(**kwargs: object) -> tuple[torch.Tensor, dict[str, float]]:
    # one attempt, A = +1, eps = 0.2; ratios 1.5 (clipped to 1.2), 0.5 (unclipped), padding
    logp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(3.0)]])
    old_logp = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    return policy_loss(logp, old_logp, torch.tensor([1.0]), mask, clip_low=0.2, **kwargs)


def test_loss_and_metrics_by_hand():
    loss, metrics = _hand_case()
    assert loss.item() == pytest.approx(-(1.2 + 0.5) / 2, rel=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx(1.0, rel=1e-6)
    approx_kl = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert metrics["approx_kl"] == pytest.approx(approx_kl, rel=1e-5)
    assert "kl_ref" not in metrics
    assert all(isinstance(v, float) for v in metrics.values())


def test_kl_penalty_added_by_hand():
    ref_logp = torch.zeros(1, 3)
    loss_no_kl, _ = _hand_case()
    loss, metrics = _hand_case(ref_logp=ref_logp, beta=0.1)
    # k3 per valid token: 1/rho - log(1/rho) - 1
    k3 = [1 / 1.5 + math.log(1.5) - 1, 1 / 0.5 + math.log(0.5) - 1]
    assert metrics["kl_ref"] == pytest.approx(sum(k3) / 2, rel=1e-5)
    assert loss.item() == pytest.approx(loss_no_kl.item() + 0.1 * sum(k3) / 2, rel=1e-5)


def test_kl_ref_reported_even_with_zero_beta():
    loss, metrics = _hand_case(ref_logp=torch.zeros(1, 3))
    assert "kl_ref" in metrics
    assert loss.item() == pytest.approx(_hand_case()[0].item())


def test_on_policy_metrics_are_trivial():
    logp = torch.randn(3, 5)
    loss, metrics = policy_loss(logp, logp, torch.tensor([1.0, -1.0, 0.5]), torch.ones(3, 5))
    assert metrics == pytest.approx({"clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0,
                                     "ratio_std": 0.0, "ratio_min": 1.0, "ratio_max": 1.0})
    assert loss.item() == pytest.approx(-(1.0 - 1.0 + 0.5) / 3, rel=1e-6)


# --- policy_loss: errors ----------------------------------------------------------------------


def _args() -> tuple[torch.Tensor, ...]:
    return torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3)


def test_unknown_aggregation_lists_choices():
    with pytest.raises(ValueError, match="token_sum_const"):
        policy_loss(*_args(), aggregation="sum")
    assert AGGREGATIONS == ("seq_mean_token_mean", "token_sum_const", "token_mean")


def test_token_sum_const_needs_max_tokens():
    with pytest.raises(ValueError, match="max_tokens"):
        policy_loss(*_args(), aggregation="token_sum_const")


def test_beta_without_reference_raises():
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(*_args(), beta=0.1)


def test_shape_mismatch_raises():
    logp, old_logp, _, mask = _args()
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old_logp, torch.zeros(3), mask)


# GAE, worked by hand with gamma = 0.9, lam = 0.8 (gamma * lam = 0.72).
# Attempt 0: rewards (0, 0, 1), values (0.5, 0.6, 0.7), success ended it (terminal: next value 0):
#   delta = (0 + 0.9*0.6 - 0.5, 0 + 0.9*0.7 - 0.6, 1 + 0 - 0.7) = (0.04, 0.03, 0.3)
#   A_2 = 0.3; A_1 = 0.03 + 0.72*0.3 = 0.246; A_0 = 0.04 + 0.72*0.246 = 0.21712
# Attempt 1: two decisions (rewards (1, 0), values (0.2, 0.1)), terminal, one step of padding:
#   delta = (1 + 0.9*0.1 - 0.2, 0 - 0.1) = (0.89, -0.1); A_1 = -0.1; A_0 = 0.89 - 0.072 = 0.818
# Attempt 0 cut by a step limit instead, the state it was cut in valued 0.4:
#   delta_2 = 1 + 0.9*0.4 - 0.7 = 0.66; A_1 = 0.03 + 0.72*0.66 = 0.5052;
#   A_0 = 0.04 + 0.72*0.5052 = 0.403744
GAE_REWARDS = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 9.0]])  # 9.0: padding, ignored
GAE_VALUES = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.1, 9.0]])
GAE_LENGTHS = torch.tensor([3, 2])


def test_gae_matches_the_hand_worked_example():
    advantages, returns = gae(GAE_REWARDS, GAE_VALUES, GAE_LENGTHS, torch.tensor([0.4, 0.3]),
                              torch.tensor([True, True]), gamma=0.9, lam=0.8)
    expected = torch.tensor([[0.21712, 0.246, 0.3], [0.818, -0.1, 0.0]])
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert torch.allclose(returns, torch.tensor([[0.71712, 0.846, 1.0], [1.018, 0.0, 0.0]]),
                          atol=1e-6)


def test_gae_bootstraps_a_truncated_attempt_from_its_last_value():
    advantages, _ = gae(GAE_REWARDS[:1], GAE_VALUES[:1], GAE_LENGTHS[:1], torch.tensor([0.4]),
                        torch.tensor([False]), gamma=0.9, lam=0.8)
    assert torch.allclose(advantages, torch.tensor([[0.403744, 0.5052, 0.66]]), atol=1e-6)


def test_gae_lambda_ends_are_td_and_monte_carlo():
    """lam = 0: the one-step TD residual; lam = 1: the discounted return minus V."""
    terminal = torch.tensor([True, True])
    last = torch.zeros(2)
    td, _ = gae(GAE_REWARDS, GAE_VALUES, GAE_LENGTHS, last, terminal, gamma=0.9, lam=0.0)
    assert torch.allclose(td, torch.tensor([[0.04, 0.03, 0.3], [0.89, -0.1, 0.0]]), atol=1e-6)
    mc, _ = gae(GAE_REWARDS, GAE_VALUES, GAE_LENGTHS, last, terminal, gamma=0.9, lam=1.0)
    # returns (0.81, 0.9, 1.0) and (1.0, 0.0) minus the values
    assert torch.allclose(mc, torch.tensor([[0.31, 0.3, 0.3], [0.8, -0.1, 0.0]]), atol=1e-6)


@pytest.mark.parametrize("kwargs,message", [
    ({"gamma": 1.5}, "gamma=1.5; must be in"),
    ({"lam": -0.1}, "lam=-0.1; must be in"),
    ({"lengths": torch.tensor([4, 2])}, r"lengths must be in \[1, 3\]"),
    ({"last_values": torch.zeros(3)}, r"last_values has shape \(3,\); expected \(2,\)"),
])
def test_gae_refuses_bad_inputs_by_name(kwargs, message):
    args = dict(rewards=GAE_REWARDS, values=GAE_VALUES, lengths=GAE_LENGTHS,
                last_values=torch.zeros(2), terminated=torch.tensor([True, False]),
                gamma=0.9, lam=0.8)
    with pytest.raises(ValueError, match=message):
        gae(**{**args, **kwargs})


def test_value_loss_clips_the_move_from_the_rollout_value():
    """V moved from 0.0 to 1.0 with target 1.0: unclipped loss 0; clipped at 0.2, the moved value
    counts as 0.2 and the larger loss 0.5 * 0.8^2 = 0.32 is taken. The masked entry is ignored."""
    values, old = torch.tensor([1.0, 5.0]), torch.tensor([0.0, 0.0])
    returns, mask = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])
    assert value_loss(values, old, returns, mask).item() == pytest.approx(0.0)
    assert value_loss(values, old, returns, mask, clip=0.2).item() == pytest.approx(0.32)
    with pytest.raises(ValueError, match="clip=0; must be > 0"):
        value_loss(values, old, returns, mask, clip=0)
