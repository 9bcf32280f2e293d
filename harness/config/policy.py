"""The ``policy`` group: one schema per network, so each holds only the fields its network reads.

``cnn`` is an SB3 network, ``tiny_vla`` and ``hf_vla`` token policies of the group trainer, and
``mlp`` serves both (SB3's ``MlpPolicy`` or the group trainer's MLP token policy), so its schema
has both sets.

``harness.policies`` imports torch, so its names are imported inside the methods that use them:
composing a config (``--help``, ``--cfg job``) stays free of torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import MISSING

from harness.config.errors import ConfigError, check

if TYPE_CHECKING:
    from harness.policies import TokenPolicyConfig

POLICIES: tuple[str, ...] = ("mlp", "cnn", "tiny_vla", "hf_vla", "smolvla")
# Which policies each algorithm family can train, and which observation key each policy reads.
POLICIES_BY_FAMILY: dict[str, tuple[str, ...]] = {
    "sb3": ("mlp", "cnn"),
    "group": ("mlp", "tiny_vla", "hf_vla", "smolvla"),
}
POLICY_OBS_KEY: dict[str, str] = {"mlp": "state", "cnn": "pixels", "tiny_vla": "pixels",
                                  "hf_vla": "pixels", "smolvla": "pixels"}
ACTIVATIONS: tuple[str, ...] = ("tanh", "relu", "elu")


def _check_dtype_on(dtype: str, device) -> None:
    """Refuse ``policy.dtype`` where ``device`` cannot run it; ConfigError names both."""
    from harness.policies.hf_models import check_dtype

    try:
        check_dtype(dtype, device)
    except ValueError as error:
        raise ConfigError(str(error)) from None


@dataclass
class PolicyConfig:
    """Base of the ``policy`` group.

    Attributes:
        name: ``mlp`` (reads ``state``), ``cnn`` (SB3 ``MultiInputPolicy`` with NatureCNN on
            ``pixels``, plus ``proprio``/``state``) or ``tiny_vla`` (token policy on ``pixels``).
        use_instruction: Also feed the instruction tokens (SB3: as a flat vector).
    """

    name: str = MISSING
    use_instruction: bool = False

    def __post_init__(self) -> None:
        check(self.name in POLICIES,
              f"policy.name={self.name!r} is unknown; choose one of {POLICIES}")
        schema = POLICY_SCHEMAS[self.name]
        # The base alone stands for "some policy" (a default before the group file is merged).
        check(type(self) is PolicyConfig or isinstance(self, schema),
              f"policy.name={self.name!r} with the {type(self).__name__} schema, which lacks "
              f"fields {self.name!r} reads; choose the network with policy={self.name}")

    def check_device(self, device) -> None:
        """Refuse a device this policy cannot run on (``hf_vla`` and ``smolvla``: ``bfloat16``
        where the device lacks it); every device suits the others."""

    def token_policy_config(self) -> TokenPolicyConfig:
        """The ``harness.policies.TokenPolicyConfig`` of ``mlp`` / ``tiny_vla`` (group trainer).

        Raises:
            ConfigError: The policy is not a token policy.
        """
        from harness.policies import KINDS

        raise ConfigError(f"policy={self.name!r} is not a token policy; choose one of {KINDS}")


@dataclass
class SB3PolicyFields(PolicyConfig):
    """The fields of SB3's actor-critic networks.

    Attributes:
        net_arch: Hidden sizes of the policy and value MLPs.
        activation: ``tanh``, ``relu`` or ``elu``.
        log_std_init: Initial log standard deviation of the Gaussian actions.
    """

    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    log_std_init: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.activation in ACTIVATIONS,
              f"policy.activation={self.activation!r}; choose one of {ACTIVATIONS}")
        check(all(int(n) >= 1 for n in self.net_arch),
              f"policy.net_arch={list(self.net_arch)}; sizes must be >= 1")


@dataclass
class TokenPolicyFields(PolicyConfig):
    """The fields every token policy of the group trainer reads.

    Attributes:
        num_bins: K tokens per action dimension.
        hidden: Width of the fused feature and MLP layers.
        embed_dim: Instruction embedding (and ``tiny_vla``'s proprio encoder) width.
        chunk_size: ``H``, actions one decision predicts (an action chunk; 1: one per control
            step). Group trainer only.
        execute_steps: ``k`` in ``[1, chunk_size]``, actions of each chunk played before the
            next decision; ``null`` plays the whole chunk (``harness.policies.chunks``).
        action_head: ``tokens`` (the default), ``gaussian`` or ``flow``
            (``harness.policies.action_heads``). Group trainer only.
        flow_steps: ``flow``: denoising steps ``K``.
        flow_noise: ``flow``: ``learned`` or ``network`` noise scales.
        state_dependent_std: ``gaussian``: the scale from the features, not one learned value
            per chunk entry.
    """

    num_bins: int = 11
    hidden: int = 128
    embed_dim: int = 32
    chunk_size: int = 1
    execute_steps: int | None = None
    action_head: str = "tokens"
    flow_steps: int = 4
    flow_noise: str = "learned"
    state_dependent_std: bool = False

    def __post_init__(self) -> None:
        from harness.policies.tokens import chunk_problem, head_problem

        super().__post_init__()
        problem = chunk_problem(self.chunk_size, self.execute_steps)
        check(problem is None, f"policy.{problem}")
        problem = head_problem(self.name, self.action_head, self.flow_steps, self.flow_noise)
        check(problem is None, f"policy.{problem}")

    def token_policy_config(self) -> TokenPolicyConfig:
        from harness.policies import TokenPolicyConfig

        return TokenPolicyConfig(kind=self.name, num_bins=self.num_bins, hidden=self.hidden,
                                 embed_dim=self.embed_dim, use_instruction=self.use_instruction,
                                 chunk_size=self.chunk_size, execute_steps=self.execute_steps,
                                 action_head=self.action_head, flow_steps=self.flow_steps,
                                 flow_noise=self.flow_noise,
                                 state_dependent_std=self.state_dependent_std)


@dataclass
class MLPPolicyConfig(TokenPolicyFields, SB3PolicyFields):
    """``mlp`` on the ``state`` vector: SB3's ``MlpPolicy`` or the group trainer's
    ``harness.policies.MLPTokenPolicy``; each reads its own set of fields.

    Attributes:
        normalize_state: Group trainer only: standardise ``state`` per dimension by statistics
            the behaviour cloning fits on its demos and the policy keeps with its weights
            (``harness.policies.TokenPolicyConfig.normalize_state``).
    """

    name: str = "mlp"
    normalize_state: bool = False

    def token_policy_config(self) -> TokenPolicyConfig:
        return dataclasses.replace(super().token_policy_config(),
                                   normalize_state=self.normalize_state)


@dataclass
class CNNPolicyConfig(SB3PolicyFields):
    """``cnn``: SB3's ``MultiInputPolicy`` with NatureCNN on ``pixels``.

    Attributes:
        features_dim: Width of the CNN's output.
    """

    name: str = "cnn"
    features_dim: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.features_dim >= 1, f"policy.features_dim={self.features_dim}; must be >= 1")


@dataclass
class TinyVLAConfig(TokenPolicyFields):
    """``tiny_vla``: the group trainer's token policy on ``pixels`` (``harness.policies.TinyVLA``).

    Attributes:
        conv_channels: Channels of the image encoder's convolutions.
        pooled_size: Side of the pooled feature map (``avg_pool`` only).
        image_features: ``spatial_softmax`` (keypoints, the default) or ``avg_pool``
            (``harness.policies.TokenPolicyConfig.image_features``).
        instruction_keypoints: Keypoints chosen by the instruction (an instruction-weighted
            average of the image keypoints each), added to what the fusion MLP reads; 0 (the
            default) adds none. Needs ``spatial_softmax`` and ``use_instruction``.
    """

    name: str = "tiny_vla"
    use_instruction: bool = True
    conv_channels: list[int] = field(default_factory=lambda: [16, 32, 32])
    pooled_size: int = 4
    image_features: str = "spatial_softmax"
    instruction_keypoints: int = 0

    def __post_init__(self) -> None:
        from harness.policies.token_policy import IMAGE_FEATURES

        super().__post_init__()
        check(self.image_features in IMAGE_FEATURES,
              f"policy.image_features={self.image_features!r}; choose one of {IMAGE_FEATURES}")
        check(self.instruction_keypoints >= 0,
              f"policy.instruction_keypoints={self.instruction_keypoints}; must be >= 0")
        check(not self.instruction_keypoints or (
                  self.image_features == "spatial_softmax" and self.use_instruction),
              f"policy.instruction_keypoints={self.instruction_keypoints} chooses among "
              f"spatial-softmax keypoints by the instruction; it needs "
              f"policy.image_features=spatial_softmax (not {self.image_features!r}) and "
              f"policy.use_instruction=true (not {self.use_instruction})")

    def token_policy_config(self) -> TokenPolicyConfig:
        return dataclasses.replace(
            super().token_policy_config(), conv_channels=tuple(self.conv_channels),
            pooled_size=self.pooled_size, image_features=self.image_features,
            instruction_keypoints=self.instruction_keypoints,
        )


@dataclass
class LoRAConfig:
    """``policy.lora`` of ``hf_vla``: low-rank adapters (``peft``) on the named linear layers.

    Attributes:
        rank: ``r`` of the adapters.
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
        check(self.rank >= 1 and self.alpha > 0 and 0.0 <= self.dropout < 1.0
              and len(self.target_modules) > 0,
              f"policy.lora: rank={self.rank}, alpha={self.alpha}, dropout={self.dropout}, "
              f"target_modules={list(self.target_modules)}; need rank >= 1, alpha > 0, dropout "
              "in [0, 1) and at least one target (policy.lora=null fine-tunes every weight)")


@dataclass
class HFVLAConfig(PolicyConfig):
    """``hf_vla``: a ``transformers`` vision-language model as a token policy
    (``harness.policies.hf_vla``; docs/vla.md).

    Attributes:
        model: A named offline build (``tiny:paligemma``, ``tiny:idefics3``, ``small:...``) or
            a local folder with a saved model and its processor.
        num_bins: K action tokens per dimension, reserved at the end of the vocabulary.
        lora: LoRA adapters, or ``null`` to fine-tune every weight.
        dtype: ``float32`` or ``bfloat16``.
        gradient_checkpointing: Recompute activations in the backward pass.
        proprio: ``projection`` (one prefix embedding projected from ``proprio``) or ``none``.
    """

    name: str = "hf_vla"
    use_instruction: bool = True
    model: str = "tiny:idefics3"
    num_bins: int = 256
    lora: LoRAConfig | None = field(default_factory=LoRAConfig)
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    proprio: str = "projection"

    def __post_init__(self) -> None:
        from harness.policies.hf_models import check_model
        from harness.policies.tokens import PROPRIO_INPUTS

        super().__post_init__()
        check(self.num_bins >= 2, f"policy.num_bins={self.num_bins}; need >= 2")
        check(self.proprio in PROPRIO_INPUTS,
              f"policy.proprio={self.proprio!r}; choose one of {PROPRIO_INPUTS}")
        try:  # the model, its processor and room for the bins: before any demo or training
            check_model(self.model, self.num_bins, self.dtype)
        except (ValueError, ImportError) as error:
            raise ConfigError(str(error)) from None

    def check_device(self, device) -> None:
        """Refuse ``bfloat16`` on a device without it (needs the run's device)."""
        _check_dtype_on(self.dtype, device)

    def token_policy_config(self) -> TokenPolicyConfig:
        from harness.policies import TokenPolicyConfig

        model = str(Path(self.model).resolve()) if Path(self.model).is_dir() else self.model
        lora = {} if self.lora is None else {  # lora_rank 0 (the default): every weight trains
            "lora_rank": self.lora.rank, "lora_alpha": self.lora.alpha,
            "lora_dropout": self.lora.dropout, "lora_targets": tuple(self.lora.target_modules),
            "lora_full_bc": self.lora.full_bc}
        return TokenPolicyConfig(
            kind="hf_vla", num_bins=self.num_bins, use_instruction=self.use_instruction,
            model=model, proprio=self.proprio, dtype=self.dtype,
            gradient_checkpointing=self.gradient_checkpointing, **lora)


@dataclass
class SmolVLAPolicyConfig(PolicyConfig):
    """``smolvla``: SmolVLA (LeRobot's network) with a Flow-Noise action expert
    (``harness.policies.smolvla_policy``; docs/smolvla.md).

    Attributes:
        model: ``tiny:smolvla`` (random, offline, sized to the task) or a LeRobot SmolVLA
            checkpoint folder (``config.json`` + ``model.safetensors``).
        chunk_size: ``H``, actions per decision (a folder's own ``chunk_size``).
        execute_steps: ``k <= H`` played per decision; ``null`` plays the whole chunk.
        flow_steps: ``K``, noisy denoising steps per decision.
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

    name: str = "smolvla"
    use_instruction: bool = True
    model: str = "tiny:smolvla"
    chunk_size: int = 8
    execute_steps: int | None = None
    flow_steps: int = 4
    hidden: int = 64
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj",
                                                             "o_proj"])
    dtype: str = "float32"
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        from harness.policies.hf_models import DTYPES
        from harness.policies.tokens import chunk_problem

        super().__post_init__()
        check(self.dtype in DTYPES, f"policy.dtype={self.dtype!r}; choose one of {tuple(DTYPES)}")
        problem = chunk_problem(self.chunk_size, self.execute_steps)
        check(problem is None, f"policy.{problem}")
        check(isinstance(self.flow_steps, int) and self.flow_steps >= 1,
              f"policy.flow_steps={self.flow_steps!r}; need an int >= 1 (denoising steps)")
        check(self.hidden >= 1, f"policy.hidden={self.hidden}; must be >= 1")
        check(self.lora_rank >= 0 and self.lora_alpha > 0 and len(self.lora_targets) > 0
              and "all-linear" not in self.lora_targets,
              f"policy.lora_rank={self.lora_rank}, lora_alpha={self.lora_alpha}, lora_targets="
              f"{list(self.lora_targets)}; need rank >= 0 (0: no adapters), alpha > 0 and named "
              "layers (such as q_proj)")
        if self.model != "tiny:smolvla":
            from harness.policies.smolvla_folder import read_checkpoint

            try:  # a folder that is not a SmolVLA checkpoint: before any demo or run folder
                config, _ = read_checkpoint(self.model)
            except (OSError, ValueError) as error:  # its CheckpointError is a ValueError
                raise ConfigError(f"policy.model={self.model!r}: {error}") from None
            check(config.arch.chunk_size == self.chunk_size,
                  f"policy.chunk_size={self.chunk_size}, but the checkpoint {self.model!r} "
                  f"predicts chunks of {config.arch.chunk_size}")
            self._check_heads(config)

    def _check_heads(self, config) -> None:
        """Refuse noise scales and a value head stored beside the folder that do not fit."""
        from harness.policies.smolvla_policy import read_heads

        try:
            read_heads(self.model, self.flow_steps, self.hidden, config)
        except ValueError as error:
            raise ConfigError(f"policy.model={self.model!r}: {error}") from None

    def check_device(self, device) -> None:
        """Refuse ``bfloat16`` on a device without it (needs the run's device)."""
        _check_dtype_on(self.dtype, device)

    def token_policy_config(self) -> TokenPolicyConfig:
        from harness.policies import TokenPolicyConfig

        model = str(Path(self.model).resolve()) if Path(self.model).is_dir() else self.model
        lora = {"lora_rank": self.lora_rank, "lora_alpha": self.lora_alpha,
                "lora_targets": tuple(self.lora_targets)}
        return TokenPolicyConfig(
            kind="smolvla", use_instruction=self.use_instruction, model=model,
            chunk_size=self.chunk_size, execute_steps=self.execute_steps, action_head="flow",
            flow_steps=self.flow_steps, hidden=self.hidden, dtype=self.dtype,
            gradient_checkpointing=self.gradient_checkpointing, **lora)


# The schema each ``conf/policy/*.yaml`` names in its defaults list (``/schema/policy@_here_: cnn``)
POLICY_SCHEMAS: dict[str, type[PolicyConfig]] = {
    "mlp": MLPPolicyConfig,
    "cnn": CNNPolicyConfig,
    "tiny_vla": TinyVLAConfig,
    "hf_vla": HFVLAConfig,
    "smolvla": SmolVLAPolicyConfig,
}
