"""The harness's own networks (``mlp``, ``tiny_vla``): an encoder composed with an action head.

A subclass encodes observations into a ``(B, hidden)`` feature (:meth:`HeadPolicy.features`);
the action head (any registered :class:`~harness.policies.heads.ActionHead`: ``tokens``,
``gaussian``, ``flow`` or a plugin's) turns it into a chunk of actions, and a small value head
reads it too. Everything the :class:`~harness.policies.Policy` contract asks is answered here
from the two.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.policies.contract import PolicySpec, frozen_copy
from harness.policies.heads import make_head
from harness.policies.heads.base import ActionHead, BCScores
from harness.policies.observations import ObsShapes

Observations = Mapping[str, torch.Tensor]


class HeadPolicy(nn.Module):
    """An encoder (the subclass's :meth:`features`) with an action head and a value head.

    Args:
        config: The kind's config (``policy.hidden``, ``chunk_size``, ``execute_steps``,
            ``action_dim`` and ``head`` are read here).
        obs_shapes: Shape of one observation per key, without the batch dimension.
    """

    ENTROPY_SEED = 0  # the Monte-Carlo parts of a head's entropy draw from a fixed stream
    INPUT_KEY = "state"  # the observation a subclass encodes (the first input of an export)

    def __init__(self, config, obs_shapes: ObsShapes) -> None:
        super().__init__()
        self.config = config
        self.obs_shapes = {k: tuple(int(d) for d in v) for k, v in obs_shapes.items()}
        self.head: ActionHead = make_head(config.head_name, config.hidden, config.chunk_size,
                                          config.action_dim, **config.head_options())
        # The critic baseline V(s0) is a separate small MLP on the shared features.
        self.value_head = nn.Sequential(
            nn.Linear(config.hidden, config.hidden), nn.Tanh(), nn.Linear(config.hidden, 1)
        )

    @abstractmethod
    def features(self, obs: Observations) -> torch.Tensor:
        """Batched observation dict -> ``(B, hidden)`` features."""

    @property
    def input_keys(self) -> tuple[str, ...]:
        """The observation keys the network reads, in an export's order."""
        return (self.INPUT_KEY,)

    @property
    def spec(self) -> PolicySpec:
        config = self.config
        return PolicySpec(
            kind=config.name, head=config.head_name, chunk_size=config.chunk_size,
            execute_steps=config.steps_per_decision, action_dim=config.action_dim,
            units_per_step=self.head.units_per_step(), noise_width=self.head.noise_dim,
            feature_dim=config.hidden, input_keys=self.input_keys,
            parts_per_element=self.head.parts_per_element)

    # --- acting and scoring -------------------------------------------------------------------

    @torch.no_grad()
    def act(self, obs: Observations, deterministic: bool = False, temperature: float = 1.0,
            uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A decision per row (see :meth:`harness.policies.Policy.act`): the head's sample at
        ``temperature`` from ``uniforms`` (``(B, noise_width)``, converted by the head), or its
        greedy chunk.

        Raises:
            ValueError: ``temperature <= 0`` when sampling.
        """
        features = self.features(obs)
        if deterministic:
            return self.head.greedy_decision(features)
        if temperature <= 0:
            raise ValueError(
                f"temperature={temperature} must be > 0 when sampling; use deterministic=True")
        noise = None if uniforms is None else self.head.noise_from_uniforms(uniforms)
        decision = self.head.sample(features, temperature, noise=noise)
        return decision.record, decision.actions

    def log_prob(self, obs: Observations, records: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """The head's per-unit log-probabilities ``(B, U)`` of ``records`` at ``temperature``."""
        return self.head.unit_log_probs(self.features(obs), records, temperature)

    def log_prob_parts(self, obs: Observations, records: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        """The head's log-density parts ``(B, P, H, A)`` of ``records`` at ``temperature``."""
        return self.head.log_prob_parts(self.features(obs), records, temperature)

    def exploration(self) -> dict[str, float]:
        """The head's noise figures (its std or noise scales)."""
        return self.head.exploration()

    def bound_exploration(self, low: float | None, high: float | None,
                          fixed: float | None) -> None:
        """Bound (or fix) the head's noise scale (``algo.exploration``); the policy's config
        records the new bounds, so a saved policy reloads with them.

        Raises:
            ValueError: A head without a noise scale, or bounds it refuses.
        """
        options = self.head.bound_noise(low, high, fixed)
        self.config = dataclasses.replace(self.config, head={**self.config.head, **options})

    def entropy(self, obs: Observations, temperature: float = 1.0) -> torch.Tensor:
        """The head's per-unit entropy ``(B, U)``; Monte-Carlo parts from a fixed seed, so the
        figure repeats."""
        generator = torch.Generator(device=next(self.parameters()).device)
        generator.manual_seed(self.ENTROPY_SEED)
        return self.head.unit_entropy(self.features(obs), temperature, generator)

    def value(self, obs: Observations) -> torch.Tensor:
        """Value estimate ``(B,)``, for a critic on ``V(s0)`` or vla_ppo's shared critic."""
        return self.value_head(self.features(obs)).squeeze(-1)

    def value_parameters(self) -> list[nn.Parameter]:
        """The value head's parameters."""
        return list(self.value_head.parameters())

    # --- behaviour cloning --------------------------------------------------------------------

    def bc_loss(self, obs: Observations, target_chunks: torch.Tensor,
                valid: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """The head's behaviour-cloning loss of demonstrated chunks ``(B, H, A)``."""
        return self.head.bc_loss(self.features(obs), target_chunks, generator, valid)

    def bc_scores(self, obs: Observations, target_chunks: torch.Tensor,
                  valid: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> BCScores:
        """The head's held-out figures of a batch of demonstrated chunks."""
        return self.head.bc_scores(self.features(obs), target_chunks, valid, generator)

    def fit_normalizer(self, obs: Observations) -> dict[str, float]:
        """Fit the input normalisation to demos; a network without one ignores it.

        Returns:
            Figures for the log (empty when nothing was fitted).
        """
        return {}

    # --- fine-tuning --------------------------------------------------------------------------

    def frozen_reference(self) -> HeadPolicy:
        """The policy as it is now, frozen (a deep copy in eval mode): the KL reference."""
        return frozen_copy(self)

    def freeze_encoder(self) -> None:
        """Raises: ValueError: this network has no image encoder to freeze."""
        raise ValueError(f"algo.freeze_encoder=true needs a policy with an image encoder "
                         f"(policy=tiny_vla); policy={self.config.name!r} has none")

    def encode_frozen(self, obs: Observations) -> dict[str, torch.Tensor]:
        """``obs`` unchanged: nothing is frozen."""
        return dict(obs)

    # --- saving and export --------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write the policy to ``path`` (:func:`harness.policies.saving.save_policy`)."""
        from harness.policies.saving import save_policy

        save_policy(path, self)

    def save_pretrained(self, folder: str | Path) -> Path | None:
        """``None``: these networks have no model-folder format."""
        return None

    def export_graph(self, keys: tuple[str, ...]) -> nn.Module:
        """The greedy graph from the arrays ``keys`` to the head's export outputs."""
        return _GreedyGraph(self, keys)

    def export_record(self) -> dict[str, Any]:
        """The outputs, the action sizes and the head's rule (bins, or its greedy rule)."""
        config = self.config
        return {"action_head": config.head_name, "outputs": list(self.head.export_outputs),
                "action_dim": config.action_dim, "chunk_size": config.chunk_size,
                "execute_steps": config.steps_per_decision, **self.head.export_record()}

    @staticmethod
    def migrate_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Weights saved before the tokens head was a head of its own (policy format 1): its
        linear layer was ``action_head``; it is ``head.linear`` now."""
        return {("head.linear." + k[len("action_head."):] if k.startswith("action_head.")
                 else k): v for k, v in state.items()}


class _GreedyGraph(nn.Module):
    """``policy.features`` then the head's :meth:`~harness.policies.heads.ActionHead.
    export_graph`, taking the observation arrays as positional inputs; ``actions`` of a chunk
    of one keep the ``(B, action_dim)`` of a single action."""

    def __init__(self, policy: HeadPolicy, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.policy, self.keys = policy, tuple(keys)
        self.actions_at = policy.head.export_outputs.index("actions")

    def forward(self, *arrays: torch.Tensor) -> tuple[torch.Tensor, ...]:
        features = self.policy.features(dict(zip(self.keys, arrays, strict=True)))
        outputs = list(self.policy.head.export_graph(features))
        if self.policy.config.chunk_size == 1:
            outputs[self.actions_at] = outputs[self.actions_at].view(
                -1, self.policy.config.action_dim)
        return tuple(outputs)
