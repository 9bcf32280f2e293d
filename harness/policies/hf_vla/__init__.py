"""``policy=hf_vla``: a ``transformers`` vision-language model as an action-token policy (the
OpenVLA recipe; :mod:`harness.policies.hf_vla.policy`; docs/vla.md). Importing this package
registers the kind; the model code loads only when a policy is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.config.errors import ConfigError, check
from harness.policies.config import MAX_ACTION_DIM, PolicyConfig, positive
from harness.policies.registry import register_policy

PROPRIO_INPUTS: tuple[str, ...] = ("projection", "none")
MAX_BINS = 4096
MAX_LORA_RANK = 4096


@dataclass
class LoRAConfig:
    """``policy.lora``: low-rank adapters (``peft``) on the named linear layers.

    Attributes:
        rank: ``r`` of the adapters, in ``[1, 4096]``.
        alpha: Scale numerator: the update is ``alpha / rank * B A``.
        dropout: Dropout on the adapters' input.
        target_modules: Names of the linear layers to adapt (``q_proj``...), or
            ``[all-linear]``.
        full_bc: Behaviour cloning (and state pretraining) trains every weight, not only the
            adapters; group fine-tuning then merges them and trains fresh adapters. For models
            that have not learnt the task's visuals yet (the named random-weight builds).
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj",
                                                               "o_proj"])
    full_bc: bool = False

    def __post_init__(self) -> None:
        check(isinstance(self.rank, int) and not isinstance(self.rank, bool)
              and 1 <= self.rank <= MAX_LORA_RANK and self.alpha > 0 and 0.0 <= self.dropout < 1.0
              and len(self.target_modules) > 0,
              f"policy.lora: rank={self.rank}, alpha={self.alpha}, dropout={self.dropout}, "
              f"target_modules={list(self.target_modules)}; need rank in [1, {MAX_LORA_RANK}], "
              "alpha > 0, dropout in [0, 1) and at least one target (policy.lora=null "
              "fine-tunes every weight)")


@dataclass
class HFVLAConfig(PolicyConfig):
    """``hf_vla``: a vision-language model whose language-model head writes one action token
    per dimension, autoregressively (one action per decision).

    Attributes:
        model: A named offline build (``tiny:paligemma``, ``tiny:idefics3``, ``small:...``) or
            a local folder with a saved model and its processor.
        num_bins: K action tokens per dimension, the last ordinary ids of the vocabulary.
        lora: LoRA adapters, or ``null`` to fine-tune every weight.
        dtype: ``float32`` or ``bfloat16``.
        gradient_checkpointing: Recompute activations in the backward pass.
        proprio: ``projection`` (one prefix embedding projected from ``proprio``) or ``none``.
        action_dim: Dimensions of one action, one token each, in ``[1, 64]``.
    """

    reads = "pixels"

    name: str = "hf_vla"
    use_instruction: bool = True
    model: str = "tiny:idefics3"
    num_bins: int = 256
    lora: LoRAConfig | None = field(default_factory=LoRAConfig)
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    proprio: str = "projection"
    action_dim: int = 4

    def __post_init__(self) -> None:
        from harness.policies.hf_vla.models import check_model

        super().__post_init__()
        if isinstance(self.lora, dict):  # a saved policy's plain values
            self.lora = LoRAConfig(**self.lora)
        check(isinstance(self.num_bins, int) and 2 <= self.num_bins <= MAX_BINS,
              f"policy.num_bins={self.num_bins}; need an int in [2, {MAX_BINS}]")
        positive("policy.action_dim", self.action_dim, MAX_ACTION_DIM)
        check(self.proprio in PROPRIO_INPUTS,
              f"policy.proprio={self.proprio!r}; choose one of {PROPRIO_INPUTS}")
        if Path(self.model).is_dir():  # the same folder from any working directory
            self.model = str(Path(self.model).resolve())
        try:  # the model, its processor and room for the bins: before any demo or training
            check_model(self.model, self.num_bins, self.dtype)
        except (ValueError, ImportError) as error:
            raise ConfigError(str(error)) from None

    @classmethod
    def format1_values(cls, saved: dict) -> dict:
        """Format 1 kept LoRA as flat ``lora_*`` fields, rank 0 for none."""
        values = super().format1_values(saved)
        rank = saved.get("lora_rank", 0)
        values["lora"] = None if not rank else {
            "rank": rank, "alpha": saved.get("lora_alpha", 16.0),
            "dropout": saved.get("lora_dropout", 0.0),
            "target_modules": list(saved.get("lora_targets", ("q_proj", "k_proj", "v_proj",
                                                               "o_proj"))),
            "full_bc": saved.get("lora_full_bc", False)}
        return values

    @property
    def chunk_size(self) -> int:
        """One action per decision (the model decodes one step's tokens)."""
        return 1

    @property
    def steps_per_decision(self) -> int:
        return 1

    def check_device(self, device) -> None:
        """Refuse ``bfloat16`` on a device without it (needs the run's device)."""
        from harness.policies.hf_vla.models import check_dtype

        try:
            check_dtype(self.dtype, device)
        except ValueError as error:
            raise ConfigError(str(error)) from None


register_policy("hf_vla", HFVLAConfig, "harness.policies.hf_vla.policy:HFVLAPolicy")
