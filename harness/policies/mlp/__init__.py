"""``policy=mlp``: an MLP on the ``state`` vector. The group trainer builds it with any action head
(:class:`~harness.policies.mlp.model.MLPPolicy`); Stable-Baselines3 builds its own
``MlpPolicy`` from the SB3 fields. Importing this module registers the kind (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.config.errors import check
from harness.config.policy import SB3PolicyFields
from harness.policies.config import HeadPolicyFields, PolicyConfig
from harness.policies.registry import register_policy


@dataclass
class MLPConfig(HeadPolicyFields, SB3PolicyFields, PolicyConfig):
    """``mlp`` on the ``state`` vector: SB3's ``MlpPolicy`` (``net_arch``, ``activation``,
    ``log_std_init``) or the group trainer's :class:`~harness.policies.mlp.model.MLPPolicy`
    (``hidden``, ``embed_dim``, the chunk and the head); each reads its own set of fields.

    Attributes:
        normalize_state: Group trainer only: standardise ``state`` per dimension by statistics
            that behaviour cloning fits on its demos and the policy keeps with its weights.
    """

    families = ("group", "sb3")
    reads = "state"

    name: str = "mlp"
    normalize_state: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_sb3_fields()
        self.check_head_fields()

    def unfitted_warning(self) -> str | None:
        """With ``normalize_state``: no behaviour cloning fits its statistics."""
        if not self.normalize_state:
            return None
        return ("policy.normalize_state=true, but no behaviour cloning fits its statistics "
                "(algo.start_policy.bc.demos=0, no algo.start_policy.dataset): the state stays "
                "unscaled")

    def check_family(self, family: str, algo: str) -> None:
        """Under SB3, refuse the group trainer's options (chunks, heads, normalisation)."""
        super().check_family(family, algo)
        if family == "group":
            return
        check(self.chunk_size == 1,
              f"policy.chunk_size={self.chunk_size} is read by the group trainer's policies, "
              f"not by algo={algo!r} (SB3 plays one action per step); leave it 1")
        check(self.head_name == "tokens",
              f"policy/head={self.head_name!r} is read by the group trainer's policies, not by "
              f"algo={algo!r} (SB3 builds its own action distribution); leave policy/head=tokens")
        check(not self.normalize_state,
              f"policy.normalize_state=true is read by the group trainer's MLP policy, not by "
              f"algo={algo!r} (SB3's MlpPolicy); leave it false")


register_policy("mlp", MLPConfig, "harness.policies.mlp.model:MLPPolicy")
