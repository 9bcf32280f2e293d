"""Plugins: an action head written in a module outside the package, registered from
``plugins=[module]``, trains with ``grpo`` and ``vla_ppo`` on ``mlp`` and ``tiny_vla`` (in this
process and in spawned rollout workers), saves, resumes to the uninterrupted run, and loads in a
fresh interpreter that imports the module because the saved policy names it. No file under
``harness/`` knows the head."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest

from harness import config as harness_config
from harness import trainers
from harness.config.errors import ConfigError
from harness.policies import registry
from harness_common.files import read_metrics

# A tanh-squashed diagonal Laplace over the chunk, as RIPT-VLA puts on OpenVLA-OFT: one unit per
# chunk entry, drawn from the rows' own uniforms by the Laplace inverse CDF.
LAPLACE = textwrap.dedent('''
    import math

    import torch
    from torch import nn

    from harness.policies import register_head
    from harness.policies.heads import ActionHead, Decision
    from harness.policies.heads.gaussian import log1m_tanh_squared


    class LaplaceHead(ActionHead):
        def __init__(self, feature_dim, chunk_size, action_dim=4, *, log_scale_init=-1.0):
            super().__init__(feature_dim, chunk_size, action_dim)
            self.record_dim = self.noise_dim = self.chunk_dim
            self.loc = nn.Linear(feature_dim, self.chunk_dim)
            self.log_scale = nn.Parameter(torch.full((self.chunk_dim,), float(log_scale_init)))

        def _entries(self, u, features, temperature):
            scale = temperature * self.log_scale.exp()
            return (-(u - self.loc(features)).abs() / scale - torch.log(2 * scale)
                    - log1m_tanh_squared(u))

        def noise_from_uniforms(self, uniforms):
            return uniforms

        @torch.no_grad()
        def sample(self, features, temperature=1.0, generator=None, noise=None):
            loc = self.loc(features)
            if noise is None:
                noise = torch.rand(loc.shape, generator=generator, device=loc.device)
            p = noise.to(loc).clamp(1e-6, 1 - 1e-6) - 0.5
            u = loc - temperature * self.log_scale.exp() * torch.sign(p) * torch.log1p(
                -2 * p.abs())
            actions = torch.tanh(u).view(-1, self.chunk_size, self.action_dim)
            return Decision(actions, u, self._entries(u, features, temperature).sum(-1))

        def unit_log_probs(self, features, record, temperature=1.0):
            return self._entries(self.check_record(features, record), features, temperature)

        def log_prob(self, features, record, temperature=1.0):
            return self.unit_log_probs(features, record, temperature).sum(-1)

        def units_per_step(self):
            return self.action_dim

        def greedy(self, features):
            return torch.tanh(self.loc(features)).view(-1, self.chunk_size, self.action_dim)

        def bc_loss(self, features, target_chunks, generator=None, valid=None):
            targets = self.check_targets(features, target_chunks).flatten(1)
            u = torch.atanh(targets.clamp(-0.999, 0.999))
            weights = self.step_weights(features, valid)
            return -(self._entries(u, features, 1.0) * weights).sum() / weights.sum()

        def unit_entropy(self, features, temperature=1.0, generator=None):
            scale = temperature * self.log_scale.exp()
            return (1 + torch.log(2 * scale)).expand(len(features), -1)

        def entropy(self, features, temperature=1.0, generator=None):
            return self.unit_entropy(features, temperature).sum(-1)


    register_head("laplace", LaplaceHead)
''')

STATE = ["task=reach", "task.obs_mode=state", "task.difficulty=0.05", "task.max_episode_steps=12",
         "policy=mlp", "policy.hidden=16"]
PIXELS = ["task=reach", "task.obs_mode=pixels", "task.image_size=24", "task.difficulty=0.05",
          "task.max_episode_steps=10", "policy=tiny_vla", "policy.hidden=16",
          "policy.conv_channels=[4,4]"]
SMALL = ["algo.group_size=3", "algo.num_start_states=2", "algo.minibatch_size=3",
         "algo.start_policy.bc.demos=2", "algo.start_policy.bc.epochs=2", "eval.every_steps=0",
         "eval.final_episodes=3",
         "eval.episodes=2", "logger=none"]
OPERATIONAL = ("time/", "rollout/worker_restarts", "bc/seconds", "pretrain/seconds")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A module of the user's own, importable as ``my_laplace`` (as if on PYTHONPATH)."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "my_laplace.py").write_text(LAPLACE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(registry, "_HEADS", dict(registry._HEADS))  # forgotten after the test
    yield folder
    sys.modules.pop("my_laplace", None)


def _run(tmp_path, name: str, *overrides: str) -> tuple[dict, dict]:
    config = harness_config.compose([*overrides, "plugins=[my_laplace]", "policy/head=laplace",
                                     *SMALL])
    summary = trainers.train(config, tmp_path / name)
    metrics = read_metrics(tmp_path / name / "metrics.csv")
    return summary, {k: v for k, v in metrics.items() if not k.startswith(OPERATIONAL)}


@pytest.mark.parametrize(("inputs", "algo"), [(STATE, "grpo"), (STATE, "vla_ppo"),
                                              (PIXELS, "grpo"), (PIXELS, "vla_ppo")],
                         ids=["mlp-grpo", "mlp-vla_ppo", "tiny_vla-grpo", "tiny_vla-vla_ppo"])
def test_a_plugin_head_trains_saves_and_resumes(plugin, tmp_path, inputs, algo):
    overrides = [*inputs, f"algo={algo}", "policy.chunk_size=2"]
    straight, straight_metrics = _run(tmp_path, "straight", *overrides, "algo.iterations=2")
    assert straight["iterations"] == 2 and 0.0 <= straight["success_rate"] <= 1.0
    assert all(math.isfinite(v) for _, v in straight_metrics["train/loss"])
    assert all(math.isfinite(v) for _, v in straight_metrics["bc/train_loss"])
    _run(tmp_path, "resumed", *overrides, "algo.iterations=1")
    resumed, resumed_metrics = _run(tmp_path, "resumed", *overrides, "algo.iterations=2",
                                    "resume=true")
    assert resumed["success_rate"] == straight["success_rate"]
    last = {k: v[-1:] if k.startswith("final") else v for k, v in resumed_metrics.items()}
    assert last == straight_metrics


def test_a_plugin_head_plays_in_spawned_workers_and_loads_where_it_was_never_imported(
        plugin, tmp_path):
    one, one_metrics = _run(tmp_path, "one", *STATE, "algo=grpo", "algo.iterations=1")
    two, two_metrics = _run(tmp_path, "two", *STATE, "algo=grpo", "algo.iterations=1",
                            "algo.workers=2")
    assert two_metrics == one_metrics and two["success_rate"] == one["success_rate"]
    start = tmp_path / "one" / "start_policy.pt"
    script = ("import sys; from harness.policies import load_policy; "
              f"p = load_policy({str(start)!r}); "
              "print(type(p.head).__name__, p.spec.head, 'my_laplace' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(plugin)},
                           check=True).stdout.split()
    assert shown == ["LaplaceHead", "laplace", "True"]


def test_a_plugin_heads_options_are_checked_like_the_built_in_ones(plugin):
    base = [*STATE, "algo=grpo", "plugins=[my_laplace]", "policy/head=laplace"]
    config = harness_config.compose(base)
    assert config.policy.head == {"name": "laplace", "log_scale_init": -1.0}
    assert config.plugins == ["my_laplace"]
    with pytest.raises(ConfigError, match=r"\['steps'\] that the 'laplace' head does not take"):
        harness_config.compose([*base, "+policy.head.steps=3"])
    with pytest.raises(ConfigError, match=r"plugins: cannot import 'no_such_module'"):
        harness_config.compose([*STATE, "algo=grpo", "plugins=[no_such_module]"])
