"""The ``mlp`` network: a two-layer MLP on the ``state`` vector (and the instruction), with any
action head (:class:`~harness.policies.head_policy.HeadPolicy`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from harness.policies.head_policy import HeadPolicy
from harness.policies.layers import InstructionEncoder
from harness.policies.observations import ObsShapes


class MLPPolicy(HeadPolicy):
    """Two-layer tanh MLP on ``state``, concatenated with the mean instruction embedding.

    With ``normalize_state``, ``state`` is first standardised by the buffers ``state_mean`` and
    ``state_std`` (identity until :meth:`fit_normalizer`). Positions in metres vary by
    centimetres between the states a push expert treats differently; unscaled, they barely move
    a tanh layer's pre-activations.
    """

    MIN_STD = 1e-2  # floor of a dimension's standard deviation (state units: m, rad, m/s)

    def __init__(self, config, obs_shapes: ObsShapes) -> None:
        super().__init__(config, obs_shapes)
        self.use_instruction = config.use_instruction and "instruction" in obs_shapes
        in_dim = obs_shapes["state"][0]
        if self.use_instruction:
            self.instruction_encoder = InstructionEncoder(config.embed_dim)
            in_dim += config.embed_dim
        self.trunk = nn.Sequential(
            nn.Linear(in_dim, config.hidden),
            nn.Tanh(),
            nn.Linear(config.hidden, config.hidden),
            nn.Tanh(),
        )
        if config.normalize_state:
            state_dim = obs_shapes["state"][0]
            self.register_buffer("state_mean", torch.zeros(state_dim))
            self.register_buffer("state_std", torch.ones(state_dim))

    def fit_normalizer(self, obs: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """With ``normalize_state``: set ``state_mean`` and ``state_std`` (floored at
        ``MIN_STD``) from ``obs["state"]`` ``(N, state_dim)``."""
        if not self.config.normalize_state:
            return {}
        state = obs["state"].double()
        if len(state) < 2:
            raise ValueError(f"fit_normalizer needs at least 2 states, got {len(state)}")
        self.state_mean.copy_(state.mean(0).to(self.state_mean))
        self.state_std.copy_(state.std(0).clamp_min(self.MIN_STD).to(self.state_std))
        return {"bc/normalizer_states": float(len(state))}

    @property
    def input_keys(self) -> tuple[str, ...]:
        """``state``, then ``instruction`` when it is read."""
        return ("state", "instruction") if self.use_instruction else ("state",)

    def features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``state`` (+ instruction) -> ``(B, hidden)``."""
        state = obs["state"].float()
        if self.config.normalize_state:
            state = (state - self.state_mean) / self.state_std
        parts = [state]
        if self.use_instruction:
            parts.append(self.instruction_encoder(obs["instruction"]))
        return self.trunk(torch.cat(parts, dim=-1))
