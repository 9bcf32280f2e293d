"""SmolVLA (Shukor et al., 2025): a SmolVLM backbone and a flow-matching action expert, in
LeRobot's checkpoint layout.

:class:`SmolVLAModel` holds LeRobot's parameter names (``model.vlm_with_expert.vlm...``,
``model.vlm_with_expert.lm_expert...``, ``model.state_proj``, ``model.action_in_proj``,
``model.action_out_proj``, ``model.action_time_mlp_in/out``), so a LeRobot ``model.safetensors``
loads with ``strict=True`` and a saved folder loads in LeRobot. It computes what LeRobot's
``VLAFlowMatching`` computes, written afresh:

* prefix: each camera's image tokens (vision tower + pixel-shuffle connector, scaled by
  ``sqrt(width)``), the language tokens (scaled likewise) and one state token
  (``state_proj`` of the zero-padded state). Image and language tokens attend to each other;
  the state token starts a new block.
* suffix: one token per action of the chunk, ``action_time_mlp_out(silu(action_time_mlp_in(
  [action_in_proj(x_t), sincos(t)])))``, causal among themselves.
* flow matching (the openpi convention): ``x_t = t * noise + (1 - t) * actions``, the network
  predicts the velocity ``u_t = noise - actions``; ``t ~ Beta(1.5, 1) * 0.999 + 0.001`` for
  training; sampling integrates from ``t = 1`` (noise) to ``t = 0`` by ``num_steps`` Euler steps
  of ``dt = -1 / num_steps``.

Inputs are what ``VLAFlowMatching`` takes: images ``(B, 3, H, W)`` already resized and mapped to
[-1, 1], token ids with their masks, the state (zero-padded here to ``max_state_dim``); outputs
have ``max_action_dim`` columns (the caller keeps its own first ones).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from harness.policies.smolvla.architecture import MAX_PARAMETERS, SmolVLAConfig, tiny_config
from harness.policies.smolvla.folder import match_state, read_checkpoint, write_checkpoint
from harness.policies.smolvla.layers import KeyValues, VLMWithExpert

__all__ = ["SmolVLAModel", "tiny_config", "sinusoidal_time_embedding", "sample_flow_time"]

TIME_BETA = 1.5  # t ~ Beta(TIME_BETA, 1) * TIME_SCALE + TIME_OFFSET
TIME_SCALE, TIME_OFFSET = 0.999, 0.001


def sinusoidal_time_embedding(time: torch.Tensor, dim: int, min_period: float,
                              max_period: float) -> torch.Tensor:
    """``[sin(2 pi t / p_k), cos(2 pi t / p_k)]`` for ``dim / 2`` periods ``p_k`` spaced
    geometrically from ``min_period`` to ``max_period`` (computed in float64, as openpi does).

    Args:
        time: ``(B,)`` flow times.
        dim: Even embedding width.
        min_period, max_period: The shortest and longest periods.

    Returns:
        ``(B, dim)`` float64 (float32 on MPS).
    """
    if dim % 2:
        raise ValueError(f"time embedding width {dim} must be even")
    dtype = torch.float32 if time.device.type == "mps" else torch.float64
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=dtype, device=time.device)
    period = min_period * (max_period / min_period) ** fraction
    phase = time[:, None] * (1.0 / period * 2 * math.pi)[None, :]
    return torch.cat([torch.sin(phase), torch.cos(phase)], dim=1)


def sample_flow_time(batch: int, generator: torch.Generator | None = None,
                     device: torch.device | str = "cpu") -> torch.Tensor:
    """``(batch,)`` training times ``Beta(1.5, 1) * 0.999 + 0.001``.

    ``Beta(a, 1)`` has CDF ``u^a``, so ``U^(1/a)`` with ``U`` uniform is exact and takes a
    generator (``torch.distributions.Beta`` does not).
    """
    uniform = torch.rand(batch, generator=generator, device=device)
    return uniform ** (1.0 / TIME_BETA) * TIME_SCALE + TIME_OFFSET


class FlowMatchingModules(nn.Module):
    """LeRobot's ``VLAFlowMatching`` parameters: the two-stream transformer and the projections
    between it and the state, the noisy actions, the flow time and the velocity."""

    def __init__(self, config: SmolVLAConfig) -> None:
        super().__init__()
        self.vlm_with_expert = VLMWithExpert(config)
        width = self.vlm_with_expert.vlm.config.text_config.hidden_size
        expert = self.vlm_with_expert.expert_width
        arch = config.arch
        self.state_proj = nn.Linear(arch.max_state_dim, width)
        self.action_in_proj = nn.Linear(arch.max_action_dim, expert)
        self.action_out_proj = nn.Linear(expert, arch.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * expert, expert)
        self.action_time_mlp_out = nn.Linear(expert, expert)


class SmolVLAModel(nn.Module):
    """SmolVLA's network with LeRobot's parameter names; see the module docstring.

    Attributes:
        config: The policy and backbone configs.
        model: The parameters (:class:`FlowMatchingModules`).
    """

    def __init__(self, config: SmolVLAConfig) -> None:
        super().__init__()
        self.config = config
        self.model = FlowMatchingModules(config)

    @classmethod
    def from_folder(cls, folder: str | os.PathLike,
                    vlm_config: dict[str, Any] | str | os.PathLike | None = None,
                    patch_positions: str = "exact",
                    max_parameters: int = MAX_PARAMETERS) -> SmolVLAModel:
        """Load a LeRobot SmolVLA checkpoint folder (``config.json`` + ``model.safetensors``).

        Nothing is downloaded and no code from the folder runs; the folder is checked whole
        before the network is built (see :mod:`harness.policies.smolvla.folder`).

        Args:
            folder: The checkpoint folder.
            vlm_config: The backbone's config when neither the folder's ``vlm_config.json`` nor
                a local ``vlm_model_name`` gives it: a dict, a folder or a ``config.json``.
            patch_positions: The vision tower's patch-position rule, ``"exact"`` (transformers
                5, LeRobot 0.6) or ``"shifted"`` (transformers 4.57, LeRobot 0.4.4); see
                :class:`~harness.policies.smolvla.architecture.SmolVLAConfig`.
            max_parameters: The largest network accepted, in parameters.

        Returns:
            The network in eval mode, on the CPU, float32.

        Raises:
            CheckpointError: The folder is not a SmolVLA checkpoint (naming it and why).
        """
        config, tensors = read_checkpoint(folder, cls, vlm_config, patch_positions,
                                          max_parameters)
        model = cls(config)
        state = match_state(model, tensors, str(Path(folder) / "model.safetensors"))
        model.load_state_dict(state, strict=True)
        return model.eval()

    def save_folder(self, folder: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write a LeRobot-layout checkpoint folder atomically (temporary folder, then rename):
        ``config.json``, ``model.safetensors`` and ``vlm_config.json`` (the backbone's config,
        which LeRobot ignores and :meth:`from_folder` reads).

        Raises:
            FileExistsError: ``folder`` exists and ``overwrite`` is false.
        """
        return write_checkpoint(folder, self.config, self, overwrite=overwrite)

    def cast_transformer(self, dtype: torch.dtype) -> SmolVLAModel:
        """Put the backbone and the expert in ``dtype`` (``torch.bfloat16`` halves their memory).

        The small projections between them and the state, the noisy actions, the flow time and
        the velocity stay float32, as in LeRobot; attention and rotary positions are computed
        in float32 whatever the weights' dtype, and velocities come out float32.
        """
        self.model.vlm_with_expert.to(dtype)
        return self

    def embed_prefix(self, images: list[torch.Tensor], img_masks: list[torch.Tensor],
                     lang_tokens: torch.Tensor, lang_masks: torch.Tensor, state: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Image, language and state tokens.

        Returns:
            ``(embeddings (B, P, width), pad_masks (B, P) bool, block_starts (B, P) bool)``,
            padded with empty tokens to ``prefix_length`` when it is longer.
        """
        parts = self.model.vlm_with_expert
        embeddings, pads, starts = [], [], []
        for image, image_mask in zip(images, img_masks, strict=True):
            tokens = parts.embed_image(image)
            tokens = tokens * torch.tensor(tokens.shape[-1] ** 0.5, dtype=tokens.dtype,
                                           device=tokens.device)
            embeddings.append(tokens)
            pads.append(image_mask[:, None].expand(*tokens.shape[:2]))
            starts += [0] * tokens.shape[1]
        words = parts.embed_tokens(lang_tokens)
        embeddings.append(words * math.sqrt(words.shape[-1]))
        pads.append(lang_masks.bool())
        starts += [0] * words.shape[1]
        state_token = self.model.state_proj(self._pad(state, "max_state_dim"))[:, None, :]
        embeddings.append(state_token.to(words.dtype))
        pads.append(torch.ones(state.shape[0], 1, dtype=torch.bool, device=state.device))
        starts.append(1)
        embeddings, pads = torch.cat(embeddings, dim=1), torch.cat(pads, dim=1)
        block_starts = torch.tensor(starts, dtype=torch.bool, device=pads.device)[None, :]
        missing = self.config.arch.prefix_length - pads.shape[1]
        if missing > 0:
            embeddings = F.pad(embeddings, (0, 0, 0, missing))
            pads, block_starts = F.pad(pads, (0, missing)), F.pad(block_starts, (0, missing))
        return embeddings, pads, block_starts.expand(pads.shape[0], -1)

    def embed_suffix(self, noisy_actions: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """``(B, chunk, max_action_dim)`` noisy actions at ``(B,)`` times -> expert inputs."""
        actions = self.model.action_in_proj(noisy_actions)
        arch = self.config.arch
        phase = sinusoidal_time_embedding(time, actions.shape[-1], arch.min_period,
                                          arch.max_period).to(actions.dtype)
        fused = torch.cat([actions, phase[:, None, :].expand_as(actions)], dim=2)
        return self.model.action_time_mlp_out(F.silu(self.model.action_time_mlp_in(fused)))

    def velocity(self, cache: KeyValues, prefix_pad_masks: torch.Tensor,
                 noisy_actions: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """The predicted velocity ``(B, chunk, max_action_dim)`` (float32) at ``(x_t, t)``."""
        suffix = self.embed_suffix(noisy_actions, time)
        batch, length = suffix.shape[:2]
        ones = torch.ones(batch, length, dtype=torch.bool, device=suffix.device)
        out = self.model.vlm_with_expert.expert(suffix, cache, prefix_pad_masks, ones, ones)
        return self.model.action_out_proj(out[:, -self.config.arch.chunk_size:].float())

    def encode(self, images: list[torch.Tensor], lang_tokens: torch.Tensor,
               lang_masks: torch.Tensor, state: torch.Tensor,
               img_masks: list[torch.Tensor] | None = None
               ) -> tuple[KeyValues, torch.Tensor]:
        """The prefix's per-layer keys and values and its pad mask, computed once per
        observation and shared by every denoising step.

        Args:
            images: Per camera ``(B, 3, H, W)`` in [-1, 1].
            lang_tokens: ``(B, L)`` token ids.
            lang_masks: ``(B, L)`` true for real tokens.
            state: ``(B, state_dim)``, ``state_dim <= max_state_dim``.
            img_masks: Per camera ``(B,)`` true where the camera is present (default all).
        """
        if img_masks is None:
            img_masks = [torch.ones(image.shape[0], dtype=torch.bool, device=image.device)
                         for image in images]
        embeddings, pads, starts = self.embed_prefix(images, img_masks, lang_tokens,
                                                     lang_masks, state)
        return self.model.vlm_with_expert.prefix_cache(embeddings, pads, starts), pads

    def sample_actions(self, images: list[torch.Tensor], lang_tokens: torch.Tensor,
                       lang_masks: torch.Tensor, state: torch.Tensor,
                       noise: torch.Tensor | None = None, num_steps: int | None = None,
                       img_masks: list[torch.Tensor] | None = None,
                       generator: torch.Generator | None = None) -> torch.Tensor:
        """An action chunk by Euler integration of the velocity from noise (``t = 1``) to
        actions (``t = 0``); the same ``noise`` gives the same chunk.

        Args:
            images, lang_tokens, lang_masks, state, img_masks: See :meth:`encode`.
            noise: ``(B, chunk, max_action_dim)`` start; drawn from ``N(0, I)`` with
                ``generator`` when ``None``.
            num_steps: Euler steps (default ``num_steps`` of the config).
            generator: For ``noise`` when it is drawn here.

        Returns:
            ``(B, chunk, max_action_dim)`` float32.
        """
        steps = self.config.arch.num_steps if num_steps is None else num_steps
        if steps < 1:
            raise ValueError(f"num_steps={steps} must be >= 1")
        if noise is None:
            shape = (state.shape[0], self.config.arch.chunk_size, self.config.arch.max_action_dim)
            noise = torch.randn(shape, generator=generator, device=state.device)
        self._check_actions(noise, "noise")
        cache, prefix_pads = self.encode(images, lang_tokens, lang_masks, state, img_masks)
        dt = -1.0 / steps
        x_t = noise
        for step in range(steps):
            time = torch.full((x_t.shape[0],), 1.0 + step * dt, dtype=torch.float32,
                              device=x_t.device)
            x_t = x_t + dt * self.velocity(cache, prefix_pads, x_t, time)
        return x_t

    def flow_loss(self, images: list[torch.Tensor], lang_tokens: torch.Tensor,
                  lang_masks: torch.Tensor, state: torch.Tensor, actions: torch.Tensor,
                  noise: torch.Tensor | None = None, time: torch.Tensor | None = None,
                  img_masks: list[torch.Tensor] | None = None,
                  generator: torch.Generator | None = None,
                  reduction: str = "mean") -> torch.Tensor:
        """The flow-matching (behaviour cloning) loss ``|v_theta(x_t, t) - (noise - a)|^2``.

        Args:
            images, lang_tokens, lang_masks, state, img_masks: See :meth:`encode`.
            actions: ``(B, chunk, action_dim)`` demonstrated actions, ``action_dim <=
                max_action_dim`` (zero-padded here).
            noise: ``(B, chunk, max_action_dim)``; drawn with ``generator`` when ``None``.
            time: ``(B,)`` flow times; :func:`sample_flow_time` when ``None``.
            generator: For whatever is drawn here.
            reduction: ``"mean"`` (a scalar) or ``"none"`` (``(B, chunk, max_action_dim)``).

        Returns:
            The loss.
        """
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction={reduction!r}; expected 'mean' or 'none'")
        actions = self._pad(actions, "max_action_dim")
        self._check_actions(actions, "actions")
        if noise is None:
            noise = torch.randn(actions.shape, generator=generator, device=actions.device)
        if time is None:
            time = sample_flow_time(actions.shape[0], generator, actions.device)
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        cache, prefix_pads = self.encode(images, lang_tokens, lang_masks, state, img_masks)
        losses = F.mse_loss(self.velocity(cache, prefix_pads, x_t, time), noise - actions,
                            reduction="none")
        return losses.mean() if reduction == "mean" else losses

    def _pad(self, values: torch.Tensor, field: str) -> torch.Tensor:
        """Zero-pad the last axis of ``values`` to the config's ``field`` width."""
        width = getattr(self.config.arch, field)
        if values.shape[-1] > width:
            raise ValueError(f"last axis of {tuple(values.shape)} exceeds {field}={width}")
        return F.pad(values, (0, width - values.shape[-1]))

    def _check_actions(self, values: torch.Tensor, name: str) -> None:
        arch = self.config.arch
        if values.ndim != 3 or tuple(values.shape[1:]) != (arch.chunk_size, arch.max_action_dim):
            raise ValueError(f"{name} has shape {tuple(values.shape)}; expected (B, "
                             f"{arch.chunk_size}, {arch.max_action_dim}) (chunk_size, "
                             "max_action_dim)")
