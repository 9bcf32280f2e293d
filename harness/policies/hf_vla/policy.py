"""``hf_vla``: a vision-language model from ``transformers`` as an action-token policy.

The OpenVLA recipe (Kim et al. 2024) on a supported image-text-to-text model (PaliGemma;
Idefics3, as SmolVLM checkpoints are): the camera frame and the prompt ``"In: What action should
the robot take to {instruction}?\\nOut:"`` form the prefix (optionally followed by one
embedding projected from ``proprio``), and the model writes one action token per action
dimension, autoregressively.
Each dimension has ``K`` bins (centres ``linspace(-1, 1, K)``, :func:`tokens_to_actions`), and
bin ``k`` is the ``k``-th of ``K`` reserved vocabulary ids (:mod:`harness.policies.hf_vla.models`).
Every distribution here is the softmax over those ``K`` ids only.

* :meth:`HFVLAPolicy.act` decodes with the KV cache, one token per dimension, sampling each by
  the inverse CDF at the caller's uniforms (:func:`sample_tokens`) or taking the most likely.
* :meth:`HFVLAPolicy.log_prob` scores given tokens by teacher forcing in one forward pass; it
  equals the per-step log-probabilities of decoding.
* With LoRA (``peft``) only the adapters (and the value and proprio heads) train (every weight
  until group fine-tuning starts, with ``lora.full_bc``), and the KL reference is the same
  model with its adapters switched off (:meth:`frozen_reference`).

Frames are resized in torch to the vision tower's side (bilinear, antialiased) and normalised
with the processor's mean and std: one global image, no tiling. The processor builds each
distinct prompt once (image placeholders included) and the token ids are cached.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from harness.policies.contract import PolicySpec
from harness.policies.heads.base import BCScores
from harness.policies.heads.tokens import (
    chunk_token_targets,
    sample_tokens,
    token_bc_scores,
    token_cross_entropy,
    tokens_to_actions,
)
from harness.policies.hf_vla import HFVLAConfig
from harness.policies.hf_vla import folder as hf_folder
from harness.policies.hf_vla import models as hf_models
from harness.policies.observations import ObsShapes
from tasks.language import detokenize

PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
PROMPT_WITHOUT_INSTRUCTION = "In: What action should the robot take?\nOut:"
HEAD_SEED = 1  # value head, proprio projection and fresh LoRA adapters: rebuilt identically


class HFVLAPolicy(nn.Module):
    """A ``transformers`` vision-language model behind the policy contract
    (:class:`harness.policies.Policy`): its language-model head is the tokens head, one action
    per decision, one unit per token.

    Args:
        config: The ``hf_vla`` config.
        obs_shapes: Needs ``pixels``; ``instruction`` and ``proprio`` are read when present.

    Raises:
        ValueError: See :func:`harness.policies.hf_vla.models.load_model`, or a vocabulary that
            cannot hold the action bins.
        ImportError: The ``vla`` extra is not installed.
    """

    def __init__(self, config: HFVLAConfig, obs_shapes: ObsShapes) -> None:
        super().__init__()
        self.config = config
        self.obs_shapes = {k: tuple(int(d) for d in v) for k, v in obs_shapes.items()}
        dtype = hf_models.check_dtype(config.dtype, "cpu")
        vlm, self.processor = hf_models.load_model(config.model, config.num_bins, dtype)
        self.architecture = hf_models.ARCHITECTURES[vlm.config.model_type]
        text_config = vlm.config.get_text_config()
        self.hidden_size = int(text_config.hidden_size)
        self.softcap = getattr(text_config, "final_logit_softcapping", None)
        tokenizer = self.processor.tokenizer
        ids = hf_models.action_token_ids(tokenizer, vlm.get_output_embeddings().out_features,
                                         config.num_bins, config.model)
        self.register_buffer("action_ids", ids, persistent=False)
        self.image_token_id = int(vlm.config.image_token_id)
        self.pad_id = int(tokenizer.pad_token_id or 0)
        self.image_size = int(vlm.config.vision_config.image_size)
        image_processor = self.processor.image_processor
        for name in ("image_mean", "image_std"):
            values = getattr(image_processor, name, None) or [0.5, 0.5, 0.5]
            self.register_buffer(name, torch.tensor(values).view(1, 3, 1, 1), persistent=False)
        self.rescale = float(getattr(image_processor, "rescale_factor", 1 / 255))
        self.use_instruction = config.use_instruction and "instruction" in obs_shapes
        self.use_proprio = config.proprio == "projection" and "proprio" in obs_shapes
        self._prompts: dict[str, torch.Tensor] = {}
        folder = None if hf_models.hf_tiny.is_named(config.model) else Path(config.model)
        with torch.random.fork_rng(devices=[]), hf_models.quiet():
            torch.manual_seed(HEAD_SEED)
            self.value_head = nn.Sequential(nn.Linear(self.hidden_size, self.hidden_size),
                                            nn.Tanh(), nn.Linear(self.hidden_size, 1))
            if self.use_proprio:
                self.proprio_projection = nn.Linear(obs_shapes["proprio"][0], self.hidden_size)
            if folder is not None and (folder / hf_models.HEADS_FILE).is_file():
                from safetensors.torch import load_file

                self.load_state_dict(load_file(folder / hf_models.HEADS_FILE), strict=False)
            self.model = self._with_adapters(vlm, folder)
        if self.lora and config.lora.full_bc:  # until frozen_reference(): every weight trains
            self.vlm.requires_grad_(True)
        if config.gradient_checkpointing:
            hf_models.set_checkpointing(self.vlm, True)
        self._cache_arg = hf_models.cache_argument(self.inner)

    # --- the model and its adapters -----------------------------------------------------------

    @property
    def lora(self) -> bool:
        return self.config.lora is not None

    @property
    def spec(self) -> PolicySpec:
        dims = self.config.action_dim
        keys = ("pixels", *(("instruction",) if self.use_instruction else ()),
                *(("proprio",) if self.use_proprio else ()))
        return PolicySpec(kind=self.config.name, head="tokens", chunk_size=1, execute_steps=1,
                          action_dim=dims, units_per_step=dims, noise_width=dims,
                          feature_dim=self.hidden_size, input_keys=keys,
                          rollout_mode="batched", single_file=False,
                          folder_format="transformers")

    @property
    def vlm(self) -> nn.Module:
        """The ``transformers`` model (with the adapters' layers injected, under LoRA)."""
        return self.model.get_base_model() if self.lora else self.model

    @property
    def inner(self) -> nn.Module:
        """The model without its language-model head."""
        return self.vlm.model

    @property
    def image_encoder(self) -> nn.ModuleList:
        """Vision tower and projector (frozen by ``algo.freeze_encoder``)."""
        return nn.ModuleList(getattr(self.inner, name) for name in self.architecture.encoder)

    @property
    def feature_dim(self) -> int:
        return self.hidden_size

    def _lora_config(self):
        from peft import LoraConfig

        lora = self.config.lora
        targets = list(lora.target_modules)
        return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules="all-linear" if targets == ["all-linear"] else targets)

    def _with_adapters(self, vlm: nn.Module, folder: Path | None) -> nn.Module:
        """``vlm`` with fresh adapters (LoRA B = 0), or those saved in ``folder``; merged into
        the weights when this policy has no LoRA."""
        saved = folder / hf_models.ADAPTER_DIR if folder is not None else None
        if saved is not None and saved.is_dir():
            from peft import PeftModel

            adapted = PeftModel.from_pretrained(vlm, saved, is_trainable=self.lora)
            return adapted if self.lora else adapted.merge_and_unload()
        if not self.lora:
            return vlm
        from peft import get_peft_model

        return get_peft_model(vlm, self._lora_config())

    def frozen_reference(self):
        """The KL reference of group fine-tuning: this policy as it is now, frozen.

        With LoRA, the adapters trained so far (by BC, say) are merged into the base weights and
        fresh ones (B = 0) start, so the policy is unchanged and the reference is this very model
        with its adapters switched off (:class:`AdaptersOff`): no second copy of the weights.
        The proprio projection, which the reference shares, is frozen from here on with the base
        weights. Without LoRA, a frozen deep copy.
        """
        if not self.lora:
            reference = copy.deepcopy(self).eval()
            for parameter in reference.parameters():
                parameter.requires_grad_(False)
            return reference
        if self.use_proprio:
            self.proprio_projection.requires_grad_(False)
        base = self.model.merge_and_unload()
        with torch.random.fork_rng(devices=[]), hf_models.quiet():
            torch.manual_seed(HEAD_SEED)
            from peft import get_peft_model

            self.model = get_peft_model(base, self._lora_config())
        return AdaptersOff(self)

    @contextlib.contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Run the base model alone inside the block (a no-op without LoRA)."""
        with self.model.disable_adapter() if self.lora else contextlib.nullcontext():
            yield

    # --- inputs -------------------------------------------------------------------------------

    def prompt_text(self, instruction: str) -> str:
        """The OpenVLA prompt for ``instruction`` (without it when ``use_instruction`` is off)."""
        if not self.use_instruction:
            return PROMPT_WITHOUT_INSTRUCTION
        return PROMPT.format(instruction=instruction)

    def _prompt_ids(self, instruction: str) -> torch.Tensor:
        """Token ids of the prompt, image placeholders included, built once per instruction."""
        if instruction not in self._prompts:
            image = np.zeros((self.image_size, self.image_size, 3), np.uint8)
            text = self.processor.image_token + self.prompt_text(instruction)
            ids = torch.as_tensor(self.processor(text=text, images=image)["input_ids"][0])
            clash = sorted(set(ids.tolist()) & set(self.action_ids.tolist()))
            if clash:
                raise ValueError(f"policy.model={self.config.model!r}: the prompt uses ids "
                                 f"{clash[:5]} that are action tokens; the vocabulary cannot hold"
                                 f" policy.num_bins={self.config.num_bins} action bins")
            self._prompts[instruction] = ids
        return self._prompts[instruction]

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 ``pixels`` ``(B, H, W, 3)`` -> image tokens ``(B, n, hidden)`` for the prompt."""
        values = hf_models.pixel_values(pixels, self.image_size, self.image_mean, self.image_std,
                                        self.rescale)
        values = values.to(self.vlm.get_input_embeddings().weight.dtype)
        if self.architecture.image_dims == 5:
            values = values[:, None]
        features = self.inner.get_image_features(pixel_values=values)
        features = getattr(features, "pooler_output", features)
        if isinstance(features, (list, tuple)):
            features = torch.stack(list(features))
        return features.reshape(len(pixels), -1, self.hidden_size)

    def _prefix(self, obs: Mapping[str, torch.Tensor]):
        """Embeddings ``(B, L, H)``, attention mask ``(B, L)`` and positions ``(B, L)`` of the
        left-padded prompts (image tokens merged, the proprio embedding last)."""
        device = self.action_ids.device
        batch = len(obs["image_features"] if "image_features" in obs else obs["pixels"])
        if self.use_instruction:
            texts = [detokenize(row) for row in obs["instruction"].cpu().numpy()]
        else:
            texts = [""] * batch
        rows = [self._prompt_ids(text) for text in texts]
        length = max(len(row) for row in rows)
        ids = torch.full((batch, length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, length), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, length - len(row):], mask[i, length - len(row):] = row, 1
        ids, mask = ids.to(device), mask.to(device)
        embeds = self.vlm.get_input_embeddings()(ids)
        image = obs["image_features"] if "image_features" in obs else self.encode_image(
            obs["pixels"])
        placeholders = ids == self.image_token_id
        if not bool((placeholders.sum(dim=1) == image.shape[1]).all()):
            raise ValueError(f"policy.model={self.config.model!r}: the prompt has "
                             f"{placeholders.sum(dim=1).tolist()} image tokens for "
                             f"{image.shape[1]} image features")
        embeds = embeds.masked_scatter(placeholders.unsqueeze(-1), image.to(embeds.dtype))
        if self.use_proprio:
            extra = self.proprio_projection(obs["proprio"].float()).to(embeds.dtype)
            embeds = torch.cat([embeds, extra[:, None]], dim=1)
            mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0) + self.architecture.position_offset
        return embeds, mask, positions

    # --- forward passes -----------------------------------------------------------------------

    def _forward(self, embeds, mask, positions, suffix: int, cache=None) -> torch.Tensor:
        """Last hidden states ``(B, T, H)``; the last ``suffix`` inputs are action tokens."""
        kwargs = {"inputs_embeds": embeds, "attention_mask": mask,
                  "position_ids": positions[:, -embeds.shape[1]:], "use_cache": cache is not None}
        if cache is not None:
            kwargs[self._cache_arg] = cache
        if self.architecture.prefix_lm:  # the prompt sees itself both ways, actions causally
            types = torch.zeros_like(kwargs["position_ids"])
            types[:, types.shape[1] - suffix:] = 1
            kwargs["token_type_ids"] = types
        return self.inner(**kwargs).last_hidden_state

    def _action_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states ``(..., H)`` -> float32 scores of the action ids ``(..., K)``."""
        head = self.vlm.get_output_embeddings()
        if type(head) is nn.Linear:  # score only the K action rows, not the whole vocabulary
            bias = None if head.bias is None else head.bias[self.action_ids]
            logits = F.linear(hidden, head.weight[self.action_ids], bias)
        else:
            logits = head(hidden)[..., self.action_ids]
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.float()

    def _embed_actions(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.vlm.get_input_embeddings()(self.action_ids[tokens])

    def features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Float32 last hidden state of the prefix, ``(B, hidden)``: what predicts the first
        action token."""
        embeds, mask, positions = self._prefix(obs)
        return self._forward(embeds, mask, positions, suffix=0)[:, -1].float()

    def logits(self, obs: Mapping[str, torch.Tensor],
               tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Scores ``(B, action_dim, K)`` of each dimension's token given the earlier ones:
        ``tokens`` ``(B, action_dim)`` (teacher forcing, one pass), else the greedy ones."""
        if tokens is None:
            return self._decode(obs, lambda step_logits, _: step_logits.argmax(dim=-1))[1]
        embeds, mask, positions = self._prefix(obs)
        dims = self.config.action_dim
        previous = self._embed_actions(tokens[:, :-1].long().to(self.action_ids.device))
        steps = torch.arange(1, dims, device=mask.device)
        hidden = self._forward(
            torch.cat([embeds, previous], dim=1),
            torch.cat([mask, mask.new_ones(len(mask), dims - 1)], dim=1),
            torch.cat([positions, positions[:, -1:] + steps], dim=1), suffix=dims - 1)
        return self._action_logits(hidden[:, -dims:])

    def _decode(self, obs: Mapping[str, torch.Tensor],
                choose: Callable[[torch.Tensor, int], torch.Tensor]):
        """Decode one token per dimension with the KV cache; ``choose(logits (B, K), d)`` picks
        dimension ``d``'s. Returns ``(tokens (B, D), logits (B, D, K))``."""
        embeds, mask, positions = self._prefix(obs)
        cache = hf_models.new_cache(self.vlm.config)
        tokens, scores = [], []
        with self._cache_usable():
            hidden = self._forward(embeds, mask, positions, suffix=0, cache=cache)[:, -1]
            for dim in range(self.config.action_dim):
                step_logits = self._action_logits(hidden)
                token = choose(step_logits, dim)
                tokens.append(token)
                scores.append(step_logits)
                if dim + 1 < self.config.action_dim:
                    mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
                    positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
                    hidden = self._forward(self._embed_actions(token)[:, None], mask, positions,
                                           suffix=1, cache=cache)[:, -1]
        return torch.stack(tokens, dim=1), torch.stack(scores, dim=1)

    @contextlib.contextmanager
    def _cache_usable(self) -> Iterator[None]:
        """Gradient checkpointing turns the KV cache off in training mode; decoding needs it."""
        pause = self.training and self.config.gradient_checkpointing
        if pause:
            hf_models.set_checkpointing(self.vlm, False)
        try:
            yield
        finally:
            if pause:
                hf_models.set_checkpointing(self.vlm, True)

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor], deterministic: bool = False,
            temperature: float = 1.0,
            uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode one action token per dimension (see :meth:`harness.policies.Policy.act`; a
        chunk of one action): the most likely, or sampled at ``temperature`` by the inverse CDF at
        ``uniforms[:, d]``."""
        if not deterministic and temperature <= 0:
            raise ValueError(f"temperature={temperature} must be > 0 when sampling; "
                             "use deterministic=True")
        batch = len(obs["pixels"] if "pixels" in obs else obs["image_features"])
        shape = (batch, self.config.action_dim)
        if not deterministic:
            uniforms = torch.rand(shape) if uniforms is None else torch.as_tensor(uniforms)
            if tuple(uniforms.shape) != shape:
                raise ValueError(f"uniforms of shape {tuple(uniforms.shape)}; expected {shape}")
            uniforms = uniforms.to(self.action_ids.device)

        def choose(step_logits: torch.Tensor, dim: int) -> torch.Tensor:
            if deterministic:
                return step_logits.argmax(dim=-1)
            return sample_tokens(step_logits / temperature, uniforms[:, dim])

        tokens, _ = self._decode(obs, choose)
        return tokens, tokens_to_actions(tokens, self.config.num_bins).unsqueeze(1)  # 1 step

    def log_prob(self, obs: Mapping[str, torch.Tensor], tokens: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """Log-probabilities ``(B, action_dim)`` of ``tokens`` by teacher forcing, each under
        the softmax of its dimension's action scores divided by ``temperature``."""
        log_probs = F.log_softmax(self.logits(obs, tokens) / temperature, dim=-1)
        return log_probs.gather(-1, tokens.long().to(log_probs.device).unsqueeze(-1)).squeeze(-1)

    def log_prob_parts(self, obs: Mapping[str, torch.Tensor], tokens: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        """:meth:`log_prob` as parts ``(B, 1, 1, action_dim)``: one token per element."""
        return self.log_prob(obs, tokens, temperature).view(-1, 1, 1, self.config.action_dim)

    def exploration(self) -> dict[str, float]:
        """Nothing: the tokens explore by the sampling temperature."""
        return {}

    def bound_exploration(self, low: float | None, high: float | None,
                          fixed: float | None) -> None:
        """Raises: ValueError: the tokens have no noise scale (``algo.temperature``)."""
        raise ValueError("algo.exploration bounds the noise scale of a gaussian or flow head; "
                         "policy=hf_vla samples tokens (explore by algo.temperature)")

    def entropy(self, obs: Mapping[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
        """Entropy ``(B, action_dim)`` of each dimension given the greedy earlier tokens."""
        log_probs = F.log_softmax(self.logits(obs) / temperature, dim=-1)
        return -(log_probs.exp() * log_probs).sum(dim=-1)

    def value(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Value estimate ``(B,)`` from the prefix's last hidden state."""
        return self.value_head(self.features(obs)).squeeze(-1)

    def value_parameters(self) -> list[nn.Parameter]:
        """The value head's parameters."""
        return list(self.value_head.parameters())

    # --- behaviour cloning and fine-tuning ----------------------------------------------------

    def bc_loss(self, obs: Mapping[str, torch.Tensor], target_chunks: torch.Tensor,
                valid: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Cross-entropy of the demonstrated actions' tokens under teacher forcing (each
        dimension given the demo's earlier ones); ``generator`` is unused."""
        tokens, counted = chunk_token_targets(target_chunks, valid, self.config.num_bins)
        return token_cross_entropy(self.logits(obs, tokens), tokens, counted)

    def bc_scores(self, obs: Mapping[str, torch.Tensor], target_chunks: torch.Tensor,
                  valid: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> BCScores:
        """Held-out figures of the teacher-forced token scores."""
        tokens, counted = chunk_token_targets(target_chunks, valid, self.config.num_bins)
        return token_bc_scores(self.logits(obs, tokens), tokens, counted, self.config.num_bins)

    def fit_normalizer(self, obs: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Nothing to fit: the processor's normalisation is the model's own."""
        return {}

    def freeze_encoder(self) -> None:
        """Stop training the vision tower and projector."""
        self.image_encoder.requires_grad_(False)

    def encode_frozen(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``obs`` with ``pixels`` replaced by their image tokens (``image_features``, in chunks
        of 1,024 frames), which the prompt reads in their place."""
        if "image_features" in obs:
            return dict(obs)
        pixels, chunk = obs["pixels"], 1024
        features = torch.cat([self.encode_image(pixels[i:i + chunk])
                              for i in range(0, len(pixels), chunk)])
        return {**{k: v for k, v in obs.items() if k != "pixels"}, "image_features": features}

    # --- saving -------------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Raises: TypeError: an hf_vla policy lives in a model folder (:meth:`save_pretrained`)."""
        raise TypeError(f"policy=hf_vla saves as a transformers folder (save_pretrained), not "
                        f"as one file like {path}")

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write a folder ``policy.model`` can name, crash-safe
        (:func:`~harness.policies.hf_vla.models.save_policy_folder`)."""
        hf_models.save_policy_folder(self, folder, {"prompt": PROMPT})
        return Path(folder)

    def export_graph(self, keys: tuple[str, ...]) -> nn.Module:
        """Raises: TypeError: ONNX export covers the mlp and tiny_vla networks."""
        raise TypeError("cannot export policy=hf_vla to ONNX; export covers the mlp and "
                        "tiny_vla networks (any head)")

    def export_record(self) -> dict:
        """Raises: TypeError: ONNX export covers the mlp and tiny_vla networks."""
        return self.export_graph(())

    @staticmethod
    def migrate_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state


class AdaptersOff:
    """A LoRA policy with its adapters switched off: the frozen start policy of group
    fine-tuning (what :meth:`HFVLAPolicy.frozen_reference` returns), sharing every weight.

    Its ``state_dict`` is the policy's with the LoRA ``B`` matrices zeroed, which rebuilds the
    reference as a policy of its own (``evaluate.py reference=true``); loading one changes
    nothing, since the base weights arrive with the policy's own state.
    """

    def __init__(self, policy: HFVLAPolicy) -> None:
        self.policy = policy

    def log_prob(self, obs, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        with torch.no_grad(), self.policy.adapters_disabled():
            return self.policy.log_prob(obs, tokens, temperature)

    def log_prob_parts(self, obs, tokens: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        with torch.no_grad(), self.policy.adapters_disabled():
            return self.policy.log_prob_parts(obs, tokens, temperature)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: torch.zeros_like(v) if ".lora_B." in k else v
                for k, v in self.policy.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Nothing to load: the reference is the policy's base weights."""


def load_pretrained(folder: str | Path, device: torch.device | str = "cpu") -> HFVLAPolicy:
    """The policy :meth:`HFVLAPolicy.save_pretrained` wrote to ``folder``.

    Raises:
        ValueError: ``folder`` has no ``hf_vla.json``, or see :class:`HFVLAPolicy`.
    """
    spec = hf_folder.read_spec(folder)
    if spec is None:
        raise ValueError(f"{folder} holds no {hf_folder.SPEC_FILE}: not a saved hf_vla policy")
    from harness.policies.saving import config_from_saved

    config = config_from_saved({**spec["config"], "model": str(Path(folder))})
    shapes = {k: tuple(v) for k, v in spec["obs_shapes"].items()}
    return HFVLAPolicy(config, shapes).to(device)
