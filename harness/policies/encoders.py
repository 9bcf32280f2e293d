"""The harness's own token-policy encoders: :class:`MLPTokenPolicy` on ``state`` and
:class:`TinyVLA` on ``pixels``, each with the action, value and sampling surface of
:class:`~harness.policies.token_policy.TokenPolicy` (any ``action_head``). Importing this module
registers them as ``mlp`` and ``tiny_vla``."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from harness.policies.layers import InstructionEncoder, InstructionKeypoints, SpatialSoftmax
from harness.policies.token_policy import TokenPolicy, register_policy
from harness.policies.tokens import ObsShapes, TokenPolicyConfig


class MLPTokenPolicy(TokenPolicy):
    """Two-layer tanh MLP on ``state``, concatenated with the mean instruction embedding.

    With ``normalize_state``, ``state`` is first standardised by the buffers ``state_mean`` and
    ``state_std`` (identity until :meth:`fit_normalizer`). Positions in metres vary by
    centimetres between the states a push expert treats differently; unscaled, they barely move
    a tanh layer's pre-activations.
    """

    MIN_STD = 1e-2  # floor of a dimension's standard deviation (state units: m, rad, m/s)

    def __init__(self, config: TokenPolicyConfig, obs_shapes: ObsShapes) -> None:
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

    def features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``state`` (+ instruction) -> ``(B, hidden)``."""
        state = obs["state"].float()
        if self.config.normalize_state:
            state = (state - self.state_mean) / self.state_std
        parts = [state]
        if self.use_instruction:
            parts.append(self.instruction_encoder(obs["instruction"]))
        return self.trunk(torch.cat(parts, dim=-1))


class TinyVLA(TokenPolicy):
    """A tiny vision-language-action model.

    A small CNN encodes ``pixels`` into keypoints (spatial softmax, the default) or a pooled
    grid; the instruction is a mean of token embeddings; ``proprio`` goes through a linear layer.
    The three are concatenated and fused by an MLP into the shared feature read by the
    per-dimension token head. With ``instruction_keypoints`` = Q, Q keypoints chosen by the
    instruction (:class:`~harness.policies.layers.InstructionKeypoints`) are fused too.
    """

    def __init__(self, config: TokenPolicyConfig, obs_shapes: ObsShapes) -> None:
        super().__init__(config, obs_shapes)
        layers: list[nn.Module] = []
        in_channels = obs_shapes["pixels"][-1]
        keypoints = config.image_features == "spatial_softmax"
        last = len(config.conv_channels) - 1
        for i, out_channels in enumerate(config.conv_channels):
            kernel = 5 if i == 0 else 3
            stride = 1 if keypoints and i == last and i > 0 else 2
            layers.append(
                nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2)
            )
            if not (keypoints and i == last):  # keypoint logits stay signed
                layers.append(nn.ReLU())
            in_channels = out_channels
        if keypoints:
            layers.append(SpatialSoftmax())
            fused_dim = 2 * in_channels
        else:
            layers += [nn.AdaptiveAvgPool2d(config.pooled_size), nn.Flatten()]
            fused_dim = in_channels * config.pooled_size**2
        self.image_encoder = nn.Sequential(*layers)

        self.use_instruction = config.use_instruction and "instruction" in obs_shapes
        if self.use_instruction:
            self.instruction_encoder = InstructionEncoder(config.embed_dim)
            fused_dim += config.embed_dim
        self.instruction_keypoints = config.instruction_keypoints
        if self.instruction_keypoints:
            if not (keypoints and self.use_instruction):
                raise ValueError(
                    f"instruction_keypoints={self.instruction_keypoints} needs spatial_softmax "
                    f"features and an instruction (observation keys {sorted(obs_shapes)})")
            self.keypoint_chooser = InstructionKeypoints(config.embed_dim, in_channels,
                                                         self.instruction_keypoints)
            fused_dim += 2 * self.instruction_keypoints
        self.use_proprio = "proprio" in obs_shapes
        if self.use_proprio:
            self.proprio_encoder = nn.Sequential(
                nn.Linear(obs_shapes["proprio"][0], config.embed_dim), nn.Tanh()
            )
            fused_dim += config.embed_dim
        self.fusion = nn.Sequential(
            nn.Linear(fused_dim, config.hidden),
            nn.ReLU(),
            nn.Linear(config.hidden, config.hidden),
            nn.ReLU(),
        )

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 ``pixels`` ``(B, H, W, 3)`` -> image features ``(B, D)`` (keypoints or grid)."""
        if pixels.dtype != torch.uint8:
            raise TypeError(f"pixels must be uint8 (B, H, W, 3), got {pixels.dtype}")
        image = pixels.permute(0, 3, 1, 2).float() / 255.0  # (B, 3, H, W) in [0, 1]
        return self.image_encoder(image)

    def features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``pixels`` (+ instruction, proprio) -> ``(B, hidden)``.

        An ``image_features`` entry (from :meth:`encode_image`) is used instead of ``pixels``
        when present: a frozen encoder's output can be computed once and reused.
        """
        if "image_features" in obs:
            parts = [obs["image_features"]]
        else:
            parts = [self.encode_image(obs["pixels"])]
        if self.use_instruction:
            parts.append(self.instruction_encoder(obs["instruction"]))
            if self.instruction_keypoints:
                parts.append(self.keypoint_chooser(parts[0], parts[1]))
        if self.use_proprio:
            parts.append(self.proprio_encoder(obs["proprio"].float()))
        return self.fusion(torch.cat(parts, dim=-1))


register_policy("mlp", MLPTokenPolicy, ("state",))
register_policy("tiny_vla", TinyVLA, ("pixels",))
