"""The residual policy: ``a = clip(a_base(o) + scale * tanh(u), -1, 1)``, ``u ~ N(mean(f), std^2)``.

The base (the start policy: an ``mlp`` or ``tiny_vla`` of any head) is frozen and plays its
greedy chunk; a Gaussian head on the base's features (:class:`~harness.policies.heads.gaussian.
GaussianHead`, its mean layer zero-initialised) adds a bounded correction, whose pre-squash ``u``
is the decision's record. At the start the greedy residual is ``tanh(0) = 0``, so the policy's
greedy actions are the base's exactly; RL then trains the head (and a value head) only, and
whatever it does, the base is one ``scale`` away (the anchor ResiP and Policy Decorator put on a
behaviour clone). Every method of the :class:`~harness.policies.Policy` contract is answered
from the two; the base's weights live in the residual's state (``base.*``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.policies.contract import PolicySpec, frozen_copy
from harness.policies.factory import build_policy, config_from_saved
from harness.policies.head_policy import HeadPolicy
from harness.policies.heads import make_head
from harness.policies.heads.base import BCScores
from harness.policies.observations import ObsShapes
from harness.policies.residual import ResidualConfig

Observations = Mapping[str, torch.Tensor]
EDGE = 1e-3  # residual targets are kept inside (-1, 1) before the Gaussian's atanh


class ResidualPolicy(nn.Module):
    """A frozen base policy and a residual Gaussian head (see the module docstring).

    Args:
        config: The residual's config (its ``base`` config, ``scale`` and ``head``).
        obs_shapes: Shape of one observation per key.
        base: The base policy itself (its weights kept); ``None`` builds it from
            ``config.base`` (its weights then come with the residual's state).

    Raises:
        ValueError: A base that is not one of the harness's head policies.
    """

    ENTROPY_SEED = 0

    def __init__(self, config: ResidualConfig, obs_shapes: ObsShapes,
                 base: HeadPolicy | None = None) -> None:
        super().__init__()
        self.config = config
        if base is None:
            base = build_policy(config_from_saved(config.base), obs_shapes)
        if not isinstance(base, HeadPolicy):
            raise ValueError(f"a residual policy needs an mlp or tiny_vla base, not "
                             f"{type(base).__name__}")
        self.base = base
        self.base.requires_grad_(False)
        self.base.eval()
        self.obs_shapes = dict(base.obs_shapes)
        spec = base.spec
        options = {k: v for k, v in config.head.items() if k != "name"}
        self.head = make_head("gaussian", spec.feature_dim, spec.chunk_size, spec.action_dim,
                              **options)
        nn.init.zeros_(self.head.mean.weight)
        nn.init.zeros_(self.head.mean.bias)
        hidden = spec.feature_dim
        self.value_head = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(),
                                        nn.Linear(hidden, 1))

    @property
    def spec(self) -> PolicySpec:
        base = self.base.spec
        return dataclasses.replace(base, kind="residual", head="gaussian",
                                   units_per_step=self.head.units_per_step(),
                                   noise_width=self.head.noise_dim, parts_per_element=1)

    def train(self, mode: bool = True) -> ResidualPolicy:
        """The head's mode; the base stays in evaluation mode."""
        super().train(mode)
        self.base.eval()
        return self

    # --- acting and scoring -------------------------------------------------------------------

    def features(self, obs: Observations) -> torch.Tensor:
        """The frozen base's features (no gradient reaches the base)."""
        with torch.no_grad():
            return self.base.features(obs)

    def _base_actions(self, features: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.base.head.greedy(features)

    def _combine(self, base: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return (base + self.config.scale * residual).clamp(-1.0, 1.0)

    @torch.no_grad()
    def act(self, obs: Observations, deterministic: bool = False, temperature: float = 1.0,
            uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The base's greedy chunk plus the residual's sample (or its greedy ``tanh(mean)``).

        Raises:
            ValueError: ``temperature <= 0`` when sampling.
        """
        features = self.features(obs)
        base = self._base_actions(features)
        if deterministic:
            record, residual = self.head.greedy_decision(features)
            return record, self._combine(base, residual)
        if temperature <= 0:
            raise ValueError(
                f"temperature={temperature} must be > 0 when sampling; use deterministic=True")
        noise = None if uniforms is None else self.head.noise_from_uniforms(uniforms)
        decision = self.head.sample(features, temperature, noise=noise)
        return decision.record, self._combine(base, decision.actions)

    def log_prob(self, obs: Observations, records: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """The residual's per-entry log-densities ``(B, H * A)`` (the base's part of the
        action is deterministic)."""
        return self.head.unit_log_probs(self.features(obs), records, temperature)

    def log_prob_parts(self, obs: Observations, records: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        return self.head.log_prob_parts(self.features(obs), records, temperature)

    def entropy(self, obs: Observations, temperature: float = 1.0) -> torch.Tensor:
        generator = torch.Generator(device=next(self.head.parameters()).device)
        generator.manual_seed(self.ENTROPY_SEED)
        return self.head.unit_entropy(self.features(obs), temperature, generator)

    def value(self, obs: Observations) -> torch.Tensor:
        return self.value_head(self.features(obs)).squeeze(-1)

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.value_head.parameters())

    def exploration(self) -> dict[str, float]:
        """The residual Gaussian's std."""
        return self.head.exploration()

    def bound_exploration(self, low: float | None, high: float | None,
                          fixed: float | None) -> None:
        """Bound (or fix) the residual's std; the config keeps the bounds."""
        options = self.head.bound_noise(low, high, fixed)
        self.config = dataclasses.replace(self.config, head={**self.config.head, **options})

    # --- behaviour cloning: the residual that takes the base to the demonstrated actions ------

    def _residual_targets(self, features: torch.Tensor, target_chunks: torch.Tensor
                          ) -> torch.Tensor:
        residual = (target_chunks - self._base_actions(features)) / self.config.scale
        return residual.clamp(-1.0 + EDGE, 1.0 - EDGE)

    def bc_loss(self, obs: Observations, target_chunks: torch.Tensor,
                valid: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """The residual head's likelihood of the residual from the base's greedy chunk to the
        demonstrated one (clamped to the residual's range)."""
        features = self.features(obs)
        targets = self._residual_targets(features, target_chunks)
        return self.head.bc_loss(features, targets, generator, valid)

    def bc_scores(self, obs: Observations, target_chunks: torch.Tensor,
                  valid: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> BCScores:
        features = self.features(obs)
        targets = self._residual_targets(features, target_chunks)
        return self.head.bc_scores(features, targets, valid, generator)

    def fit_normalizer(self, obs: Observations) -> dict[str, float]:
        """Nothing: the base keeps its own."""
        return {}

    # --- fine-tuning --------------------------------------------------------------------------

    def frozen_reference(self) -> ResidualPolicy:
        return frozen_copy(self)

    def freeze_encoder(self) -> None:
        """Nothing to do: the whole base is frozen."""

    def encode_frozen(self, obs: Observations) -> dict[str, torch.Tensor]:
        """The base's encoding of the frames (its features read ``image_features``)."""
        return self.base.encode_frozen(obs)

    # --- saving -------------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        from harness.policies.saving import save_policy

        save_policy(path, self)

    def save_pretrained(self, folder: str | Path) -> Path | None:
        return None

    def export_graph(self, keys: tuple[str, ...]) -> nn.Module:
        """The greedy graph from the arrays ``keys`` to ``actions``: the base's greedy chunk
        plus ``scale * tanh(mean)``, clipped to ``[-1, 1]``."""
        return _GreedyResidualGraph(self, keys)

    def export_record(self) -> dict[str, Any]:
        """``actions`` only (a continuous action, whatever the base's head), the sizes, the
        greedy rule and the base head's own record."""
        base = self.base.export_record()
        return {"action_head": "residual", "outputs": ["actions"],
                "action_dim": base["action_dim"], "chunk_size": base["chunk_size"],
                "execute_steps": base["execute_steps"],
                "greedy_rule": f"clip(the base's greedy chunk + {self.config.scale:g} "
                               "tanh(mean), -1, 1)",
                "base": base}

    @staticmethod
    def migrate_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state


class _GreedyResidualGraph(nn.Module):
    """The residual's greedy actions from the observation arrays as positional inputs; a chunk
    of one keeps the ``(B, action_dim)`` of a single action, as the base's graph does."""

    def __init__(self, policy: ResidualPolicy, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.policy, self.keys = policy, tuple(keys)
        self.base_actions_at = policy.base.head.export_outputs.index("actions")

    def forward(self, *arrays: torch.Tensor) -> tuple[torch.Tensor]:
        policy = self.policy
        features = policy.features(dict(zip(self.keys, arrays, strict=True)))
        base = policy.base.head.export_graph(features)[self.base_actions_at]  # any batch size
        actions = policy._combine(base, policy.head.greedy(features))
        if actions.shape[1] == 1:
            return (actions.view(-1, actions.shape[-1]),)
        return (actions,)


def residual_of(base: HeadPolicy, scale: float, head: dict[str, Any] | None = None
                ) -> ResidualPolicy:
    """The residual policy on ``base`` (kept as it is, frozen): what ``algo.residual`` makes of
    the start policy.

    Raises:
        ValueError: A base that is not an mlp or tiny_vla policy, or a bad scale.
    """
    config = ResidualConfig(base=base.config.to_saved(), scale=float(scale),
                            head=dict(head) if head else {"name": "gaussian",
                                                          "log_std_init": -1.0})
    device = next(base.parameters()).device
    return ResidualPolicy(config, base.obs_shapes, base=base).to(device)
