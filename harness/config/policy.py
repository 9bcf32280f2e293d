"""The ``policy`` group: one schema per network, so each holds only the fields its network reads.

The group trainer's kinds (``mlp``, ``tiny_vla``, ``hf_vla``, ``smolvla`` and any plugin's)
register their own config dataclasses with :func:`harness.policies.register_policy`; this module
holds what only Stable-Baselines3 reads: the fields of its actor-critic networks, shared by
``mlp`` (which serves both families) and ``cnn`` (SB3's ``MultiInputPolicy`` with NatureCNN).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.config.errors import check
from harness.policies.config import MAX_WIDTH, PolicyConfig, positive
from harness.policies.registry import policy_entry, policy_kinds, register_policy

ACTIVATIONS: tuple[str, ...] = ("tanh", "relu", "elu")
MAX_LAYERS = 8  # hidden layers of SB3's MLPs


@dataclass
class SB3PolicyFields:
    """The fields of SB3's actor-critic networks.

    Attributes:
        net_arch: Hidden sizes of the policy and value MLPs.
        activation: ``tanh``, ``relu`` or ``elu``.
        log_std_init: Initial log standard deviation of the Gaussian actions.
    """

    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    log_std_init: float = 0.0

    def check_sb3_fields(self) -> None:
        """Raises: ConfigError: An unknown activation, more than 8 layers, or a layer size
        outside ``[1, 8192]``."""
        check(self.activation in ACTIVATIONS,
              f"policy.activation={self.activation!r}; choose one of {ACTIVATIONS}")
        check(len(self.net_arch) <= MAX_LAYERS and all(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_WIDTH
            for n in self.net_arch),
              f"policy.net_arch={list(self.net_arch)}; need at most {MAX_LAYERS} sizes, each an "
              f"int in [1, {MAX_WIDTH}]")


@dataclass
class CNNPolicyConfig(SB3PolicyFields, PolicyConfig):
    """``cnn``: SB3's ``MultiInputPolicy`` with NatureCNN on ``pixels``.

    Attributes:
        features_dim: Width of the CNN's output.
    """

    families = ("sb3",)
    reads = "pixels"

    name: str = "cnn"
    features_dim: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_sb3_fields()
        positive("policy.features_dim", self.features_dim, MAX_WIDTH)


register_policy("cnn", CNNPolicyConfig, build=None)


def policy_schemas() -> dict[str, type[PolicyConfig]]:
    """Every registered kind's config dataclass, by name (the ``schema/policy`` nodes)."""
    return {name: policy_entry(name).config_class for name in policy_kinds()}
