"""Tests for the action-token policies: shapes, sampling, discretisation, BC fit, checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.nn import functional as F

from harness.config.errors import ConfigError
from harness.policies import (
    Policy,
    actions_to_tokens,
    load_policy,
    make,
    obs_to_batch,
    save_policy,
    tokens_to_actions,
)
from harness.policies.layers import InstructionEncoder, InstructionKeypoints, SpatialSoftmax
from harness.policies.mlp import MLPConfig
from harness.policies.mlp.model import MLPPolicy
from harness.policies.tiny_vla import TinyVLAConfig
from harness.policies.tiny_vla.model import TinyVLA
from tasks.language import CORE_SIZE, MAX_TOKENS, PAD, VOCAB_SIZE

torch.set_num_threads(1)

STATE_DIM, PROPRIO_DIM, IMAGE = 7, 5, 32


def _logits(policy, obs):
    """The tokens head's scores ``(B, H * A, K)``."""
    return policy.head.logits(policy.features(obs))


def _space(*keys: str, image: int = IMAGE) -> spaces.Dict:
    all_spaces = {
        "state": spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32),
        "pixels": spaces.Box(0, 255, (image, image, 3), np.uint8),
        "proprio": spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32),
        "instruction": spaces.Box(0, VOCAB_SIZE - 1, (MAX_TOKENS,), np.int64),
    }
    return spaces.Dict({key: all_spaces[key] for key in keys})


def _batch(space: spaces.Dict, batch_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    space.seed(seed)
    return obs_to_batch([space.sample() for _ in range(batch_size)])


@pytest.fixture
def mlp() -> tuple[Policy, spaces.Dict]:
    torch.manual_seed(0)
    space = _space("state", "instruction")
    return make(MLPConfig(use_instruction=True, hidden=32), space), space


@pytest.fixture
def vla() -> tuple[Policy, spaces.Dict]:
    torch.manual_seed(0)
    space = _space("pixels", "proprio", "instruction")
    config = TinyVLAConfig(hidden=32, conv_channels=(8, 8, 8))
    return make(config, space), space


# --- discretisation ---------------------------------------------------------------------------


def test_tokens_actions_round_trip():
    tokens = torch.arange(11)
    actions = tokens_to_actions(tokens, 11)
    torch.testing.assert_close(actions, torch.linspace(-1, 1, 11))
    assert torch.equal(actions_to_tokens(actions, 11), tokens)


def test_actions_go_to_nearest_bin():
    actions = np.array([-1.0, -0.96, -0.7, 0.04, 0.51, 1.0, 3.0])
    # K = 5: centres -1, -0.5, 0, 0.5, 1
    assert actions_to_tokens(actions, 5).tolist() == [0, 0, 1, 2, 3, 4, 4]


def test_bad_bin_count_raises():
    with pytest.raises(ValueError, match="num_bins"):
        actions_to_tokens(torch.zeros(3), 1)
    with pytest.raises(ValueError, match="num_bins"):
        tokens_to_actions(torch.zeros(3), 1)
    with pytest.raises(ConfigError, match="num_bins=1"):
        MLPConfig(use_instruction=True, head={"name": "tokens", "num_bins": 1})


def test_config_names_bad_values():
    with pytest.raises(ConfigError, match="policy kind 'transformer' is not registered"):
        MLPConfig(name="transformer")
    with pytest.raises(ConfigError, match="policy.hidden=0"):
        MLPConfig(use_instruction=True, hidden=0)
    with pytest.raises(ConfigError, match=r"policy.hidden=100000; need an int in \[1, 8192\]"):
        TinyVLAConfig(hidden=100_000)
    with pytest.raises(ConfigError, match="conv_channels"):
        TinyVLAConfig(conv_channels=(8, -1))
    with pytest.raises(ConfigError, match="image_features='max'.*spatial_softmax"):
        TinyVLAConfig(image_features="max")


def test_spatial_softmax_finds_a_hot_spot():
    # One channel peaks at row 1, column 3 of a 5 x 5 map; coordinates are linspace(-1, 1, 5)
    # = -1, -0.5, 0, 0.5, 1, so its keypoint is x = 0.5, y = -0.5. The other channel is flat,
    # so its expected position is the centre (0, 0).
    maps = torch.zeros(1, 2, 5, 5)
    maps[0, 0, 1, 3] = 50.0
    keypoints = SpatialSoftmax()(maps)
    torch.testing.assert_close(keypoints, torch.tensor([[0.5, 0.0, -0.5, 0.0]]))


def test_instruction_keypoints_average_the_channels_the_words_pick():
    # Two channels with keypoints (x, y) = (0.5, 0.1) and (-0.5, 0.9). A query whose logits
    # are (20, 0) picks the first, one with (0, 0) averages them: (0, 0.5); one with
    # (ln 3, 0) weighs them 3:1: (0.25, 0.3).
    chooser = InstructionKeypoints(embed_dim=2, channels=2, queries=3)
    with torch.no_grad():
        chooser.query.weight.zero_()
        chooser.query.bias.copy_(torch.tensor([20.0, 0.0, 0.0, 0.0, math.log(3.0), 0.0]))
    keypoints = torch.tensor([[0.5, -0.5, 0.1, 0.9]])  # all x, then all y
    chosen = chooser(keypoints, torch.zeros(1, 2))
    torch.testing.assert_close(chosen, torch.tensor([[0.5, 0.1, 0.0, 0.5, 0.25, 0.3]]))


def test_tiny_vla_instruction_keypoints_are_off_by_default_and_read_the_words():
    space = _space("pixels", "instruction", image=24)
    assert not hasattr(make(TinyVLAConfig(hidden=16,
                                              conv_channels=(4, 4)), space), "keypoint_chooser")
    torch.manual_seed(0)
    policy = make(TinyVLAConfig(hidden=16, conv_channels=(4, 4),
                                    instruction_keypoints=2), space)
    assert policy.fusion[0].in_features == 2 * 4 + policy.config.embed_dim + 2 * 2
    obs = _batch(space, 2)
    other = {**obs, "instruction": obs["instruction"].flip(0)}
    with torch.no_grad():
        image = policy.encode_image(obs["pixels"])
        words = policy.instruction_encoder(obs["instruction"])
        assert not torch.equal(policy.keypoint_chooser(image, words),
                               policy.keypoint_chooser(image, policy.instruction_encoder(
                                   other["instruction"])))
    with pytest.raises(ValueError, match="instruction_keypoints=-1"):
        TinyVLAConfig(instruction_keypoints=-1)
    with pytest.raises(ValueError, match="instruction_keypoints=2 chooses among spatial-softmax "
                                         "keypoints.*not 'avg_pool'"):
        TinyVLAConfig(instruction_keypoints=2, image_features="avg_pool")
    with pytest.raises(ValueError, match="needs spatial_softmax features and an instruction"):
        make(policy.config, _space("pixels", image=24))


@pytest.mark.parametrize("image_features", ["spatial_softmax", "avg_pool"])
def test_tiny_vla_image_features_fit_a_position(image_features):
    # A white square at a random place on black: the encoder must carry *where* it is. A few
    # hundred Adam steps of regression to its centre separate keypoints from pooling, and both
    # must at least learn the task, so the test only asserts a fit, not which one wins.
    torch.manual_seed(0)
    config = TinyVLAConfig(hidden=32, conv_channels=(8, 8),
                               image_features=image_features)
    policy = make(config, _space("pixels", image=24))
    generator = torch.Generator().manual_seed(0)
    corners = torch.randint(0, 20, (256, 2), generator=generator)
    pixels = torch.zeros(256, 24, 24, 3, dtype=torch.uint8)
    for i, (row, col) in enumerate(corners.tolist()):
        pixels[i, row:row + 4, col:col + 4] = 255
    target = (corners.float() + 1.5) / 23 * 2 - 1  # square centres in [-1, 1]
    head = torch.nn.Linear(32, 2)
    optimizer = torch.optim.Adam([*policy.parameters(), *head.parameters()], lr=3e-3)
    for _ in range(300):
        loss = F.mse_loss(head(policy.features({"pixels": pixels})), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05  # variance of the target is ~0.3


# --- shapes and the sampling surface ----------------------------------------------------------


@pytest.mark.parametrize("policy_name", ["mlp", "vla"])
def test_shapes(policy_name, request):
    policy, space = request.getfixturevalue(policy_name)
    obs = _batch(space, 3)
    assert _logits(policy, obs).shape == (3, 4, 11)
    tokens, actions = policy.act(obs)
    assert tokens.shape == (3, 4) and actions.shape == (3, 1, 4)  # a chunk of one action
    assert tokens.dtype == torch.int64
    assert actions.min() >= -1 and actions.max() <= 1
    assert policy.log_prob(obs, tokens).shape == (3, 4)
    assert policy.entropy(obs).shape == (3, 4)
    assert policy.value(obs).shape == (3,)


def test_tiny_vla_takes_any_image_size():
    config = TinyVLAConfig(hidden=16, conv_channels=(4, 4, 4))
    policy = make(config, _space("pixels", image=84))
    assert isinstance(policy, TinyVLA)
    assert _logits(policy, _batch(_space("pixels", image=84), 2)).shape == (2, 4, 11)
    # adaptive pooling: the same weights run on another image size
    assert _logits(policy, _batch(_space("pixels", image=48), 2)).shape == (2, 4, 11)


def test_tiny_vla_refuses_float_pixels(vla):
    policy, space = vla
    obs = _batch(space, 2)
    obs["pixels"] = obs["pixels"].float()
    with pytest.raises(TypeError, match="uint8"):
        _logits(policy, obs)


@pytest.mark.parametrize("policy_name", ["mlp", "vla"])
def test_log_prob_of_samples_is_gathered_log_softmax(policy_name, request):
    policy, space = request.getfixturevalue(policy_name)
    obs = _batch(space, 4)
    tokens, _ = policy.act(obs)
    expected = F.log_softmax(_logits(policy, obs), dim=-1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(policy.log_prob(obs, tokens), expected)


def test_log_prob_has_gradient(mlp):
    policy, space = mlp
    obs = _batch(space, 2)
    tokens, _ = policy.act(obs)
    policy.log_prob(obs, tokens).sum().backward()
    assert policy.head.linear.weight.grad.abs().sum() > 0


def test_deterministic_act_is_argmax(mlp):
    policy, space = mlp
    obs = _batch(space, 5)
    tokens, actions = policy.act(obs, deterministic=True)
    assert torch.equal(tokens, _logits(policy, obs).argmax(-1))
    torch.testing.assert_close(actions[:, 0], tokens_to_actions(tokens, 11))


def test_temperature_must_be_positive_when_sampling(mlp):
    policy, space = mlp
    obs = _batch(space, 2)
    with pytest.raises(ValueError, match="temperature"):
        policy.act(obs, temperature=0.0)
    policy.act(obs, deterministic=True, temperature=0.0)  # fine: no sampling


def test_low_temperature_samples_the_argmax(mlp):
    policy, space = mlp
    obs = _batch(space, 8)
    tokens, _ = policy.act(obs, temperature=1e-4)
    assert torch.equal(tokens, policy.act(obs, deterministic=True)[0])


@pytest.mark.parametrize("policy_name", ["mlp", "vla"])
def test_entropy_bounds(policy_name, request):
    policy, space = request.getfixturevalue(policy_name)
    entropy = policy.entropy(_batch(space, 4))
    assert (entropy >= 0).all()
    assert (entropy <= math.log(11) + 1e-5).all()


def test_obs_to_batch_single_list_and_batched():
    space = _space("state", "pixels", "instruction")
    space.seed(1)
    one = space.sample()
    single = obs_to_batch(one)
    assert single["state"].shape == (1, STATE_DIM) and single["state"].dtype == torch.float32
    assert single["pixels"].shape == (1, IMAGE, IMAGE, 3) and single["pixels"].dtype == torch.uint8
    assert single["instruction"].dtype == torch.int64
    listed = obs_to_batch([one, one])
    assert listed["pixels"].shape == (2, IMAGE, IMAGE, 3)
    stacked = {k: np.stack([v, v]) for k, v in one.items()}
    already = obs_to_batch(stacked, batched=True)
    assert all(torch.equal(already[k], listed[k]) for k in listed)


def test_the_suites_words_leave_our_runs_and_checkpoints_as_they_were():
    """Our words' rows are the draws of an nn.Embedding of our vocabulary's size, and the global
    generator is left where that embedding left it (so every later layer is initialised as
    before the suites' words existed); a state dict of that older size still loads."""
    torch.manual_seed(11)
    before = torch.nn.Embedding(CORE_SIZE, 6, padding_idx=PAD)
    next_before = torch.rand(4)
    torch.manual_seed(11)
    encoder = InstructionEncoder(6)
    assert torch.equal(torch.rand(4), next_before)
    weight = encoder.embedding.weight
    assert weight.shape == (VOCAB_SIZE, 6) and VOCAB_SIZE > CORE_SIZE
    assert torch.equal(weight[:CORE_SIZE], before.weight) and not weight[PAD].any()
    assert torch.equal(weight[CORE_SIZE:], InstructionEncoder(6).embedding.weight[CORE_SIZE:])
    old = InstructionEncoder(6)
    old.load_state_dict({"embedding.weight": before.weight.detach().clone()})
    assert torch.equal(old.embedding.weight, weight)
    with pytest.raises(RuntimeError, match="size mismatch"):
        old.load_state_dict({"embedding.weight": torch.zeros(CORE_SIZE + 1, 6)})


def test_instruction_changes_the_mlp_output(mlp):
    policy, space = mlp
    obs = _batch(space, 1)
    other = dict(obs, instruction=torch.zeros_like(obs["instruction"]))
    other["instruction"][0, :2] = torch.tensor([2, 3])
    assert not torch.allclose(_logits(policy, obs), _logits(policy, other))


# --- behaviour cloning sanity -----------------------------------------------------------------


def test_mlp_fits_a_fixed_mapping_by_cross_entropy():
    torch.manual_seed(0)
    policy = make(MLPConfig(use_instruction=True, hidden=64), _space("state"))
    obs = {"state": torch.randn(32, STATE_DIM)}
    targets = torch.randint(0, 11, (32, 4))
    optimiser = torch.optim.Adam(policy.parameters(), lr=3e-3)
    for _ in range(300):
        loss = -policy.log_prob(obs, targets).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    assert loss.item() < 0.1
    assert torch.equal(policy.act(obs, deterministic=True)[0], targets)


# --- make() -----------------------------------------------------------------------------------


def test_make_builds_the_right_kind():
    assert isinstance(make(MLPConfig(use_instruction=True), _space("state")), MLPPolicy)
    policy = make(TinyVLAConfig(), _space("pixels", "proprio"))
    assert isinstance(policy, TinyVLA)


def test_make_names_missing_keys():
    with pytest.raises(ValueError, match="pixels"):
        make(TinyVLAConfig(), _space("state", "instruction"))
    with pytest.raises(ValueError, match="state"):
        make(MLPConfig(use_instruction=True), _space("pixels", "proprio"))


def test_make_refuses_non_dict_space():
    with pytest.raises(TypeError, match="Dict"):
        make(MLPConfig(use_instruction=True), spaces.Box(-1, 1, (3,)))


# --- checkpoints ------------------------------------------------------------------------------


@pytest.mark.parametrize("policy_name", ["mlp", "vla"])
def test_save_load_round_trip(policy_name, request, tmp_path):
    policy, space = request.getfixturevalue(policy_name)
    path = tmp_path / "ckpt" / "policy.pt"
    save_policy(path, policy)
    assert [p.name for p in path.parent.iterdir()] == ["policy.pt"]  # no temp file left
    loaded = load_policy(path, observation_space=space)
    assert type(loaded) is type(policy)
    assert loaded.config == policy.config
    obs = _batch(space, 3)
    torch.testing.assert_close(_logits(loaded, obs), _logits(policy, obs))
    torch.testing.assert_close(loaded.value(obs), policy.value(obs))


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.pt"):
        load_policy(tmp_path / "nope.pt")


def test_load_corrupt_file(tmp_path):
    path = tmp_path / "policy.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot read"):
        load_policy(path)


def test_load_other_object(tmp_path):
    path = tmp_path / "policy.pt"
    torch.save({"weights": torch.zeros(1)}, path)
    with pytest.raises(ValueError, match="not a policy checkpoint"):
        load_policy(path)


def test_load_refuses_mismatched_observation_space(mlp, tmp_path):
    policy, _ = mlp
    path = tmp_path / "policy.pt"
    save_policy(path, policy)
    other = _space("state", "instruction")
    other.spaces["state"] = spaces.Box(-1, 1, (STATE_DIM + 1,), np.float32)
    with pytest.raises(ValueError, match="observation shapes"):
        load_policy(path, observation_space=other)


def test_load_refuses_weights_that_do_not_fit(mlp, tmp_path):
    policy, _ = mlp
    path = tmp_path / "policy.pt"
    save_policy(path, policy)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["obs_shapes"]["state"] = [STATE_DIM + 2]
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match="do not fit"):
        load_policy(path)
