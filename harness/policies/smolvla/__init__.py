"""``policy=smolvla``: SmolVLA (LeRobot's network and parameter names) with a Flow-Noise action
expert (:mod:`harness.policies.smolvla.policy`; docs/smolvla.md). Importing this package
registers the kind; the network code loads only when a policy is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.config.errors import ConfigError, check
from harness.policies.config import MAX_WIDTH, ChunkFields, PolicyConfig, positive
from harness.policies.registry import register_policy

TINY = "tiny:smolvla"
DTYPES: tuple[str, ...] = ("float32", "bfloat16")
MAX_FLOW_STEPS = 100
MAX_LORA_RANK = 4096


@dataclass
class SmolVLAPolicyConfig(ChunkFields, PolicyConfig):
    """``smolvla``: SmolVLA with a Flow-Noise action expert.

    Attributes:
        model: ``tiny:smolvla`` (random, offline, sized to the task) or a LeRobot SmolVLA
            checkpoint folder (``config.json`` + ``model.safetensors``).
        chunk_size: ``H``, actions per decision (a folder's own ``chunk_size``).
        flow_steps: ``K``, noisy denoising steps per decision, in ``[1, 100]``.
        hidden: Width of the value head.
        lora_rank: ``r`` of LoRA adapters on the backbone's and the expert's ``lora_targets``
            (the rest of the network frozen but its small action and state projections); 0 (the
            default) trains every weight.
        lora_alpha: Their scale numerator (the update is ``alpha / rank * B A``).
        lora_targets: Names of the adapted linear layers.
        dtype: ``float32`` or ``bfloat16``: the backbone's and the expert's weights (the
            projections, noise scales, value head, chains and losses stay float32).
        gradient_checkpointing: Recompute the backbone's and the expert's layer activations
            in the backward pass.
    """

    reads = "pixels"

    name: str = "smolvla"
    use_instruction: bool = True
    model: str = TINY
    chunk_size: int = 8
    flow_steps: int = 4
    hidden: int = 64
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj",
                                                             "o_proj"])
    dtype: str = "float32"
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.dtype in DTYPES, f"policy.dtype={self.dtype!r}; choose one of {DTYPES}")
        self.check_chunk()
        positive("policy.flow_steps", self.flow_steps, MAX_FLOW_STEPS)
        positive("policy.hidden", self.hidden, MAX_WIDTH)
        self.lora_targets = list(self.lora_targets)
        check(isinstance(self.lora_rank, int) and 0 <= self.lora_rank <= MAX_LORA_RANK
              and self.lora_alpha > 0 and len(self.lora_targets) > 0
              and "all-linear" not in self.lora_targets,
              f"policy.lora_rank={self.lora_rank}, lora_alpha={self.lora_alpha}, lora_targets="
              f"{list(self.lora_targets)}; need rank in [0, {MAX_LORA_RANK}] (0: no adapters), "
              "alpha > 0 and named layers (such as q_proj)")
        if self.model != TINY:
            self.model = str(Path(self.model).resolve())
            self._check_folder()

    def _check_folder(self) -> None:
        """Refuse a folder that is not a SmolVLA checkpoint of this chunk size, or whose noise
        scales and value head stored beside it do not fit, before any demo or run folder."""
        from harness.policies.smolvla.folder import read_checkpoint, read_heads

        try:
            config, _ = read_checkpoint(self.model)
        except (OSError, ValueError) as error:  # its CheckpointError is a ValueError
            raise ConfigError(f"policy.model={self.model!r}: {error}") from None
        check(config.arch.chunk_size == self.chunk_size,
              f"policy.chunk_size={self.chunk_size}, but the checkpoint {self.model!r} "
              f"predicts chunks of {config.arch.chunk_size}")
        try:
            read_heads(self.model, self.flow_steps, self.hidden, config)
        except ValueError as error:
            raise ConfigError(f"policy.model={self.model!r}: {error}") from None

    def check_device(self, device) -> None:
        """Refuse ``bfloat16`` on a device without it (needs the run's device)."""
        from harness.policies.hf_vla.models import check_dtype

        try:
            check_dtype(self.dtype, device)
        except ValueError as error:
            raise ConfigError(str(error)) from None


register_policy("smolvla", SmolVLAPolicyConfig, "harness.policies.smolvla.policy:SmolVLAPolicy")
