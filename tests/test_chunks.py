"""Action chunks: hand-worked masks, decision log-probabilities and BC targets; the tokens head's
chunk layout; one action per decision is the one-step formula; refusals by name; policy files
saved before chunks existed still load."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.nn import functional as F

from harness.algos.group.update import attempt_tensor
from harness.config.errors import ConfigError
from harness.demos import Demos
from harness.policies import (
    actions_to_tokens,
    load_policy,
    make,
    obs_to_batch,
    sample_tokens,
    save_policy,
    tokens_to_actions,
)
from harness.policies.chunks import chunk_targets, executed_token_mask
from harness.policies.heads.tokens import token_cross_entropy
from harness.policies.mlp import MLPConfig
from harness.policies.tiny_vla import TinyVLAConfig
from harness.start_policy.bc import bc_targets, pretrain_bc

torch.set_num_threads(1)

SPACE = spaces.Dict({"state": spaces.Box(-np.inf, np.inf, (6,), np.float32)})


def _obs(count: int, seed: int = 0) -> dict[str, torch.Tensor]:
    SPACE.seed(seed)
    return obs_to_batch([SPACE.sample() for _ in range(count)])


def _policy(**chunks):
    torch.manual_seed(0)
    return make(MLPConfig(use_instruction=True, hidden=16, head={"name": "tokens", "num_bins": 5},
                          **chunks), SPACE)


def _logits(policy, obs):
    """The tokens head's scores ``(B, H * A, K)``."""
    return policy.head.logits(policy.features(obs))


# --- pure maths, by hand ----------------------------------------------------------------------


def test_executed_token_mask_by_hand():
    # H = 3 steps of A = 2 tokens; decisions that played 1, 3 and 2 steps
    mask = executed_token_mask(torch.tensor([1, 3, 2]), chunk_tokens=6, action_dim=2)
    assert mask.tolist() == [[True, True, False, False, False, False],
                             [True] * 6,
                             [True, True, True, True, False, False]]


def test_decision_log_prob_sums_the_executed_tokens_by_hand():
    token_logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0],
                               [-0.5, -0.25, -8.0, -8.0, -8.0, -8.0]])

    def decision_log_prob(logp, executed, action_dim):
        return (logp * executed_token_mask(executed, logp.shape[1], action_dim)).sum(dim=1)

    # row 0 played 2 steps: -1 - 2 - 3 - 4; row 1 played 1 step: -0.5 - 0.25
    got = decision_log_prob(token_logp, torch.tensor([2, 1]), action_dim=2)
    assert got.tolist() == [-10.0, -0.75]
    whole = decision_log_prob(token_logp, torch.tensor([3, 3]), action_dim=2)
    assert whole.tolist() == [-21.0, -32.75]


def test_chunk_targets_by_hand():
    # two episodes: steps 0-2 (actions 0.0, 0.1, 0.2) and 3-4 (actions 0.5, 0.6), A = 1
    actions = np.array([[0.0], [0.1], [0.2], [0.5], [0.6]], dtype=np.float32)
    targets, valid = chunk_targets(actions, np.array([0, 0, 0, 1, 1]), chunk_size=3)
    np.testing.assert_array_equal(targets[..., 0], np.array(
        [[0.0, 0.1, 0.2], [0.1, 0.2, 0.2], [0.2, 0.2, 0.2], [0.5, 0.6, 0.6], [0.6, 0.6, 0.6]],
        dtype=np.float32))
    assert valid.tolist() == [[True, True, True], [True, True, False], [True, False, False],
                              [True, True, False], [True, False, False]]
    one, none = chunk_targets(actions, np.array([0, 0, 0, 1, 1]), chunk_size=1)
    assert none is None and np.array_equal(one[:, 0], actions)


def test_chunk_targets_refuse_interleaved_episodes():
    with pytest.raises(ValueError, match="not contiguous"):
        chunk_targets(np.zeros((3, 2)), np.array([0, 1, 0]), chunk_size=2)
    with pytest.raises(ValueError, match="chunk_size=0"):
        chunk_targets(np.zeros((3, 2)), np.array([0, 0, 0]), chunk_size=0)


def test_attempt_tensor_keeps_the_executed_tokens_by_hand():
    # two attempts: decisions 0-1 (played 2 and 1 steps) and decision 2 (played 1); H = 2, A = 1
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    valid = executed_token_mask(torch.tensor([2, 1, 1]), chunk_tokens=2, action_dim=1)
    padded, mask = attempt_tensor(values, np.array([2, 1]), valid)
    assert padded.tolist() == [[1.0, 2.0, 3.0], [5.0, 0.0, 0.0]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]


def test_masked_cross_entropy_by_hand():
    logits = torch.zeros(1, 2, 4)  # uniform: log 4 per token
    logits[0, 1, 2] = 50.0  # token 1 is confidently 2 (loss ~0) but wrong for target 0
    tokens = torch.tensor([[1, 0]])
    assert token_cross_entropy(logits, tokens, torch.tensor([[True, False]])).item() == \
        pytest.approx(math.log(4))
    assert token_cross_entropy(logits, tokens).item() == pytest.approx((math.log(4) + 50) / 2)


# --- the policy -------------------------------------------------------------------------------


def test_one_action_per_decision_is_todays_policy():
    """``chunk_size=1`` builds the same weights from the same seed as before chunks existed,
    and every output is the one-step formula: logits ``head(features).view(B, A, K)``, tokens
    by the inverse CDF, actions ``(B, 1, A)``."""
    default, explicit = _policy(), _policy(chunk_size=1, execute_steps=1)
    for (name, a), (_, b) in zip(default.state_dict().items(), explicit.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    assert default.head.linear.out_features == 4 * 5
    obs = _obs(8)
    logits = default.head.linear(default.features(obs)).view(8, 4, 5)
    assert torch.equal(_logits(default, obs), logits)
    uniforms = torch.rand(8, 4, generator=torch.Generator().manual_seed(1))
    tokens, actions = explicit.act(obs, temperature=0.7, uniforms=uniforms)
    assert torch.equal(tokens, sample_tokens(logits / 0.7, uniforms))
    assert torch.equal(actions, tokens_to_actions(tokens, 5)[:, None])
    assert torch.equal(explicit.spec.executed_mask(torch.ones(8, dtype=torch.long)),
                       torch.ones(8, 4, dtype=torch.bool))


def test_a_chunk_is_step_major():
    policy = _policy(chunk_size=3, execute_steps=2)
    obs = _obs(5)
    assert _logits(policy, obs).shape == (5, 12, 5) and policy.spec.units_per_decision == 12
    tokens, actions = policy.act(obs, deterministic=True)
    assert tokens.shape == (5, 12) and actions.shape == (5, 3, 4)
    for h in range(3):
        for d in range(4):
            assert torch.equal(actions[:, h, d], tokens_to_actions(tokens[:, h * 4 + d], 5))
    assert policy.log_prob(obs, tokens).shape == (5, 12)
    assert policy.entropy(obs).shape == (5, 12)


def test_a_decisions_log_prob_is_the_sum_of_its_executed_tokens():
    """Oracle: log-softmax of the logits, one token at a time, summed over the steps played."""
    policy = _policy(chunk_size=4, execute_steps=2)
    obs = _obs(6)
    tokens, _ = policy.act(obs, temperature=1.0)
    executed = torch.tensor([2, 1, 2, 2, 1, 2])
    with torch.no_grad():
        log_softmax = F.log_softmax(_logits(policy, obs) / 0.5, dim=-1)
    got = (policy.log_prob(obs, tokens, temperature=0.5)
           * policy.spec.executed_mask(executed)).sum(dim=1)
    for row in range(6):
        expected = sum(float(log_softmax[row, h * 4 + d, tokens[row, h * 4 + d]])
                       for h in range(int(executed[row])) for d in range(4))
        assert float(got[row].detach()) == pytest.approx(expected, abs=1e-5)
    got.sum().backward()
    # the head's rows of steps 2 and 3, never played, get no gradient; those of 0 and 1 do
    grad = policy.head.linear.weight.grad.view(4, 4, 5, 16)  # (H, A, K, hidden)
    assert grad[2:].abs().max() == 0 and grad[:2].abs().amax(dim=(1, 2, 3)).min() > 0


@pytest.mark.parametrize(("fields", "message"), [
    ({"chunk_size": 0}, r"policy.chunk_size=0; need an int in \[1, 256\]"),
    ({"chunk_size": 300}, r"policy.chunk_size=300; need an int in \[1, 256\]"),
    ({"chunk_size": 2, "execute_steps": 3}, "execute_steps=3 with chunk_size=2"),
    ({"execute_steps": 0}, "execute_steps=0 with chunk_size=1"),
    ({"chunk_size": 2.5}, "chunk_size=2.5"),
])
def test_bad_chunks_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        MLPConfig(**fields)


def test_a_policy_file_from_before_chunks_loads_with_one_action(tmp_path):
    policy = _policy()
    save_policy(tmp_path / "policy.pt", policy)
    saved = torch.load(tmp_path / "policy.pt", weights_only=True)
    for name in ("chunk_size", "execute_steps"):
        del saved["config"][name]  # as written before action chunks
    torch.save(saved, tmp_path / "old.pt")
    old = load_policy(tmp_path / "old.pt")
    assert (old.config.chunk_size, old.config.steps_per_decision) == (1, 1)
    obs = _obs(3)
    assert torch.equal(_logits(old, obs), _logits(policy, obs))
    chunked = _policy(chunk_size=4, execute_steps=2)
    save_policy(tmp_path / "chunked.pt", chunked)
    again = load_policy(tmp_path / "chunked.pt")
    assert (again.config.chunk_size, again.config.execute_steps) == (4, 2)


def test_a_start_policy_with_other_chunks_is_refused_by_name():
    from harness.start_policy import check_start_policy

    held = _policy(chunk_size=4, execute_steps=2)
    check_start_policy(held, MLPConfig(chunk_size=4, execute_steps=2), "a.pt")
    wanted = r"file=a.pt holds a policy with .*'chunk_size': 4.*this run's .*'chunk_size': 1"
    with pytest.raises(ValueError, match=wanted):
        check_start_policy(held, MLPConfig(), "a.pt")
    with pytest.raises(ValueError, match="'kind': 'tiny_vla'"):
        check_start_policy(held, TinyVLAConfig(chunk_size=4, execute_steps=2), "a.pt")


def test_a_chunk_policy_function_plays_step_by_step_for_frame_mining():
    """``success_detectors.mining`` records one step at a time: a chunk is played in order,
    the policy asked again when it is spent, and a new episode drops the previous rest."""
    from success_detectors.mining import stepwise

    asked = []

    def chunks(obs):
        asked.append(obs)
        return np.arange(6, dtype=np.float32).reshape(3, 2) + 10 * len(asked)

    act = stepwise(chunks)
    played = [act(step, 0.0, step).tolist() for step in range(4)]
    assert played == [[10, 11], [12, 13], [14, 15], [20, 21]] and asked == [0, 3]
    assert act("new", 0.0, 0).tolist() == [30, 31] and asked[-1] == "new"  # rest dropped
    single = stepwise(lambda obs: np.array([1.0, 2.0]))
    assert single(None, 0.0, 0).tolist() == [1.0, 2.0]


# --- behaviour cloning ------------------------------------------------------------------------


def _demos() -> Demos:
    """Two episodes of 5 and 3 steps whose expert action is a function of the state."""
    rng = np.random.default_rng(0)
    states = rng.uniform(-1, 1, (8, 6)).astype(np.float32)
    actions = np.clip(states[:, :4], -1, 1).astype(np.float32)
    return Demos(obs={"state": states}, actions=actions, rewards=np.zeros(8, np.float32),
                 dones=np.array([0, 0, 0, 0, 1, 0, 0, 1], dtype=bool),
                 episode_ids=np.array([0, 0, 0, 0, 0, 1, 1, 1]),
                 successes=np.array([True, True]), seeds=np.array([0, 1]), env_args={})


def test_bc_targets_are_the_next_actions_of_the_episode():
    demos = _demos()
    policy = _policy(chunk_size=2)
    chunks, valid = bc_targets(policy, demos, torch.device("cpu"))
    assert chunks.shape == (8, 2, 4) and valid.shape == (8, 2)
    expected = np.stack([demos.actions[:4], demos.actions[1:5]], axis=1)  # t and t + 1
    assert torch.equal(chunks[:4], torch.as_tensor(expected))
    # the last step of each episode has no next action: its second step is masked out
    assert valid[:, 1].tolist() == [True, True, True, True, False, True, True, False]
    assert valid[:, 0].all()
    assert bc_targets(_policy(), demos, torch.device("cpu"))[1] is None


def test_bc_fits_chunks_on_the_valid_slots():
    demos = _demos()
    policy = _policy(chunk_size=3, execute_steps=2)
    metrics = pretrain_bc(policy, demos, epochs=150, lr=1e-2, batch_size=8, val_fraction=0.0,
                          augment=False, progress=False)
    assert math.isfinite(metrics["bc/train_loss"]) and metrics["bc/train_loss"] < 0.5
    chunks, valid = bc_targets(policy, demos, torch.device("cpu"))
    tokens = actions_to_tokens(chunks.flatten(1), 5)
    with torch.no_grad():
        predicted = _logits(policy, {"state": torch.as_tensor(demos.obs["state"])}).argmax(-1)
    counted = valid.repeat_interleave(4, dim=1)
    assert (predicted == tokens)[counted].float().mean() > 0.9
