"""``policy=tiny_vla``: a tiny vision-language-action network (a CNN on the camera frame, the
instruction and ``proprio``) with any action head
(:class:`~harness.policies.tiny_vla.model.TinyVLA`). Importing this module registers the kind
(no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.config.errors import check
from harness.policies.config import (
    MAX_LAYER,
    MAX_WIDTH,
    HeadPolicyFields,
    PolicyConfig,
    check_product,
    positive,
)
from harness.policies.registry import register_policy

IMAGE_FEATURES: tuple[str, ...] = ("spatial_softmax", "avg_pool")
MAX_CONV_LAYERS = 8  # stride 2 each: 8 take a 256-pixel frame to one pixel
MAX_CHANNELS = 1024
MAX_POOLED_SIZE = 64
MAX_KEYPOINTS = 1024


@dataclass
class TinyVLAConfig(HeadPolicyFields, PolicyConfig):
    """``tiny_vla``: the group trainer's network on ``pixels`` (plus ``proprio`` and the
    instruction when the observation has them).

    Attributes:
        conv_channels: Output channels of the image encoder's convolutions (stride 2, except a
            stride-1 last layer under ``spatial_softmax``, which keeps a finer map): 1 to 8
            layers of 1 to 1024 channels.
        pooled_size: ``avg_pool`` only: side of the adaptive average pool after the
            convolutions, so any image size gives the same feature width, in ``[1, 64]``; the
            features (last channels x ``pooled_size``^2) at most 8192.
        image_features: How the last feature map becomes a vector: ``spatial_softmax`` (one
            expected image coordinate per channel, Levine et al. 2016; keeps where things are)
            or ``avg_pool`` (a coarse pooled grid).
        instruction_keypoints: With ``spatial_softmax`` and the instruction: this many extra
            keypoints, each an average of the image keypoints weighted by a softmax over
            channels that the instruction sets, in ``[0, 1024]``; 0 adds none.
    """

    reads = "pixels"

    name: str = "tiny_vla"
    use_instruction: bool = True
    conv_channels: list[int] = field(default_factory=lambda: [16, 32, 32])
    pooled_size: int = 4
    image_features: str = "spatial_softmax"
    instruction_keypoints: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_head_fields()
        self.conv_channels = list(self.conv_channels)
        check(0 < len(self.conv_channels) <= MAX_CONV_LAYERS and all(
                  isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= MAX_CHANNELS
                  for c in self.conv_channels),
              f"policy.conv_channels={self.conv_channels!r}; need 1 to {MAX_CONV_LAYERS} ints "
              f"in [1, {MAX_CHANNELS}]")
        positive("policy.pooled_size", self.pooled_size, MAX_POOLED_SIZE)
        check(self.image_features in IMAGE_FEATURES,
              f"policy.image_features={self.image_features!r}; choose one of {IMAGE_FEATURES}")
        channels = ("policy.conv_channels[-1]", self.conv_channels[-1])
        if self.image_features == "avg_pool":  # the fusion layer reads every pooled cell
            side = ("policy.pooled_size", self.pooled_size)
            check_product("image features", [channels, side, side], MAX_WIDTH)
        check(isinstance(self.instruction_keypoints, int)
              and not isinstance(self.instruction_keypoints, bool)
              and 0 <= self.instruction_keypoints <= MAX_KEYPOINTS,
              f"policy.instruction_keypoints={self.instruction_keypoints!r}; need an int in "
              f"[0, {MAX_KEYPOINTS}]")
        check(not self.instruction_keypoints or (
                  self.image_features == "spatial_softmax" and self.use_instruction),
              f"policy.instruction_keypoints={self.instruction_keypoints} chooses among "
              f"spatial-softmax keypoints by the instruction; it needs "
              f"policy.image_features=spatial_softmax (not {self.image_features!r}) and "
              f"policy.use_instruction=true (not {self.use_instruction})")
        if self.instruction_keypoints:  # one query score per keypoint and channel
            check_product("weights in the keypoint chooser's layer",
                          [("policy.embed_dim", self.embed_dim),
                           ("policy.instruction_keypoints", self.instruction_keypoints),
                           channels], MAX_LAYER)

    @classmethod
    def format1_values(cls, saved: dict) -> dict:
        """Checkpoints from before ``image_features`` existed used ``avg_pool``."""
        return {"image_features": "avg_pool", **super().format1_values(saved)}


register_policy("tiny_vla", TinyVLAConfig, "harness.policies.tiny_vla.model:TinyVLA")
