"""Oracle tests of the chunk action heads (harness/policies/heads/): densities against closed
forms worked by hand and against sampling frequencies, a standalone tokens head against the one
inside an mlp policy, ratios, temperatures, gradients, behaviour cloning, and refusals."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from harness.objectives import kl_k3
from harness.policies import head_names, make, obs_to_batch
from harness.policies.heads import FlowHead, GaussianHead, TokenHead, make_head
from harness.policies.heads.gaussian import log1m_tanh_squared
from harness.policies.mlp import MLPConfig

torch.set_num_threads(1)

F_DIM, H, A = 6, 3, 4
# (kind, options): every head, and each noise / std variant.
VARIANTS = [("tokens", {"num_bins": 5}), ("gaussian", {}),
            ("gaussian", {"state_dependent_std": True}), ("flow", {"hidden": 32}),
            ("flow", {"hidden": 32, "noise": "network"})]
IDS = ["tokens", "gaussian", "gaussian-state-std", "flow", "flow-noise-net"]


def _head(kind: str, options: dict, seed: int = 0, chunk: int = H):
    torch.manual_seed(seed)
    return make_head(kind, F_DIM, chunk, A, **options)


def _features(rows: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, F_DIM, generator=torch.Generator().manual_seed(seed))


def _log_normal(x: float, mean: float, std: float) -> float:
    """``log N(x; mean, std^2)`` written out by hand."""
    return -0.5 * ((x - mean) / std) ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi)


# --- tokens -----------------------------------------------------------------------------------


def test_a_tokens_head_with_one_step_is_the_mlp_policys_own():
    config = MLPConfig(use_instruction=True, hidden=16, head={"name": "tokens", "num_bins": 7})
    space = spaces.Dict({"state": spaces.Box(-np.inf, np.inf, (5,), np.float32)})
    torch.manual_seed(0)
    policy = make(config, space)
    obs = obs_to_batch([space.sample() for _ in range(6)])
    head = TokenHead(16, 1, 4, num_bins=7)
    head.linear.load_state_dict(policy.head.linear.state_dict())
    features = policy.features(obs)
    uniforms = torch.rand((6, 1, 4), generator=torch.Generator().manual_seed(3))
    decision = head.sample(features, 0.7, torch.Generator().manual_seed(3))
    tokens, actions = policy.act(obs, temperature=0.7, uniforms=uniforms[:, 0])
    assert torch.equal(decision.record, tokens)
    assert torch.equal(decision.actions, actions)  # (B, 1, A) both
    for temperature in (1.0, 0.7):
        per_token = policy.log_prob(obs, tokens, temperature)  # (B, A)
        assert torch.allclose(head.unit_log_probs(features, tokens, temperature),
                              per_token, atol=1e-6)
        assert torch.allclose(head.log_prob(features, tokens, temperature),
                              per_token.sum(-1), atol=1e-5)
        assert torch.allclose(head.entropy(features, temperature),
                              policy.entropy(obs, temperature).sum(-1), atol=1e-5)
    assert torch.equal(head.greedy(features), policy.act(obs, deterministic=True)[1])


def test_token_log_prob_is_the_log_of_sampling_frequencies():
    torch.manual_seed(0)
    head = TokenHead(2, 2, 1, num_bins=3)  # 9 possible chunks
    with torch.no_grad():
        head.linear.weight.mul_(4.0)
    rows = 40_000
    features = torch.tensor([[0.5, -1.0]]).expand(rows, 2)
    decision = head.sample(features, generator=torch.Generator().manual_seed(0))
    outcomes = torch.cartesian_prod(torch.arange(3.0), torch.arange(3.0))  # (9, 2)
    log_probs = head.log_prob(features[:9], outcomes).detach()
    assert math.isclose(float(log_probs.exp().sum()), 1.0, rel_tol=1e-5)
    for outcome, log_prob in zip(outcomes, log_probs, strict=True):
        hits = (decision.record == outcome).all(dim=1)
        p = float(log_prob.exp())
        assert abs(float(hits.float().mean()) - p) < 4.5 * math.sqrt(p * (1 - p) / rows) + 1e-4
        assert torch.allclose(decision.log_prob[hits], log_prob.expand(int(hits.sum())))
        if p > 0.05:
            assert abs(math.log(float(hits.float().mean())) - float(log_prob)) < 0.06


# --- gaussian ---------------------------------------------------------------------------------


def _scalar_gaussian(mean: float, std: float) -> GaussianHead:
    head = GaussianHead(1, 1, 1, log_std_min=-5.0, log_std_init=0.0, log_std_max=2.0)
    with torch.no_grad():
        head.mean.weight.zero_()
        head.mean.bias.fill_(mean)
        head.log_std.fill_(math.log(std))
    return head


def test_gaussian_log_prob_against_a_hand_worked_case():
    head, features = _scalar_gaussian(0.5, 0.5), torch.zeros(1, 1)
    # u = 1: log N(1; 0.5, 0.5^2) = -0.5 + log 2 - log sqrt(2 pi) = -0.7257913
    #        log(1 - tanh(1)^2) = log(1 - 0.7615942^2) = log 0.4199743 = -0.8675617
    log_prob = head.log_prob(features, torch.tensor([[1.0]])).detach()
    assert abs(float(log_prob) - (-0.7257913 + 0.8675617)) < 1e-6
    # temperature 2 doubles the std: log N(1; 0.5, 1) = -0.125 - 0.9189385
    log_prob = head.log_prob(features, torch.tensor([[1.0]]), temperature=2.0).detach()
    assert abs(float(log_prob) - (-0.125 - 0.9189385 + 0.8675617)) < 1e-6
    # far out tanh(30) is 1 in float32; the stable form still gives log(1 - tanh^2) = 2 (log 2 - 30)
    log_prob = head.log_prob(features, torch.tensor([[30.0]])).detach()
    assert abs(float(log_prob) - (_log_normal(30.0, 0.5, 0.5) - 2 * (math.log(2) - 30))) < 1e-3
    u = torch.linspace(-3, 3, 13, dtype=torch.float64)
    assert torch.allclose(log1m_tanh_squared(u), torch.log(1 - torch.tanh(u) ** 2))


def test_gaussian_density_matches_the_histogram_of_actions():
    head, rows = _scalar_gaussian(0.3, 0.8), 200_000
    decision = head.sample(torch.zeros(rows, 1), generator=torch.Generator().manual_seed(0))
    edges = torch.linspace(-1.0, 1.0, 21, dtype=torch.float64)
    counts = torch.histc(decision.actions.flatten().double(), bins=20, min=-1.0, max=1.0)
    for low, high, count in zip(edges[:-1], edges[1:], counts, strict=True):
        a = torch.linspace(float(low), float(high), 201, dtype=torch.float64)
        a = a.clamp(-1 + 1e-9, 1 - 1e-9)
        density = head.log_prob(torch.zeros(201, 1), torch.atanh(a).float()[:, None]).double()
        p = float(torch.trapezoid(density.detach().exp(), a))
        assert abs(float(count) / rows - p) < 5 * math.sqrt(p * (1 - p) / rows) + 1e-4


def test_gaussian_entropy_against_numerical_integration():
    head = _scalar_gaussian(0.4, 0.9)
    u = torch.linspace(-8, 8, 40001)
    log_p_action = head.log_prob(torch.zeros(len(u), 1), u[:, None]).detach().double()
    log_p_u = torch.tensor([_log_normal(float(x), 0.4, 0.9) for x in u[::100]])
    assert torch.allclose(log_p_action[::100] + log1m_tanh_squared(u[::100]).double(),
                          log_p_u.double(), atol=1e-5)
    density_u = (log_p_action + log1m_tanh_squared(u).double()).exp()
    exact = -float(torch.trapezoid(density_u * log_p_action, u.double()))
    estimate = head.entropy(torch.zeros(1, 1), generator=torch.Generator().manual_seed(0),
                            samples=100_000)
    assert abs(estimate.item() - exact) < 0.01


def test_gaussian_temperature_scales_the_std():
    torch.manual_seed(0)
    head, features = GaussianHead(F_DIM, 2, 1), _features(1).expand(50_000, F_DIM)
    mean, log_std = head.mean_and_log_std(features[:1])
    decision = head.sample(features, 0.5, torch.Generator().manual_seed(0))
    assert torch.allclose(decision.record.std(0), 0.5 * log_std.exp()[0], rtol=0.02)
    assert torch.allclose(decision.record.mean(0), mean[0], atol=0.01)


# --- flow -------------------------------------------------------------------------------------


def test_flow_chain_log_prob_is_the_sum_of_hand_worked_gaussian_steps():
    head = FlowHead(1, 1, 1, steps=2, hidden=4, sigma_min=0.05, sigma_max=0.45, sigma_init=0.2)
    with torch.no_grad():
        for layer in head.velocity:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.zero_()
                layer.bias.zero_()
        head.velocity[-1].bias.fill_(0.6)  # v = 0.6 everywhere: each step moves by 0.3
        head.noise_logit.copy_(torch.tensor([[0.0], [math.log(1 / 3)]]))  # sigmoid 0.5, 0.25
    sigma = (0.05 + 0.4 * 0.5, 0.05 + 0.4 * 0.25)  # 0.25, 0.15
    chain, features = torch.tensor([[0.3, 0.8, 1.1]]), torch.zeros(1, 1)
    expected = (_log_normal(0.3, 0.0, 1.0) + _log_normal(0.8, 0.3 + 0.3, sigma[0])
                + _log_normal(1.1, 0.8 + 0.3, sigma[1]))
    assert abs(head.log_prob(features, chain).item() - expected) < 1e-5
    hot = (_log_normal(0.3, 0.0, 2.0) + _log_normal(0.8, 0.6, 2 * sigma[0])
           + _log_normal(1.1, 1.1, 2 * sigma[1]))
    assert abs(head.log_prob(features, chain, temperature=2.0).item() - hot) < 1e-5
    assert torch.allclose(head.greedy(features), torch.tensor([[[0.6]]]))


@pytest.mark.parametrize("noise", ["learned", "network"])
def test_flow_chain_log_prob_step_by_step(noise):
    torch.manual_seed(0)
    head = FlowHead(F_DIM, 2, 1, steps=2, hidden=16, noise=noise)
    if noise == "network":
        torch.nn.init.normal_(head.noise_network[-1].weight, std=0.5)  # sigma varies with x
    features = _features(3)
    record = head.sample(features, generator=torch.Generator().manual_seed(1)).record
    chain = record.view(3, 3, 2)
    for row in range(3):
        f, total = features[row : row + 1], 0.0
        total += sum(_log_normal(float(x), 0.0, 1.0) for x in chain[row, 0])
        for k in range(2):
            x, t, step = chain[row, k : k + 1], torch.tensor([k / 2]), torch.tensor([k])
            mean = (x + head.velocity_at(x, t, f) / 2).detach()
            std = head.sigma_at(step, x, f).detach()
            total += sum(_log_normal(float(y), float(m), float(s))
                         for y, m, s in zip(chain[row, k + 1], mean[0], std[0], strict=True))
        assert abs(head.log_prob(f, record[row : row + 1]).item() - total) < 1e-4


def test_flow_density_matches_the_histogram_of_samples():
    torch.manual_seed(0)
    head = FlowHead(1, 1, 1, steps=1, hidden=8, sigma_init=0.3, sigma_max=0.6)
    rows, features = 100_000, torch.ones(1, 1)
    generator = torch.Generator().manual_seed(0)
    record = head.sample(features.expand(rows, 1), generator=generator).record
    x0 = torch.linspace(-6, 6, 1201)
    x1 = torch.linspace(-1.5, 1.5, 301)  # 30 bins of 0.1, 10 intervals each
    grid = torch.cartesian_prod(x1, x0)[:, [1, 0]]  # chains (x0, x1), x0 fastest
    density = head.log_prob(features.expand(len(grid), 1), grid).detach().exp().view(301, 1201)
    marginal = torch.trapezoid(density.double(), x0.double(), dim=1)  # p(x1)
    counts = torch.histc(record[:, 1].double(), bins=30, min=-1.5, max=1.5)
    mass = 0.0
    for b in range(30):
        edges = slice(10 * b, 10 * b + 11)
        p = float(torch.trapezoid(marginal[edges], x1[edges].double()))
        mass += p
        assert abs(float(counts[b]) / rows - p) < 5 * math.sqrt(p * (1 - p) / rows) + 1e-4
    assert abs(mass - float(((record[:, 1] > -1.5) & (record[:, 1] < 1.5)).float().mean())) < 0.01


def test_flow_greedy_is_the_deterministic_ode_and_temperature_scales_the_noise():
    head, features = _head("flow", {"hidden": 32}), _features(4)
    greedy = head.greedy(features)
    assert torch.equal(greedy, head.greedy(features))
    x = torch.zeros(4, H * A)
    for k in range(head.steps):
        x = x + head.velocity_at(x, torch.full((4,), k / head.steps), features) / head.steps
    assert torch.allclose(greedy, x.clamp(-1, 1).view(4, H, A), atol=1e-6)
    dim = (head.steps + 1) * H * A
    assert torch.allclose(head.entropy(features, 0.5) - head.entropy(features),
                          torch.full((4,), dim * math.log(0.5)), atol=1e-4)
    record = head.sample(_features(1).expand(20_000, F_DIM), 0.5,
                         torch.Generator().manual_seed(0)).record
    assert abs(float(record[:, : H * A].std()) - 0.5) < 0.01  # x_0 ~ N(0, T^2)


# --- every head -------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "options"), VARIANTS, ids=IDS)
def test_shapes_and_the_ratio_right_after_sampling(kind, options):
    head, features = _head(kind, options), _features()
    for temperature in (1.0, 0.6):
        decision = head.sample(features, temperature, torch.Generator().manual_seed(2))
        assert decision.actions.shape == (8, H, A)
        assert decision.record.shape == (8, head.record_dim)
        assert decision.log_prob.shape == (8,)
        assert decision.actions.abs().max() <= 1.0
        log_prob = head.log_prob(features, decision.record, temperature)
        assert torch.allclose(log_prob, decision.log_prob, atol=1e-5, rtol=0)
        reference = copy.deepcopy(head)  # k3 KL to a frozen copy is 0 on its own samples
        k3 = kl_k3(log_prob, reference.log_prob(features, decision.record, temperature))
        assert torch.allclose(k3, torch.zeros(8), atol=1e-6)
    again = head.sample(features, 0.6, torch.Generator().manual_seed(2))
    assert torch.equal(again.record, decision.record)
    assert head.greedy(features).shape == (8, H, A)
    assert head.entropy(features).shape == (8,)
    assert torch.isfinite(head.entropy(features)).all()


@pytest.mark.parametrize(("kind", "options"), VARIANTS, ids=IDS)
def test_cold_sampling_approaches_greedy(kind, options):
    head, features = _head(kind, options), _features()
    cold = head.sample(features, 1e-4, torch.Generator().manual_seed(0)).actions
    assert torch.allclose(cold, head.greedy(features), atol=1e-2)
    warm = head.sample(features, 1.0, torch.Generator().manual_seed(0)).actions
    assert not torch.allclose(warm, head.greedy(features), atol=1e-2)
    assert (head.entropy(features, 0.5) < head.entropy(features, 1.0)).all()


@pytest.mark.parametrize(("kind", "options"), VARIANTS, ids=IDS)
def test_gradients_reach_every_parameter_and_the_features(kind, options):
    head, features = _head(kind, options), _features().requires_grad_(True)
    if options.get("noise") == "network":  # its zero-initialised last layer blocks the first's
        torch.nn.init.normal_(head.noise_network[-1].weight, std=0.1)
    record = head.sample(features).record
    head.log_prob(features, record, 0.8).sum().backward()
    for name, parameter in head.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name
    assert features.grad is not None and features.grad.abs().sum() > 0


@pytest.mark.parametrize(("kind", "options"), VARIANTS, ids=IDS)
def test_behaviour_cloning_fits_a_fixed_target(kind, options):
    head, features = _head(kind, options), _features(32)
    weights = torch.randn(F_DIM, H * A, generator=torch.Generator().manual_seed(5))
    targets = torch.tanh(0.5 * features @ weights).view(32, H, A)

    def loss() -> float:
        return head.bc_loss(features, targets, torch.Generator().manual_seed(9)).item()

    def greedy_error() -> float:
        return (head.greedy(features) - targets).pow(2).mean().item()

    before, error_before = loss(), greedy_error()
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    for step in range(100):
        optimizer.zero_grad()
        head.bc_loss(features, targets, torch.Generator().manual_seed(step)).backward()
        optimizer.step()
    assert loss() < 0.6 * before
    assert greedy_error() < 0.5 * error_before


@pytest.mark.parametrize(("kind", "options"), VARIANTS, ids=IDS)
def test_bad_inputs_are_refused(kind, options):
    head, features = _head(kind, options), _features(4)
    record = head.sample(features).record
    with pytest.raises(ValueError, match=r"features of shape \(4, 5\)"):
        head.sample(features[:, :5])
    with pytest.raises(ValueError, match=r"record of shape \(4, 3\)"):
        head.log_prob(features, record[:, :3])
    with pytest.raises(ValueError, match=r"record of shape \(3, "):
        head.log_prob(features, record[:3])
    for temperature in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature="):
            head.sample(features, temperature)
        with pytest.raises(ValueError, match="temperature="):
            head.log_prob(features, record, temperature)
    with pytest.raises(ValueError, match=r"target_chunks of shape \(4, 2, 4\)"):
        head.bc_loss(features, torch.zeros(4, 2, A))
    with pytest.raises(ValueError, match=r"\|a\|=1.5"):
        head.bc_loss(features, torch.full((4, H, A), 1.5))


def test_make_head_refuses_unknown_kinds_options_and_bad_sizes():
    assert head_names()[:3] == ("tokens", "gaussian", "flow")
    with pytest.raises(ValueError, match=r"head 'diffusion' is not registered.*'tokens', "
                                         r"'gaussian', 'flow'.*plugins"):
        make_head("diffusion", 8, 2)
    for kwargs, message in [({"chunk_size": 0}, "chunk_size=0"), ({"feature_dim": True},
                            "feature_dim=True"), ({"action_dim": 2.0}, "action_dim=2.0")]:
        sizes = {"feature_dim": 8, "chunk_size": 2, "action_dim": 4, **kwargs}
        for kind in ("tokens", "gaussian", "flow"):
            with pytest.raises(ValueError, match=message):
                make_head(kind, **sizes)
    with pytest.raises(ValueError, match=r"\['steps'\] are unknown to the 'tokens'.*num_bins"):
        make_head("tokens", 8, 2, steps=3)
    with pytest.raises(ValueError, match="num_bins=1"):
        make_head("tokens", 8, 2, num_bins=1)
    with pytest.raises(ValueError, match="steps=0"):
        make_head("flow", 8, 2, steps=0)
    with pytest.raises(ValueError, match=r"noise='sde'.*'learned', 'network'"):
        make_head("flow", 8, 2, noise="sde")
    with pytest.raises(ValueError, match="sigma_min=0.0"):
        make_head("flow", 8, 2, sigma_min=0.0)
    with pytest.raises(ValueError, match="log_std_init=3.0"):
        make_head("gaussian", 8, 2, log_std_init=3.0)
    assert isinstance(make_head("flow", 8, 2, steps=3), FlowHead)
