"""The ``tiny_vla`` network: a small CNN on the camera frame, the instruction and ``proprio``,
fused by an MLP, with any action head (:class:`~harness.policies.head_policy.HeadPolicy`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from harness.policies.head_policy import HeadPolicy
from harness.policies.layers import InstructionEncoder, InstructionKeypoints, SpatialSoftmax
from harness.policies.observations import ObsShapes


class TinyVLA(HeadPolicy):
    """A tiny vision-language-action model.

    A small CNN encodes ``pixels`` into keypoints (spatial softmax, the default) or a pooled
    grid; the instruction is a mean of token embeddings; ``proprio`` goes through a linear layer.
    The three are concatenated and fused by an MLP into the shared feature read by the
    per-dimension token head. With ``instruction_keypoints`` = Q, Q keypoints chosen by the
    instruction (:class:`~harness.policies.layers.InstructionKeypoints`) are fused too.
    """

    def __init__(self, config, obs_shapes: ObsShapes) -> None:
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

    INPUT_KEY = "pixels"

    @property
    def input_keys(self) -> tuple[str, ...]:
        """``pixels``, then ``instruction`` and ``proprio`` when they are read."""
        return ("pixels", *(("instruction",) if self.use_instruction else ()),
                *(("proprio",) if self.use_proprio else ()))

    def freeze_encoder(self) -> None:
        """Stop training the image encoder; its features can then be computed once
        (:meth:`encode_frozen`)."""
        self.image_encoder.requires_grad_(False)

    def encode_frozen(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``obs`` with ``pixels`` replaced by their ``image_features`` (in chunks of 1,024
        frames), which :meth:`features` reads in their place."""
        if "image_features" in obs:
            return dict(obs)
        pixels, chunk = obs["pixels"], 1024
        features = torch.cat([self.encode_image(pixels[i:i + chunk])
                              for i in range(0, len(pixels), chunk)])
        return {**{k: v for k, v in obs.items() if k != "pixels"}, "image_features": features}

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
