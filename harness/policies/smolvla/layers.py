"""SmolVLA's two-stream transformer: a truncated SmolVLM and an action expert reading its layers.

The backbone (``vlm``, a ``SmolVLMForConditionalGeneration`` cut to its first layers) runs over
the *prefix*: image tokens, language tokens and one state token. The expert (``lm_expert``, a
narrower LLaMA without token embeddings) runs over the *suffix*: one token per action of the
chunk. Backbone layer ``i`` is paired with expert layer ``i // m`` when ``i`` is a multiple of
``m = backbone layers / expert layers`` (other backbone layers leave the suffix as it is), and
is either

* a self-attention layer: the expert's queries attend to the backbone's keys and values of that
  layer followed by the expert's own (suffix tokens causal among themselves), or
* a cross-attention layer: the expert's ``k_proj``/``v_proj`` map the backbone's (rotated) keys
  and values of that layer to the expert's width, and its queries attend to those only.

The prefix never attends to the suffix (LeRobot's attention masks forbid it), so its keys and
values do not depend on the actions: :meth:`VLMWithExpert.prefix_cache` computes them once and
every denoising step, and the training loss, reuse them. Positions use LeRobot's rotary
embedding (wavelength 10,000, whatever the backbone's ``rope_theta``); attention runs in float32
with the backbone's head count, whatever the dtype of the weights. With gradient checkpointing
on, each layer's activations are recomputed in the backward pass instead of kept. Parameter
names are LeRobot's (``vlm.model.text_model...``, ``lm_expert.layers...``), so a checkpoint's
tensors load as they are.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from harness.policies.smolvla.architecture import SmolVLAConfig, build_vlm, expert_intermediate_size

ROPE_WAVELENGTH = 10_000
KeyValues = list[tuple[torch.Tensor, torch.Tensor]]  # per backbone layer, each (B, P, KVH, D)


def rotary(x: torch.Tensor, positions: torch.Tensor,
           wavelength: float = ROPE_WAVELENGTH) -> torch.Tensor:
    """Rotate pairs ``(x[..., k], x[..., k + D/2])`` by ``position / wavelength^(2k/D)``.

    Args:
        x: ``(B, L, H, D)`` queries or keys.
        positions: ``(B, L)`` integer positions.
        wavelength: The longest wavelength.

    Returns:
        ``(B, L, H, D)`` in the dtype of ``x`` (computed in float32).
    """
    half = x.shape[-1] // 2
    dtype, x = x.dtype, x.float()
    exponents = (2.0 / x.shape[-1]) * torch.arange(half, dtype=torch.float32, device=x.device)
    angles = positions[..., None].float() / (wavelength ** exponents)[None, None, :]
    sin, cos = torch.sin(angles)[..., None, :], torch.cos(angles)[..., None, :]
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1).to(dtype)


def attention_mask_2d(pad_masks: torch.Tensor, block_starts: torch.Tensor) -> torch.Tensor:
    """Which token may attend to which (big_vision's prefix-LM masks, as LeRobot uses them).

    A token attends to every non-padding token whose running count of block starts is at most
    its own: ``[0, 0, 1]`` lets the first two attend to each other and the third to all three;
    ``[1, 1, 1]`` is causal.

    Args:
        pad_masks: ``(B, L)`` true for real tokens.
        block_starts: ``(B, L)`` 1 where a token starts a block later tokens may not read past.

    Returns:
        ``(B, L, L)`` boolean, ``[b, query, key]``.
    """
    blocks = torch.cumsum(block_starts, dim=1)
    allowed = blocks[:, None, :] <= blocks[:, :, None]
    return allowed & (pad_masks[:, None, :] & pad_masks[:, :, None])


def patch_positions(rows: int, cols: int, table_side: int, rule: str,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """The position-table row of each patch of a ``rows x cols`` grid, row-major.

    SmolVLM's vision tower has a ``table_side x table_side`` table of position embeddings and
    places patch ``(h, w)`` at ``bucket(h / rows) * table_side + bucket(w / cols)``, where
    ``bucket(f)`` counts the boundaries ``k / table_side`` (``k = 1 .. table_side - 1``) at or
    below ``f``; see :class:`~harness.policies.smolvla.architecture.SmolVLAConfig` for the two
    rules.

    Returns:
        ``(rows * cols,)`` int64.
    """
    boundaries = torch.arange(1 / table_side, 1.0, 1 / table_side, device=device)

    def buckets(count: int) -> torch.Tensor:
        index = torch.arange(count, dtype=torch.float32, device=device)
        total = torch.tensor(count, device=device)
        if rule == "exact":
            fraction = torch.clamp(index * (1.0 / total), max=1.0 - 1e-6)
        else:
            fraction = index / total * (1 - 1e-6)
        return torch.bucketize(fraction, boundaries, right=True)

    return (buckets(rows)[:, None] * table_side + buckets(cols)[None, :]).reshape(-1)


def grouped_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention in float32 with key/value heads shared by groups of query heads.

    Args:
        queries: ``(B, Lq, H, D)``.
        keys, values: ``(B, Lk, G, D)`` with ``H`` a multiple of ``G``; query head ``h`` reads
            key/value head ``h // (H / G)``.
        mask: ``(B, Lq, Lk)`` boolean, true where attention is allowed.

    Returns:
        ``(B, Lq, H * D)`` in the dtype of ``values``.
    """
    batch, length, kv_heads, dim = keys.shape
    groups = queries.shape[2] // kv_heads
    keys = keys[:, :, :, None, :].expand(batch, length, kv_heads, groups, dim).reshape(
        batch, length, kv_heads * groups, dim)
    values = values[:, :, :, None, :].expand(batch, length, kv_heads, groups, dim).reshape(
        batch, length, kv_heads * groups, dim)
    scores = torch.matmul(queries.float().transpose(1, 2), keys.float().permute(0, 2, 3, 1))
    scores = scores * dim**-0.5
    scores = torch.where(mask[:, None], scores, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    out = torch.matmul(probs, values.transpose(1, 2)).transpose(1, 2)
    return out.reshape(batch, out.shape[1], -1)


def project(layer: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A LLaMA layer's normalised queries, keys and values, each ``(B, L, heads, D)``."""
    normed = layer.input_layernorm(hidden)
    shape = (*normed.shape[:-1], -1, layer.self_attn.head_dim)
    attn = layer.self_attn
    return (attn.q_proj(normed).view(shape), attn.k_proj(normed).view(shape),
            attn.v_proj(normed).view(shape))


def finish(layer: nn.Module, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """The rest of a pre-norm LLaMA layer: output projection, residual, MLP, residual."""
    hidden = layer.self_attn.o_proj(attended) + hidden
    return layer.mlp(layer.post_attention_layernorm(hidden)) + hidden


def backbone_layer(layer: nn.Module, hidden: torch.Tensor, positions: torch.Tensor,
                   mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One backbone layer over the prefix.

    Returns:
        ``(hidden (B, P, width), keys, values)``, the keys rotated, each ``(B, P, KVH, D)``.
    """
    queries, keys, values = project(layer, hidden)
    keys = rotary(keys, positions)
    hidden = finish(layer, hidden, grouped_attention(rotary(queries, positions), keys, values,
                                                     mask))
    return hidden, keys, values


class VLMWithExpert(nn.Module):
    """The backbone and the action expert (LeRobot's ``SmolVLMWithExpertModel`` layout).

    Attributes:
        vlm: ``SmolVLMForConditionalGeneration``, text model cut to the kept layers.
        lm_expert: ``LlamaModel`` of width ``expert_width_multiplier`` times the backbone's,
            without token embeddings; cross-attention layers take keys and values of the
            backbone's key/value width.
        gradient_checkpointing: Whether :meth:`set_gradient_checkpointing` turned it on.
    """

    def __init__(self, config: SmolVLAConfig) -> None:
        from transformers import LlamaModel

        super().__init__()
        self.config = config
        self.vlm = build_vlm(config)
        text = self.vlm.config.text_config
        expert_config = copy.deepcopy(text)
        expert_config.hidden_size = int(text.hidden_size * config.arch.expert_width_multiplier)
        expert_config.intermediate_size = expert_intermediate_size(expert_config.hidden_size)
        expert_config.num_hidden_layers = config.layer_counts()[1]
        self.lm_expert = LlamaModel(expert_config)
        self.lm_expert.embed_tokens = None
        kv_width = text.num_key_value_heads * text.head_dim
        for index, layer in enumerate(self.lm_expert.layers):
            if not config.self_attention_at(index):
                bias = expert_config.attention_bias
                layer.self_attn.k_proj = nn.Linear(kv_width, kv_width, bias=bias)
                layer.self_attn.v_proj = nn.Linear(kv_width, kv_width, bias=bias)
        self.expert_width = expert_config.hidden_size
        self.gradient_checkpointing = False

    def set_gradient_checkpointing(self, on: bool) -> None:
        """Recompute the activations of every backbone layer (vision tower included) and every
        expert layer in the backward pass (``use_reentrant=False``), in training mode only."""
        from harness.policies.hf_vla.models import set_checkpointing

        self.gradient_checkpointing = on
        set_checkpointing(self.backbone.vision_model, on)

    @property
    def backbone(self) -> nn.Module:
        """The SmolVLM model inside ``vlm`` (vision tower, connector, text model)."""
        return self.vlm.model

    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` pixels in [-1, 1] -> ``(B, tokens, width)`` through the vision
        tower (patch positions by the config's rule, all patches real) and the pixel-shuffle
        connector."""
        tower = self.backbone.vision_model
        embed = tower.embeddings
        patches = embed.patch_embedding(pixels.to(tower.dtype)).flatten(2).transpose(1, 2)
        rows, cols = pixels.shape[2] // embed.patch_size, pixels.shape[3] // embed.patch_size
        positions = patch_positions(rows, cols, embed.num_patches_per_side,
                                    self.config.patch_positions, pixels.device)
        hidden = tower.encoder(inputs_embeds=patches + embed.position_embedding(positions)[None],
                               attention_mask=None).last_hidden_state
        return self.backbone.connector(tower.post_layernorm(hidden))

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` token ids -> ``(B, L, width)`` backbone embeddings."""
        return self.backbone.text_model.get_input_embeddings()(tokens)

    def expert_layer_at(self, layer: int) -> nn.Module | None:
        """The expert layer paired with backbone layer ``layer``, if any."""
        vlm_layers, expert_layers = self.config.layer_counts()
        step = vlm_layers // expert_layers
        return self.lm_expert.layers[layer // step] if layer % step == 0 else None

    def prefix_cache(self, embeddings: torch.Tensor, pad_masks: torch.Tensor,
                     block_starts: torch.Tensor) -> KeyValues:
        """Run the backbone over the prefix and keep each layer's rotated keys and values.

        Args:
            embeddings: ``(B, P, width)`` prefix embeddings.
            pad_masks: ``(B, P)`` true for real tokens.
            block_starts: ``(B, P)`` see :func:`attention_mask_2d`.

        Returns:
            Per backbone layer ``(keys, values)``, each ``(B, P, KVH, D)``.
        """
        mask = attention_mask_2d(pad_masks, block_starts)
        positions = torch.cumsum(pad_masks, dim=1) - 1
        hidden, cache = embeddings, []
        for layer in self.backbone.text_model.layers:
            hidden, keys, values = self._run(backbone_layer, layer, hidden, positions, mask)
            cache.append((keys, values))
        return cache

    def expert(self, suffix: torch.Tensor, cache: KeyValues, prefix_pad_masks: torch.Tensor,
               suffix_pad_masks: torch.Tensor, suffix_block_starts: torch.Tensor
               ) -> torch.Tensor:
        """Run the expert over the suffix, reading the prefix through ``cache``.

        Args:
            suffix: ``(B, S, expert width)`` action-time embeddings.
            cache: :meth:`prefix_cache` of the prefix.
            prefix_pad_masks: ``(B, P)`` true for real prefix tokens.
            suffix_pad_masks, suffix_block_starts: ``(B, S)`` see :func:`attention_mask_2d`.

        Returns:
            ``(B, S, expert width)`` after the expert's final norm.
        """
        batch, length = suffix.shape[:2]
        prefix_mask = prefix_pad_masks[:, None, :].expand(batch, length, -1)
        mask = torch.cat([prefix_mask, attention_mask_2d(suffix_pad_masks, suffix_block_starts)],
                         dim=2)
        positions = prefix_pad_masks.sum(dim=-1)[:, None] + torch.cumsum(suffix_pad_masks,
                                                                         dim=1) - 1
        hidden = suffix.to(self.lm_expert.norm.weight.dtype)
        for index, (prefix_keys, prefix_values) in enumerate(cache):
            layer = self.expert_layer_at(index)
            if layer is None:
                continue
            if self.config.self_attention_at(index):
                hidden = self._run(self._self_attend_layer, layer, hidden, prefix_keys,
                                   prefix_values, positions, mask)
            else:
                hidden = self._run(self._cross_attend_layer, layer, hidden, prefix_keys,
                                   prefix_values, positions - positions.min(dim=1, keepdim=True)[0],
                                   prefix_mask)
        return self.lm_expert.norm(hidden)

    def _run(self, function, *args):
        """``function(*args)``, its activations recomputed in the backward pass when gradient
        checkpointing is on and the module trains with gradients."""
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(function, *args, use_reentrant=False)
        return function(*args)

    @staticmethod
    def _self_attend_layer(layer: nn.Module, hidden: torch.Tensor, prefix_keys: torch.Tensor,
                           prefix_values: torch.Tensor, positions: torch.Tensor,
                           mask: torch.Tensor) -> torch.Tensor:
        """An expert layer whose queries attend to the backbone's keys and values of its layer
        followed by the suffix's own."""
        queries, keys, values = project(layer, hidden)
        keys = torch.cat([prefix_keys, rotary(keys, positions)], dim=1)
        values = torch.cat([prefix_values, values], dim=1)
        return finish(layer, hidden,
                      grouped_attention(rotary(queries, positions), keys, values, mask))

    @classmethod
    def _cross_attend_layer(cls, layer: nn.Module, hidden: torch.Tensor,
                            prefix_keys: torch.Tensor, prefix_values: torch.Tensor,
                            positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """An expert layer that cross-attends to the backbone's keys and values."""
        return finish(layer, hidden, cls._cross_attend(layer, hidden, prefix_keys,
                                                       prefix_values, positions, mask))

    @staticmethod
    def _cross_attend(layer: nn.Module, hidden: torch.Tensor, prefix_keys: torch.Tensor,
                      prefix_values: torch.Tensor, positions: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
        """Expert queries (positions counted from 0) over the backbone's keys and values,
        mapped by the expert's ``k_proj``/``v_proj`` (the keys are not rotated again)."""
        attn, head_dim = layer.self_attn, layer.self_attn.head_dim
        normed = layer.input_layernorm(hidden)
        queries = attn.q_proj(normed).view(*normed.shape[:-1], -1, head_dim)
        flat = prefix_keys.shape[:2]
        keys = attn.k_proj(prefix_keys.reshape(*flat, -1)).view(*flat, -1, head_dim)
        values = attn.v_proj(prefix_values.reshape(*flat, -1)).view(*flat, -1, head_dim)
        return grouped_attention(rotary(queries, positions), keys, values, mask)
