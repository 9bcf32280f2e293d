"""Action tokens and observation batches: the vocabulary every token policy shares.

Vision-language-action models (RT-2, OpenVLA) discretise every action dimension into ``K``
uniform bins and predict one token per dimension. Here bin centres are ``linspace(-1, 1, K)``
over the action space ``Box(-1, 1, (action_dim,))``.

Observations are dicts of batched tensors with some of the keys ``state`` float ``(B, D)``,
``pixels`` uint8 ``(B, H, W, 3)``, ``proprio`` float ``(B, P)`` and ``instruction`` int64
``(B, L)`` token ids padded with :data:`tasks.language.PAD`. Use :func:`obs_to_batch` to turn
numpy observations from an environment into such a dict.
"""


from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

KINDS: tuple[str, ...] = ("mlp", "tiny_vla", "hf_vla", "smolvla")
IMAGE_FEATURES: tuple[str, ...] = ("spatial_softmax", "avg_pool")
PROPRIO_INPUTS: tuple[str, ...] = ("projection", "none")  # how hf_vla reads proprio
HEAD_KINDS: tuple[str, ...] = ("tokens", "gaussian", "flow")  # harness.policies.action_heads
FLOW_NOISE: tuple[str, ...] = ("learned", "network")  # harness.policies.flow_head.NOISE_KINDS

ObsShapes = dict[str, tuple[int, ...]]


# --- discretisation ---------------------------------------------------------------------------


def actions_to_tokens(actions: torch.Tensor | np.ndarray, num_bins: int) -> torch.Tensor:
    """Index of the nearest of ``num_bins`` bin centres ``linspace(-1, 1, num_bins)``.

    Args:
        actions: Float actions of any shape; values outside ``[-1, 1]`` go to the end bins.
        num_bins: ``K >= 2``.

    Returns:
        Int64 tokens in ``[0, K)``, same shape as ``actions``.

    Raises:
        ValueError: ``num_bins < 2``.
    """
    _check_num_bins(num_bins)
    actions = torch.as_tensor(actions, dtype=torch.float32)
    scaled = (actions.clamp(-1.0, 1.0) + 1.0) * 0.5 * (num_bins - 1)
    return torch.round(scaled).long().clamp(0, num_bins - 1)


def tokens_to_actions(tokens: torch.Tensor | np.ndarray, num_bins: int) -> torch.Tensor:
    """Bin centres of ``tokens``: ``-1 + 2 * token / (K - 1)``.

    Args:
        tokens: Integer tokens in ``[0, K)``, any shape.
        num_bins: ``K >= 2``.

    Returns:
        Float32 actions in ``[-1, 1]``, same shape as ``tokens``.

    Raises:
        ValueError: ``num_bins < 2``.
    """
    _check_num_bins(num_bins)
    tokens = torch.as_tensor(tokens)
    return tokens.to(torch.float32) * (2.0 / (num_bins - 1)) - 1.0


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """Sample one token per row of ``logits`` by the inverse CDF of its softmax.

    Token ``k`` is drawn when ``u`` falls in ``[cdf[k-1], cdf[k])``, so a row's token depends
    only on that row's logits and its own number ``u``: the same ``u`` gives the same token
    whichever batch, worker or device the row was computed in. Zero-probability tokens are
    never drawn.

    Args:
        logits: ``(..., K)`` unnormalised scores (already divided by any temperature).
        uniforms: ``logits.shape[:-1]`` numbers in ``[0, 1)``; ``None`` draws them with
            torch's global generator.

    Returns:
        Int64 tokens, ``logits.shape[:-1]``.

    Raises:
        ValueError: ``uniforms`` has another shape.
    """
    if uniforms is None:
        uniforms = torch.rand(logits.shape[:-1], device=logits.device)
    uniforms = torch.as_tensor(uniforms, dtype=torch.float32, device=logits.device)
    if uniforms.shape != logits.shape[:-1]:
        raise ValueError(f"uniforms of shape {tuple(uniforms.shape)} for logits of shape "
                         f"{tuple(logits.shape)}; expected {tuple(logits.shape[:-1])}")
    cdf = torch.softmax(logits.float(), dim=-1).cumsum(dim=-1)
    cdf = cdf / cdf[..., -1:]  # the last entry exactly 1, so every u < 1 finds a token
    tokens = torch.searchsorted(cdf, uniforms.unsqueeze(-1).contiguous(), right=True)
    return tokens.squeeze(-1).clamp(max=logits.shape[-1] - 1)


def head_problem(kind: str, action_head: Any, flow_steps: Any = 4,
                 flow_noise: Any = "learned") -> str | None:
    """What is wrong with the action head ``action_head`` on a policy of ``kind``, as
    ``"field=value; ..."``, or ``None``."""
    if action_head not in HEAD_KINDS:
        return f"action_head={action_head!r}; choose one of {HEAD_KINDS}"
    if action_head != "tokens" and kind == "hf_vla":
        return (f"action_head={action_head!r} with kind='hf_vla', which decodes action tokens "
                "with its language-model head; need 'tokens' (the continuous heads run on "
                "mlp and tiny_vla)")
    if kind == "smolvla" and (action_head != "flow" or flow_noise != "learned"):
        return (f"action_head={action_head!r}, flow_noise={flow_noise!r} with kind='smolvla', "
                "whose action expert is a flow; need 'flow' with 'learned' noise")
    if action_head == "flow":
        if isinstance(flow_steps, bool) or not isinstance(flow_steps, int) or flow_steps < 1:
            return f"flow_steps={flow_steps!r}; need an int >= 1 (denoising steps)"
        if flow_noise not in FLOW_NOISE:
            return f"flow_noise={flow_noise!r}; choose one of {FLOW_NOISE}"
    return None


def chunk_problem(chunk_size: Any, execute_steps: Any) -> str | None:
    """What is wrong with an action chunk of ``chunk_size`` actions of which ``execute_steps``
    are played (``None``: all), in words naming both, or ``None`` when they are fine."""
    def positive(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    if not positive(chunk_size):
        return f"chunk_size={chunk_size!r}; need an int >= 1 (actions per decision)"
    if execute_steps is not None and not (positive(execute_steps)
                                          and execute_steps <= chunk_size):
        return (f"execute_steps={execute_steps!r} with chunk_size={chunk_size}; need an int in "
                f"[1, chunk_size] (actions of each chunk played before the next decision), or "
                "null for the whole chunk")
    return None


def _check_num_bins(num_bins: int) -> None:
    if num_bins < 2:
        raise ValueError(f"num_bins must be >= 2 to cover [-1, 1], got {num_bins}")


# --- configuration ----------------------------------------------------------------------------


@dataclass
class TokenPolicyConfig:
    """Everything needed to build a token policy, apart from the observation shapes.

    Attributes:
        kind: ``"mlp"`` (on ``state``), ``"tiny_vla"`` (on ``pixels``, plus ``proprio`` and
            ``instruction`` when the observation has them) or ``"hf_vla"`` (a ``transformers``
            vision-language model, :mod:`harness.policies.hf_vla`).
        num_bins: ``K``, tokens per action dimension.
        hidden: Width of the fused feature and of the MLP layers.
        action_dim: Action dimensions, one token each.
        embed_dim: Width of the instruction embedding and of the proprio encoder.
        conv_channels: Output channels of the image encoder's convolutions (stride 2, except
            a stride-1 last layer under ``spatial_softmax``, which keeps a finer map).
        pooled_size: ``avg_pool`` only: side of the adaptive average pool after the
            convolutions, so any image size (84 x 84 by default in the tasks) gives the same
            feature width.
        use_instruction: Condition on ``instruction`` when the observation has it.
        normalize_state: ``mlp``: standardise ``state`` by a per-dimension mean and standard
            deviation held in the policy (buffers saved with the weights, so exported and
            reloaded policies apply them too), fitted on the demos by behaviour cloning
            (:meth:`harness.policies.TokenPolicy.fit_normalizer`); the identity until then.
        image_features: How the last feature map becomes a vector: ``spatial_softmax`` (one
            expected image coordinate per channel, Levine et al. 2016, as robomimic's visual
            policies; keeps where things are) or ``avg_pool`` (a coarse pooled grid).
        instruction_keypoints: ``tiny_vla`` with ``spatial_softmax`` and the instruction: this
            many extra keypoints, each an average of the image keypoints weighted by a softmax
            over channels that the instruction sets (what "the named cube" is depends on the
            words); 0 adds none.
        model: ``hf_vla``: a named offline model (``tiny:idefics3``...) or a local folder.
        proprio: ``hf_vla``: ``projection`` (one prefix embedding projected from ``proprio``)
            or ``none``.
        dtype: ``hf_vla`` and ``smolvla``: ``float32`` or ``bfloat16``.
        lora_rank: ``hf_vla``: LoRA rank; 0 fine-tunes every weight.
        lora_alpha: ``hf_vla``: LoRA scale numerator (the update is ``alpha / rank * B A``).
        lora_dropout: ``hf_vla``: dropout on the adapters' input.
        lora_targets: ``hf_vla``: names of the linear layers that get adapters, or
            ``("all-linear",)``.
        lora_full_bc: ``hf_vla`` with LoRA: every weight trains until group fine-tuning starts
            (behaviour cloning, state pretraining), then only fresh adapters.
        gradient_checkpointing: ``hf_vla`` and ``smolvla``: recompute activations in the
            backward pass.
        chunk_size: ``H``, actions one decision predicts (an action chunk, as ACT, pi0 and
            SmolVLA predict): the policy scores ``H * action_dim`` tokens per observation.
            1 (the default) is one control step per decision. ``hf_vla`` decodes one step.
        execute_steps: ``k <= H``, actions of each chunk played before the next decision;
            ``None`` plays the whole chunk (``k = H``).
        action_head: ``mlp`` and ``tiny_vla``: ``tokens`` (``num_bins`` categorical tokens
            per action dimension, the default), ``gaussian`` (a tanh-squashed diagonal
            Gaussian over the chunk) or ``flow`` (a flow-matching action expert sampled with
            injected noise); :mod:`harness.policies.action_heads`.
        flow_steps: ``flow``: denoising steps ``K``.
        flow_noise: ``flow``: ``learned`` noise scales per step and entry, or ``network``
            (a small MLP on the step's input, as Flow-Noise).
        state_dependent_std: ``gaussian``: the scale from a linear layer on the features
            instead of one learned value per chunk entry.
    """

    kind: str = "mlp"
    num_bins: int = 11
    hidden: int = 128
    action_dim: int = 4
    embed_dim: int = 32
    conv_channels: tuple[int, ...] = (16, 32, 32)
    pooled_size: int = 4
    use_instruction: bool = True
    normalize_state: bool = False
    image_features: str = "spatial_softmax"
    instruction_keypoints: int = 0
    model: str = "tiny:idefics3"
    proprio: str = "projection"
    dtype: str = "float32"
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lora_full_bc: bool = False
    gradient_checkpointing: bool = False
    chunk_size: int = 1
    execute_steps: int | None = None
    action_head: str = "tokens"
    flow_steps: int = 4
    flow_noise: str = "learned"
    state_dependent_std: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"TokenPolicyConfig.kind={self.kind!r}; choose one of {KINDS}")
        problem = head_problem(self.kind, self.action_head, self.flow_steps, self.flow_noise)
        if problem is not None:
            raise ValueError(f"TokenPolicyConfig.{problem}")
        if self.image_features not in IMAGE_FEATURES:
            raise ValueError(
                f"TokenPolicyConfig.image_features={self.image_features!r}; choose one of"
                f" {IMAGE_FEATURES}"
            )
        if self.num_bins < 2:
            raise ValueError(f"TokenPolicyConfig.num_bins={self.num_bins}; need >= 2")
        for name in ("hidden", "action_dim", "embed_dim", "pooled_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TokenPolicyConfig.{name}={value!r}; need a positive int")
        if self.instruction_keypoints < 0 or (
                self.instruction_keypoints and self.image_features != "spatial_softmax"):
            raise ValueError(
                f"TokenPolicyConfig.instruction_keypoints={self.instruction_keypoints} with "
                f"image_features={self.image_features!r}; need >= 0, and spatial_softmax "
                "features to choose keypoints from"
            )
        self.conv_channels = tuple(self.conv_channels)
        if not self.conv_channels or any(
            not isinstance(c, int) or c < 1 for c in self.conv_channels
        ):
            raise ValueError(
                f"TokenPolicyConfig.conv_channels={self.conv_channels!r}; need positive ints"
            )
        self.lora_targets = tuple(self.lora_targets)
        if self.proprio not in PROPRIO_INPUTS or self.lora_rank < 0 or not (
                0.0 <= self.lora_dropout < 1.0):
            raise ValueError(f"TokenPolicyConfig.proprio={self.proprio!r}, lora_rank="
                             f"{self.lora_rank}, lora_dropout={self.lora_dropout}; need proprio in "
                             f"{PROPRIO_INPUTS}, lora_rank >= 0 and lora_dropout in [0, 1)")
        problem = chunk_problem(self.chunk_size, self.execute_steps)
        if problem is None and self.kind == "hf_vla" and self.chunk_size != 1:
            problem = (f"chunk_size={self.chunk_size} with kind='hf_vla', which decodes one "
                       "step's tokens per decision; need 1")
        if problem is not None:
            raise ValueError(f"TokenPolicyConfig.{problem}")

    @property
    def steps_per_decision(self) -> int:
        """``k``: control steps each decision plays (``execute_steps``, else ``chunk_size``)."""
        return self.chunk_size if self.execute_steps is None else self.execute_steps

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any]) -> TokenPolicyConfig:
        """The config a checkpoint stored; checkpoints from before ``image_features`` existed
        used ``avg_pool``.

        Raises:
            ValueError: A field this version does not know.
        """
        unknown = sorted(set(saved) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"policy config fields {unknown} are unknown to this version")
        return cls(**{"image_features": "avg_pool", **saved})


# --- observations -----------------------------------------------------------------------------


def obs_to_batch(
    obs: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
    device: torch.device | str | None = None,
    batched: bool = False,
) -> dict[str, torch.Tensor]:
    """Numpy observation dict(s) to a dict of batched tensors.

    Args:
        obs: One observation dict, a list of them, or (with ``batched``) one dict whose arrays
            already have a leading batch dimension, as a vector environment returns.
        device: Where the tensors go.
        batched: ``obs`` is a single dict that is already batched.

    Returns:
        Tensors with a leading batch dim: ``pixels`` stays uint8, ``instruction`` int64, the
        rest float32.
    """
    if isinstance(obs, Mapping):
        arrays = {k: np.asarray(v) if batched else np.asarray(v)[None] for k, v in obs.items()}
    else:
        arrays = {k: np.stack([np.asarray(o[k]) for o in obs]) for k in obs[0]}
    batch = {}
    for key, array in arrays.items():
        if key == "pixels":
            tensor = torch.as_tensor(array, dtype=torch.uint8)
        elif key == "instruction":
            tensor = torch.as_tensor(array, dtype=torch.int64)
        else:
            tensor = torch.as_tensor(array, dtype=torch.float32)
        batch[key] = tensor.to(device) if device is not None else tensor
    return batch


def obs_shapes_from_space(observation_space: spaces.Dict) -> ObsShapes:
    """Per-key observation shapes of a gymnasium ``Dict`` space.

    Raises:
        TypeError: ``observation_space`` is not a ``Dict`` of ``Box`` spaces.
    """
    if not isinstance(observation_space, spaces.Dict):
        raise TypeError(
            f"token policies take a gymnasium Dict observation space, got {observation_space}"
        )
    shapes = {}
    for key, space in observation_space.spaces.items():
        if not isinstance(space, spaces.Box):
            raise TypeError(f"observation {key!r} must be a Box space, got {space}")
        shapes[key] = tuple(int(d) for d in space.shape)
    return shapes


