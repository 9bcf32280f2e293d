"""Ratio units (``algo.ratio``): the cuts of a decision's log-probability, by hand; the heads'
parts; bounded exploration; the target-KL stop, the critic's warm-up and the BC anchor in real
(tiny) runs, which resume to the uninterrupted run."""

from __future__ import annotations

import importlib
import json
import math

import pytest
import torch

from harness import config as harness_config
from harness import trainers
from harness.config.errors import ConfigError
from harness.objectives import max_ratio_units, policy_loss, ratio_unit_mask, ratio_units
from harness.policies.heads import make_head
from harness_common.files import read_metrics

training_diagnostics = importlib.import_module("studies.training_diagnostics")

# One decision, P = 2 parts, H = 2 chunk entries, W = 2 action dimensions; it played entry 0.
PARTS = torch.tensor([[[[-1.0, -2.0], [-3.0, -4.0]],
                       [[-0.5, -0.5], [-1.0, -1.0]]]])
PLAYED = torch.tensor([1])


# --- the cuts, by hand -------------------------------------------------------------------------

def test_element_units_sum_each_elements_parts():
    # entry 0: (-1 - 0.5, -2 - 0.5); entry 1: (-3 - 1, -4 - 1); only entry 0 was played
    units = ratio_units(PARTS, PLAYED, "element")
    assert units.tolist() == [[-1.5, -2.5, -4.0, -5.0]]
    assert ratio_unit_mask(PLAYED, "element", 2, 2, 2).tolist() == [[True, True, False, False]]
    # normalised: each element sums P = 2 parts
    assert ratio_units(PARTS, PLAYED, "element", normalize=True).tolist() == [
        [-0.75, -1.25, -2.0, -2.5]]
    # then clamped to [-1, 1] (ReinFlow's bounds)
    assert ratio_units(PARTS, PLAYED, "element", normalize=True, clamp=(-1.0, 1.0)).tolist() == [
        [-0.75, -1.0, -1.0, -1.0]]


def test_chain_element_units_are_the_parts_part_major():
    units = ratio_units(PARTS, PLAYED, "chain_element")
    assert units.tolist() == [[-1.0, -2.0, -3.0, -4.0, -0.5, -0.5, -1.0, -1.0]]
    assert ratio_unit_mask(PLAYED, "chain_element", 2, 2, 2).tolist() == [
        [True, True, False, False, True, True, False, False]]


def test_step_units_sum_an_entrys_parts_and_dimensions():
    # entry 0: -1 - 2 - 0.5 - 0.5 = -4; entry 1: -3 - 4 - 1 - 1 = -9; normalised by P W = 4
    assert ratio_units(PARTS, PLAYED, "step").tolist() == [[-4.0, -9.0]]
    assert ratio_units(PARTS, PLAYED, "step", normalize=True).tolist() == [[-1.0, -2.25]]
    assert ratio_unit_mask(PLAYED, "step", 2, 2, 2).tolist() == [[True, False]]


def test_decision_units_sum_the_played_entries_only():
    assert ratio_units(PARTS, PLAYED, "decision").tolist() == [[-4.0]]
    # normalised by P W x (entries played) = 2 x 2 x 1
    assert ratio_units(PARTS, PLAYED, "decision", normalize=True).tolist() == [[-1.0]]
    both = ratio_units(PARTS, torch.tensor([2]), "decision", normalize=True)
    assert both.tolist() == [[-13.0 / 8.0]]
    assert ratio_unit_mask(PLAYED, "decision", 2, 2, 2).tolist() == [[True]]


def test_dr_grpo_constant_counts_the_units_of_a_full_attempt():
    # 60 control steps, decisions playing 2 of a chunk; P = 5 parts, W = 4 dimensions
    assert max_ratio_units("element", 60, 2, 5, 4) == 240
    assert max_ratio_units("chain_element", 60, 2, 5, 4) == 1200
    assert max_ratio_units("step", 60, 2, 5, 4) == 60
    assert max_ratio_units("decision", 60, 2, 5, 4) == 30
    assert max_ratio_units("decision", 61, 2, 5, 4) == 31


def test_unknown_units_and_shapes_are_refused_by_name():
    with pytest.raises(ValueError, match="unit='token'"):
        ratio_units(PARTS, PLAYED, "token")
    with pytest.raises(ValueError, match=r"expected \(N, P, H, W\)"):
        ratio_units(PARTS[0], PLAYED, "element")
    with pytest.raises(ValueError, match="unit='native'"):
        ratio_unit_mask(PLAYED, "native", 2, 2, 2)


def test_each_element_is_clipped_on_its_own():
    """Old element log-probs (-0.75, -1.25), new (-0.5, -1.25), advantage +1, clip 0.2/0.28:
    the first ratio is e^0.25 = 1.2840 > 1.28 and is clipped, the second is 1. GRPO's loss is
    -(1.28 + 1) / 2 = -1.14; one decision unit would have ratio e^0.25 on both elements' sum."""
    new = torch.tensor([[-0.5, -1.25]], requires_grad=True)
    old = torch.tensor([[-0.75, -1.25]])
    loss, stats = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.14, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    assert stats["ratio_max"] == pytest.approx(math.exp(0.25), rel=1e-6)
    assert stats["ratio_min"] == pytest.approx(1.0)
    loss.backward()
    assert new.grad.tolist() == [[0.0, -0.5]]  # the clipped element gives no gradient


# --- the heads' parts ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, options, parts_per_element", [
    ("tokens", {}, 1), ("gaussian", {}, 1), ("flow", {"steps": 3, "hidden": 16}, 4)])
def test_each_heads_parts_sum_to_its_log_prob(name, options, parts_per_element):
    torch.manual_seed(0)
    head = make_head(name, 8, 3, 2, **options)
    features = torch.randn(5, 8)
    record = head.sample(features, temperature=1.3).record
    parts = head.log_prob_parts(features, record, 1.3)
    assert parts.shape == (5, parts_per_element, 3, 2) and head.parts_per_element == \
        parts_per_element
    torch.testing.assert_close(parts.sum(dim=(1, 2, 3)), head.log_prob(features, record, 1.3),
                               rtol=1e-5, atol=1e-4)


def test_flow_chain_elements_are_per_step_gaussians():
    """Row 0 of a flow's parts is the start's ``log N(x_0; 0, T^2)``, entry by entry."""
    torch.manual_seed(1)
    head = make_head("flow", 6, 2, 2, steps=2, hidden=8)
    features = torch.randn(3, 6)
    record = head.sample(features, temperature=0.5).record
    x0 = record.view(3, 3, 4)[:, 0]
    start = -0.5 * (x0 / 0.5) ** 2 - math.log(0.5) - 0.5 * math.log(2 * math.pi)
    torch.testing.assert_close(head.log_prob_parts(features, record, 0.5)[:, 0].flatten(1), start)


# --- bounded exploration -------------------------------------------------------------------------

def test_gaussian_bounds_keep_the_std_inside_and_clamp_the_rest():
    head = make_head("gaussian", 4, 1, 2, log_std_init=math.log(0.3))
    with torch.no_grad():
        head.log_std.copy_(torch.log(torch.tensor([0.3, 0.05])))
    options = head.bound_noise(0.08, 0.16, None)
    assert head.exploration() == pytest.approx({"std_mean": 0.12, "std_min": 0.08,
                                                "std_max": 0.16})
    assert options["log_std_min"] == pytest.approx(math.log(0.08))
    assert head.log_std.requires_grad
    head.bound_noise(None, None, 0.1)
    assert head.exploration() == pytest.approx({"std_mean": 0.1, "std_min": 0.1, "std_max": 0.1})
    assert not head.log_std.requires_grad


def test_flow_bounds_keep_a_scale_inside_them():
    head = make_head("flow", 4, 1, 2, steps=2, hidden=8)  # sigma_init 0.1
    head.bound_noise(0.08, 0.16, None)
    assert head.exploration() == pytest.approx({"std_mean": 0.1, "std_min": 0.1,
                                                "std_max": 0.1}, rel=1e-5)
    head.bound_noise(0.12, 0.16, None)
    assert head.exploration()["std_min"] == pytest.approx(0.12, rel=1e-3)
    head.bound_noise(None, None, 0.2)
    assert head.exploration()["std_mean"] == pytest.approx(0.2, rel=1e-5)
    assert not head.noise_logit.requires_grad
    with pytest.raises(ValueError, match="algo.exploration.fixed"):
        head.bound_noise(0.1, 0.1, None)


def test_a_tokens_head_has_no_noise_to_bound():
    with pytest.raises(ValueError, match="algo.temperature"):
        make_head("tokens", 4, 1, 2).bound_noise(0.1, 0.2, None)


@pytest.mark.parametrize("overrides, message", [
    (["algo.ratio.unit=token"], "algo.ratio.unit='token'"),
    (["algo.ratio.normalize=true"], "algo.ratio.unit to decision"),
    (["algo.ratio.unit=element", "algo.ratio.clamp=[1,-1]"], "algo.ratio.clamp"),
    (["algo.exploration.fixed=0.1", "algo.exploration.low=0.05"], "leave low and high null"),
    (["algo.target_kl=0"], "algo.target_kl=0"),
    (["algo.bc_coef=0.1"], "algo.bc_coef=0.1 anchors"),
    (["algo.critic.warmup_iterations=2"], "algo.name='grpo' has none"),
])
def test_bad_settings_are_refused_by_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        harness_config.compose(["algo=grpo", *overrides])


# --- in real runs --------------------------------------------------------------------------------

STATE = ["task=reach", "task.obs_mode=state", "task.difficulty=0.05", "task.max_episode_steps=12",
         "policy=mlp", "policy.hidden=16", "policy.chunk_size=4", "policy.execute_steps=2"]
SMALL = ["algo.group_size=3", "algo.num_start_states=2", "algo.minibatch_size=3",
         "algo.start_policy.bc.demos=2", "algo.start_policy.bc.epochs=2", "eval.every_steps=0",
         "eval.final_episodes=3", "eval.episodes=2", "logger=none", "seed=5"]
OPERATIONAL = ("time/", "rollout/worker_restarts", "bc/seconds", "pretrain/seconds")


def _run(tmp_path, name: str, *overrides: str) -> tuple[dict, dict]:
    """The run's summary and its metrics as ``{key: [value, ...]}``."""
    config = harness_config.compose([*STATE, *SMALL, *overrides])
    summary = trainers.train(config, tmp_path / name)
    series = read_metrics(tmp_path / name / "metrics.csv")
    return summary, {key: [value for _, value in rows] for key, rows in series.items()}


def _same_metrics(straight: dict, resumed: dict) -> None:
    for key, values in straight.items():
        if not key.startswith(OPERATIONAL):
            assert resumed[key] == values, key


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))


def test_flow_element_ratios_bounded_noise_and_bc_anchor_train_and_resume(tmp_path, data_dir):
    """A flow head with per-element, step-averaged ratios, bounded noise and the BC anchor:
    it trains, logs its diagnostics, and a resume replays the uninterrupted run."""
    overrides = ("policy/head=flow", "policy.head.steps=2", "algo=grpo",
                 "algo.ratio.unit=element", "algo.ratio.normalize=true",
                 "algo.exploration.low=0.08", "algo.exploration.high=0.16",
                 "algo.bc_coef=0.5", "algo.bc_batch=8", "algo.num_iterations=2")
    straight, metrics = _run(tmp_path, "straight", *overrides, "algo.iterations=2")
    assert straight["bounded_exploration/std_mean"] == pytest.approx(0.1, rel=1e-4)
    assert all(0.08 <= v <= 0.16 for v in metrics["train/std_min"] + metrics["train/std_max"])
    assert all(v > 0 for v in metrics["train/bc_loss"])
    assert {"train/ratio_std", "train/kl_to_reference_decision"} <= set(metrics)
    out = tmp_path / "study"
    assert training_diagnostics.main([str(tmp_path / "straight"), "--labels", "flow",
                                      "--out", str(out)]) == 0
    figures = json.loads((out / "training_diagnostics.json").read_text())["flow"]
    assert figures["train/std_mean"]["last"] == pytest.approx(metrics["train/std_mean"][-1])
    assert (out / "training_diagnostics.png").stat().st_size > 10_000
    _run(tmp_path, "resumed", *overrides, "algo.iterations=1")
    _, resumed = _run(tmp_path, "resumed", *overrides, "algo.iterations=2", "resume=true")
    _same_metrics({k: v for k, v in metrics.items() if not k.startswith(("start", "final"))},
                  {k: v for k, v in resumed.items() if not k.startswith(("start", "final"))})


def test_target_kl_stops_the_epochs_early(tmp_path, data_dir):
    # the critic estimator's r - V(s0) carries signal even when every attempt fails
    common = ("policy/head=gaussian", "algo=critic", "algo.num_iterations=4",
              "algo.learning_rate=0.05", "algo.iterations=1")
    _, free = _run(tmp_path, "free", *common)
    _, stopped = _run(tmp_path, "stopped", *common, "algo.target_kl=1e-9")
    assert free["train/gradient_steps"] == [8.0]
    assert stopped["train/early_stop"] == [1.0]
    assert stopped["train/gradient_steps"][0] < 8.0


def test_critic_warmup_moves_the_value_network_alone(tmp_path, data_dir):
    """vla_ppo's first iteration trains the value network alone: the policy that samples the
    second iteration is still the start (its KL to the reference is exactly 0), while without
    a warm-up it has moved."""
    common = ("policy/head=gaussian", "algo=vla_ppo", "algo.iterations=2",
              "algo.learning_rate=0.01", "algo.critic.network=separate")
    _, warm = _run(tmp_path, "warm", *common, "algo.critic.warmup_iterations=1",
                   "algo.critic.learning_rate=0.01")
    _, cold = _run(tmp_path, "cold", *common)
    assert warm["train/critic_warmup"] == [1.0, 0.0]
    assert warm["train/kl_to_reference"] == [0.0, 0.0]
    assert cold["train/kl_to_reference"][1] > 0.0
    assert all(v > 0 for v in warm["train/value_loss"])


@pytest.mark.parametrize("changed", [("policy/head=gaussian", "algo.exploration.fixed=3.0"),
                                     ("algo.temperature=0.05",)])
def test_the_starts_sampled_baseline_is_the_clones_own_distribution(tmp_path, data_dir, changed):
    """Bounding the noise or sampling rollouts colder changes how the policy samples (its final
    sampled figure), not the start's sampled figures the gains are measured against."""
    head = [o for o in changed if o.startswith("policy/")]
    common = (*head, "algo=grpo", "algo.iterations=1", "eval.final_episodes=20")
    plain, _ = _run(tmp_path, "plain", *common)
    bounded, _ = _run(tmp_path, "bounded", *common, *changed)
    assert bounded["start_sampled_success_rate"] == plain["start_sampled_success_rate"]
    assert bounded["start_success_rate"] == plain["start_success_rate"]
    assert bounded["sampled_success_rate"] != plain["sampled_success_rate"]
