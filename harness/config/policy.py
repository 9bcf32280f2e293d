"""The ``policy`` group: the network of the SB3 baselines or of the group trainer's token policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.config.errors import check
from harness.policies import TokenPolicyConfig
from harness.policies.token_policy import IMAGE_FEATURES

POLICIES: tuple[str, ...] = ("mlp", "cnn", "tiny_vla")
# Which policies each algorithm family can train, and which observation key each policy reads.
POLICIES_BY_FAMILY: dict[str, tuple[str, ...]] = {
    "sb3": ("mlp", "cnn"),
    "group": ("mlp", "tiny_vla"),
}
POLICY_OBS_KEY: dict[str, str] = {"mlp": "state", "cnn": "pixels", "tiny_vla": "pixels"}
ACTIVATIONS: tuple[str, ...] = ("tanh", "relu", "elu")


@dataclass
class PolicyConfig:
    """The ``policy`` group: network of the SB3 baselines or of the group trainer's token policy.

    Attributes:
        name: ``mlp`` (reads ``state``), ``cnn`` (SB3 ``MultiInputPolicy`` with NatureCNN on
            ``pixels``, plus ``proprio``/``state``) or ``tiny_vla`` (token policy on ``pixels``).
        net_arch: SB3: hidden sizes of the policy and value MLPs.
        activation: SB3: ``tanh``, ``relu`` or ``elu``.
        log_std_init: SB3: initial log standard deviation of the Gaussian actions.
        features_dim: SB3 ``cnn``: width of the CNN's output.
        use_instruction: Also feed the instruction tokens (SB3: as a flat vector).
        num_bins: Token policies: K tokens per action dimension.
        hidden: Token policies: width of the fused feature and MLP layers.
        embed_dim: Token policies: instruction embedding and proprio encoder width.
        conv_channels: Token policies: channels of the image encoder's convolutions.
        pooled_size: Token policies: side of the pooled feature map (``avg_pool`` only).
        image_features: Token policies: ``spatial_softmax`` (keypoints, the default) or
            ``avg_pool`` (``harness.policies.TokenPolicyConfig.image_features``).
    """

    name: str = "mlp"
    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    log_std_init: float = 0.0
    features_dim: int = 128
    use_instruction: bool = False
    num_bins: int = 11
    hidden: int = 128
    embed_dim: int = 32
    conv_channels: list[int] = field(default_factory=lambda: [16, 32, 32])
    pooled_size: int = 4
    image_features: str = "spatial_softmax"

    def __post_init__(self) -> None:
        check(self.name in POLICIES,
              f"policy.name={self.name!r} is unknown; choose one of {POLICIES}")
        check(self.activation in ACTIVATIONS,
              f"policy.activation={self.activation!r}; choose one of {ACTIVATIONS}")
        check(all(int(n) >= 1 for n in self.net_arch),
              f"policy.net_arch={list(self.net_arch)}; sizes must be >= 1")
        check(self.features_dim >= 1, f"policy.features_dim={self.features_dim}; must be >= 1")
        check(self.image_features in IMAGE_FEATURES,
              f"policy.image_features={self.image_features!r}; choose one of {IMAGE_FEATURES}")

    def token_policy_config(self) -> TokenPolicyConfig:
        """The ``harness.policies.TokenPolicyConfig`` of ``mlp`` / ``tiny_vla`` (group trainer)."""
        return TokenPolicyConfig(
            kind=self.name, num_bins=self.num_bins, hidden=self.hidden, embed_dim=self.embed_dim,
            conv_channels=tuple(self.conv_channels), pooled_size=self.pooled_size,
            use_instruction=self.use_instruction, image_features=self.image_features,
        )
