"""``policy=smolvla``: SmolVLA (LeRobot's network and parameter names) with a Flow-Noise action
expert (:mod:`harness.policies.smolvla.policy`; docs/smolvla.md). Importing this package
registers the kind; the network code loads only when a policy is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.config.errors import ConfigError, check
from harness.policies.config import (
    MAX_DECISION_VALUES,
    MAX_WIDTH,
    ChunkFields,
    PolicyConfig,
    check_product,
    positive,
)
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
        chunk_size: ``H`` in ``[1, 256]``, actions per decision (a folder's own
            ``chunk_size``).
        flow_steps: ``K``, noisy denoising steps per decision, in ``[1, 100]``; the chain
            ``K x H x`` the model's action width at most 65,536 values per decision.
        hidden: Width of the value head, in ``[1, 8192]``.
        lora_rank: ``r`` of LoRA adapters on the backbone's and the expert's ``lora_targets``
            (the rest of the network frozen but its small action and state projections); 0 (the
            default) trains every weight; at most half the backbone's width (32 for
            ``tiny:smolvla``).
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
        if self.model == TINY:
            from harness.policies.smolvla.architecture import tiny_config

            tiny = tiny_config(chunk_size=self.chunk_size, action_dim=self.action_dim)
            self._check_sizes(tiny.width, ("policy.action_dim", self.action_dim))
        else:
            self.model = str(Path(self.model).resolve())
            self._check_folder()

    def _check_sizes(self, width: int, action_width: tuple[str, int]) -> None:
        """Refuse a chain record or adapters too large for a network of backbone width
        ``width`` and ``(key, entries)`` action entries per chunk step (its ``max_action_dim``).

        Raises:
            ConfigError: Naming the sizes and the bound.
        """
        check_product("denoising values in each decision's record",
                      [("policy.flow_steps", self.flow_steps),
                       ("policy.chunk_size", self.chunk_size),
                       action_width], MAX_DECISION_VALUES)
        # At r = width / 2 an adapter (r x in + out x r) holds as many weights as the square
        # layer it adapts; past the width it is no longer low rank at all.
        check(self.lora_rank <= width // 2,
              f"policy.lora_rank={self.lora_rank} on {self.model!r}, a backbone of width "
              f"{width}; need at most {width // 2} (half the width, where an adapter holds as "
              "many weights as the layer it adapts), or 0 for no adapters")

    def _check_folder(self) -> None:
        """Refuse a folder that is not a SmolVLA checkpoint of this chunk size, or whose noise
        scales and value head stored beside it do not fit, before any demo or run folder."""
        from harness.policies.smolvla.folder import read_checkpoint, read_heads
        from harness.policies.smolvla.model import SmolVLAModel

        try:
            config, _ = read_checkpoint(self.model, SmolVLAModel)
        except (OSError, ValueError) as error:  # its CheckpointError is a ValueError
            raise ConfigError(f"policy.model={self.model!r}: {error}") from None
        check(config.arch.chunk_size == self.chunk_size,
              f"policy.chunk_size={self.chunk_size}, but the checkpoint {self.model!r} "
              f"predicts chunks of {config.arch.chunk_size}")
        self._check_sizes(config.width,
                          ("the checkpoint's max_action_dim", config.arch.max_action_dim))
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
