"""``policy=smolvla``: SmolVLA (:class:`~harness.policies.smolvla.model.SmolVLAModel`, LeRobot's
network
and parameter names) as a policy of the group trainer, with action chunks and a flow-matching
action expert made RL-ready by Flow-Noise.

Observations: the camera frame (``pixels``, resized to the model's image size and mapped to
[-1, 1]), the instruction's token ids (the harness's closed vocabulary; a real checkpoint's
tokenizer is not shipped, so its embedding rows for these ids are what fine-tuning adapts) and
``proprio`` as the state token (zero-padded to ``max_state_dim``).

Sampling follows SmolVLA's convention, from noise at ``t = 1`` to actions at ``t = 0`` in ``K``
Euler steps ``dt = -1 / K``, with Gaussian noise injected at every step (πRL's Flow-Noise, Chen
et al. 2025, arXiv 2510.25889)::

    x_0     ~ N(0, T^2 I)
    x_{k+1} = x_k + dt * v(x_k, t_k) + T * sigma_k * eps_k,   t_k = 1 + k * dt

so the chain ``x_0 .. x_K`` (the record, ``(K + 1) * H * max_action_dim`` floats) has the exact
log-density ``log N(x_0; 0, T^2) + sum_k log N(x_{k+1}; x_k + dt v, T^2 sigma_k^2)``, one unit
per decision. ``sigma_k`` (per step and chunk entry, in ``[SIGMA_MIN, SIGMA_MAX]``) is learned;
behaviour cloning trains the velocity by SmolVLA's own flow-matching loss. Greedy actions are
the noiseless ODE from ``x_0 = 0``. The executed actions are the first ``action_dim`` columns of
``x_K``, clipped to [-1, 1].

``dtype="bfloat16"`` puts the backbone and the expert in bfloat16
(:meth:`~harness.policies.smolvla.model.SmolVLAModel.cast_transformer`); the projections, the noise
scales, the value head, the chains, their log-densities and the losses stay float32.
``gradient_checkpointing`` recomputes their layers' activations in the backward pass.
:meth:`SmolVLAPolicy.write_lerobot_folder` writes the network back as a LeRobot checkpoint
folder (LoRA merged), the noise scales and the value head beside it in :data:`HEADS_FILE`, which
a policy built from that folder reads back.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from harness.policies.contract import PolicySpec, frozen_copy
from harness.policies.heads.base import (
    LOG_SQRT_2PI,
    BCScores,
    continuous_bc_scores,
    scale_figures,
    uniforms_to_normals,
)
from harness.policies.heads.flow import (
    chain_log_density,
    chain_log_density_parts,
    greedy_chain,
    sample_chain,
)
from harness.policies.hf_vla.models import check_dtype
from harness.policies.observations import ObsShapes
from harness.policies.smolvla import TINY, SmolVLAPolicyConfig
from harness.policies.smolvla.folder import HEADS_FILE, read_heads, write_checkpoint

if TYPE_CHECKING:
    from harness.policies.smolvla.model import SmolVLAModel

SIGMA_MIN, SIGMA_MAX, SIGMA_INIT = 0.02, 0.5, 0.1
def merge_adapters(network: nn.Module) -> None:
    """Fold every LoRA adapter of ``network`` into its layer's weight (``W + alpha / r * B A``)
    and put the plain layer back in its place, so the parameter names are LeRobot's again."""
    from peft.tuners.lora import LoraLayer

    for name, module in list(network.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge(safe_merge=True)
            parent, _, child = name.rpartition(".")
            setattr(network.get_submodule(parent), child, module.get_base_layer())


def build_model(config: SmolVLAPolicyConfig, obs_shapes: ObsShapes):
    """The :class:`~harness.policies.smolvla.model.SmolVLAModel` ``config.model`` names:
    ``tiny:smolvla`` (random weights, sized to the observations and ``chunk_size``) or a LeRobot
    checkpoint
    folder (whose ``chunk_size`` and widths must fit).

    Raises:
        ValueError: A folder whose chunk, state or action width does not fit, naming them.
    """
    from harness.policies.smolvla.architecture import tiny_config
    from harness.policies.smolvla.model import SmolVLAModel

    state_dim = obs_shapes["proprio"][0] if "proprio" in obs_shapes else 1
    if config.model == TINY:
        return SmolVLAModel(tiny_config(chunk_size=config.chunk_size, state_dim=state_dim,
                                        action_dim=config.action_dim))
    model = SmolVLAModel.from_folder(config.model)
    arch = model.config.arch
    if (arch.chunk_size, ) != (config.chunk_size, ) or arch.max_state_dim < state_dim or (
            arch.max_action_dim < config.action_dim):
        raise ValueError(
            f"policy.model={config.model!r} predicts chunks of {arch.chunk_size} actions of "
            f"width {arch.max_action_dim} from states of width {arch.max_state_dim}; this run "
            f"asks for policy.chunk_size={config.chunk_size}, {config.action_dim} action and "
            f"{state_dim} proprio dimensions")
    return model


class SmolVLAPolicy(nn.Module):
    """SmolVLA with a Flow-Noise sampler and a value head (see the module docstring), behind the
    policy contract (:class:`harness.policies.Policy`): one unit per decision, the chain.

    Args:
        config: The ``smolvla`` config.
        obs_shapes: Must hold ``pixels``; ``proprio`` and ``instruction`` are read when present.
    """

    ENTROPY_SEED = 0

    def __init__(self, config: SmolVLAPolicyConfig, obs_shapes: ObsShapes) -> None:
        super().__init__()
        self.config = config
        self.obs_shapes = {k: tuple(int(d) for d in v) for k, v in obs_shapes.items()}
        dtype = check_dtype(config.dtype, "cpu")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # the same random weights in every process that builds it
            self.smolvla = build_model(config, self.obs_shapes).cast_transformer(dtype)
            arch = self.smolvla.config.arch
            self.steps, self.entries = config.flow_steps, arch.chunk_size * arch.max_action_dim
            fraction = (SIGMA_INIT - SIGMA_MIN) / (SIGMA_MAX - SIGMA_MIN)
            self.noise_logit = nn.Parameter(torch.full((self.steps, self.entries),
                                                       math.log(fraction / (1 - fraction))))
            self.value_head = nn.Sequential(nn.Linear(self.feature_dim, config.hidden),
                                            nn.Tanh(), nn.Linear(config.hidden, 1))
            if config.model != TINY:
                heads = read_heads(config.model, config.flow_steps, config.hidden,
                                   self.smolvla.config)
                if heads is not None:
                    self.load_state_dict(heads, strict=False)
            if config.lora_rank > 0:
                self._add_adapters()
        self.smolvla.model.vlm_with_expert.set_gradient_checkpointing(
            config.gradient_checkpointing)
        self.image_size = int(self.smolvla.config.policy["resize_imgs_with_padding"][0])
        self.use_instruction = config.use_instruction and "instruction" in self.obs_shapes

    def _add_adapters(self) -> None:
        """LoRA adapters (``peft``; B = 0, so the network starts as it was; float32 whatever
        the layers' dtype) on the backbone's and the expert's ``lora_targets`` layers; every
        other weight of the network is frozen. The flow's in/out projections, the state
        projection, the noise scales and the value head stay trainable, as they are small and
        task-specific."""
        from peft import LoraConfig, inject_adapter_in_model
        from peft.tuners.tuners_utils import cast_adapter_dtype

        config = self.config
        network = self.smolvla.model.vlm_with_expert
        inject_adapter_in_model(LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha,
                                           lora_dropout=0.0,
                                           target_modules=list(config.lora_targets)), network)
        cast_adapter_dtype(network, "default")  # float32, as get_peft_model leaves them
        trainable = ("lora_", "action_in_proj", "action_out_proj", "action_time_mlp",
                     "state_proj")
        for name, parameter in self.smolvla.named_parameters():
            parameter.requires_grad_(any(key in name for key in trainable))

    @property
    def feature_dim(self) -> int:
        """Width of :meth:`features`: the backbone's."""
        return self.smolvla.config.width

    @property
    def spec(self) -> PolicySpec:
        keys = ("pixels", *(("instruction",) if self.use_instruction else ()),
                *(("proprio",) if "proprio" in self.obs_shapes else ()))
        return PolicySpec(kind=self.config.name, head="flow", chunk_size=self.config.chunk_size,
                          execute_steps=self.config.steps_per_decision,
                          action_dim=self.config.action_dim, units_per_step=0,
                          noise_width=(self.steps + 1) * self.entries,
                          feature_dim=self.feature_dim, input_keys=keys,
                          folder_format="lerobot", parts_per_element=self.steps + 1,
                          part_width=self.entries // self.config.chunk_size)

    # --- writing back -------------------------------------------------------------------------

    def heads_state(self) -> dict[str, torch.Tensor]:
        """The noise scales and the value head, which LeRobot's format has no names for."""
        return {name: tensor for name, tensor in self.state_dict().items()
                if name == "noise_logit" or name.startswith("value_head.")}

    def lerobot_network(self) -> SmolVLAModel:
        """A copy of the network as a plain SmolVLA: LoRA adapters merged into the weights
        (LeRobot's parameter names again), ``num_steps`` and ``n_action_steps`` of its
        ``config.json`` set to ``flow_steps`` and the actions played per decision, so that
        LeRobot samples as this policy acts."""
        network = copy.deepcopy(self.smolvla)
        if self.config.lora_rank > 0:
            merge_adapters(network)
        policy = {**network.config.policy, "num_steps": self.steps,
                  "n_action_steps": self.config.steps_per_decision}
        network.config = dataclasses.replace(network.config, policy=policy)
        return network.eval()

    def write_lerobot_folder(self, folder: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write the network as a LeRobot SmolVLA checkpoint folder (:meth:`lerobot_network`;
        weights in the dtype they train in), with the noise scales and the value head beside
        it in ``HEADS_FILE``, which LeRobot ignores and ``policy.model=<folder>`` reads back.
        The folder is built under a temporary name and renamed into place, with the marker of
        a folder this wrote (:mod:`harness.policies.smolvla.out_folder`): ``overwrite``
        replaces only such a folder, and refuses any other untouched.

        Raises:
            ValueError: ``folder`` is the working directory or a folder above it.
            FileExistsError: ``folder`` exists and ``overwrite`` is false, or it is not a
                folder this wrote (no marker, or files the marker does not list).
        """
        network = self.lerobot_network()
        return write_checkpoint(folder, network.config, network, overwrite=overwrite,
                                extra={HEADS_FILE: self.heads_state()}, marked=True)

    # --- inputs -------------------------------------------------------------------------------

    def model_inputs(self, obs: Mapping[str, torch.Tensor]):
        """``(images, lang_tokens, lang_masks, state)`` of :meth:`SmolVLAModel.encode`."""
        pixels = obs["pixels"]
        if pixels.dtype != torch.uint8:
            raise TypeError(f"pixels must be uint8 (B, H, W, 3), got {pixels.dtype}")
        image = pixels.permute(0, 3, 1, 2).float() / 127.5 - 1.0
        if image.shape[-1] != self.image_size or image.shape[-2] != self.image_size:
            image = F.interpolate(image, size=(self.image_size, self.image_size),
                                  mode="bilinear", align_corners=False)
        rows = pixels.shape[0]
        if self.use_instruction:
            tokens = obs["instruction"].long()
            masks = tokens != 0  # tasks.language.PAD
            masks[:, 0] = True  # an instruction of padding only still has one token
        else:
            tokens = torch.zeros((rows, 1), dtype=torch.long, device=pixels.device)
            masks = torch.ones_like(tokens, dtype=torch.bool)
        if "proprio" in obs:
            state = obs["proprio"].float()
        else:
            state = torch.zeros((rows, 1), device=pixels.device)
        return [image], tokens, masks, state

    def encode(self, obs: Mapping[str, torch.Tensor]):
        return self.smolvla.encode(*self.model_inputs(obs))

    def features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Mean of the prefix's input embeddings over its real tokens, ``(B, width)``: what
        the value head reads."""
        images, tokens, masks, state = self.model_inputs(obs)
        ones = [torch.ones(images[0].shape[0], dtype=torch.bool, device=state.device)]
        embeddings, pads, _ = self.smolvla.embed_prefix(images, ones, tokens, masks, state)
        weights = pads.float().unsqueeze(-1)
        return (embeddings.float() * weights).sum(1) / weights.sum(1).clamp(min=1.0)

    # --- the chain ----------------------------------------------------------------------------

    def sigma(self) -> torch.Tensor:
        """Noise scales ``(K, H * max_action_dim)`` at temperature 1."""
        return SIGMA_MIN + (SIGMA_MAX - SIGMA_MIN) * torch.sigmoid(self.noise_logit)

    def _velocity(self, cache, pads, x: torch.Tensor, k: int) -> torch.Tensor:
        arch = self.smolvla.config.arch
        time = torch.full((x.shape[0],), 1.0 - k / self.steps, device=x.device)
        chunk = x.view(-1, arch.chunk_size, arch.max_action_dim)
        return self.smolvla.velocity(cache, pads, chunk, time).flatten(1)

    def _actions(self, x: torch.Tensor) -> torch.Tensor:
        arch = self.smolvla.config.arch
        chunk = x.view(-1, arch.chunk_size, arch.max_action_dim)
        return chunk[:, :, :self.config.action_dim].clamp(-1.0, 1.0)

    def _drift(self, cache, pads):
        """SmolVLA's drift: it integrates from ``t = 1`` down to ``t = 0``, so ``-v``."""
        return lambda x, k: -self._velocity(cache, pads, x, k)

    @torch.no_grad()
    def act(self, obs, deterministic: bool = False, temperature: float = 1.0,
            uniforms: torch.Tensor | None = None):
        """A decision: the chain record ``(B, (K + 1) * H * max_action_dim)`` (zeros for greedy
        actions) and the chunk ``(B, H, action_dim)``; ``uniforms`` ``(B, noise_width)`` become
        the chain's standard normals (:func:`~harness.policies.heads.base.uniforms_to_normals`)."""
        cache, pads = self.encode(obs)
        rows = pads.shape[0]
        drift = self._drift(cache, pads)
        noise_width = (self.steps + 1) * self.entries
        if deterministic:
            start = torch.zeros((rows, self.entries), device=pads.device)
            x = greedy_chain(drift, start, self.steps)
            return x.new_zeros((rows, noise_width)), self._actions(x)
        if temperature <= 0:
            raise ValueError(
                f"temperature={temperature} must be > 0 when sampling; use deterministic=True")
        if uniforms is None:
            normals = torch.randn((rows, noise_width), device=pads.device)
        else:
            normals = uniforms_to_normals(uniforms)
        draws = normals.to(pads.device).view(rows, self.steps + 1, self.entries)
        sigma = self.sigma()
        record = sample_chain(drift, lambda x, k: sigma[k], draws, temperature)
        return record, self._actions(record[:, -self.entries:])

    def log_prob(self, obs, records: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """``(B, 1)``: the chain's log-density at ``temperature`` (one unit per decision)."""
        return chain_log_density(*self._chain_terms(obs, records, temperature)).unsqueeze(-1)

    def log_prob_parts(self, obs, records: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        """The chain's terms ``(B, K + 1, H, W)`` per chunk entry and (padded) action column."""
        parts = chain_log_density_parts(*self._chain_terms(obs, records, temperature))
        return parts.view(len(parts), self.steps + 1, self.config.chunk_size, -1)

    def _chain_terms(self, obs, records: torch.Tensor, temperature: float):
        cache, pads = self.encode(obs)
        chain = records.float().view(-1, self.steps + 1, self.entries)
        drift = self._drift(cache, pads)
        means = torch.stack([chain[:, k] + drift(chain[:, k], k) / self.steps
                             for k in range(self.steps)], dim=1)
        return chain, means, temperature * self.sigma(), temperature

    def exploration(self) -> dict[str, float]:
        """The chain's noise scales at temperature 1."""
        return scale_figures(self.sigma())

    def bound_exploration(self, low: float | None, high: float | None,
                          fixed: float | None) -> None:
        """Raises: ValueError: SmolVLA's noise scales keep their own bounds."""
        raise ValueError(f"algo.exploration is not available for policy=smolvla: its noise "
                         f"scales stay in [{SIGMA_MIN}, {SIGMA_MAX}]")

    def entropy(self, obs, temperature: float = 1.0) -> torch.Tensor:
        """Exact entropy of the chain, ``(B, 1)``: ``sigma`` does not depend on the state."""
        per_entry = 0.5 + LOG_SQRT_2PI + math.log(temperature)
        value = per_entry * self.entries * (self.steps + 1) + self.sigma().log().sum()
        rows = len(next(iter(obs.values())))
        return value.expand(rows, 1)

    def value(self, obs) -> torch.Tensor:
        """Value estimate ``(B,)`` from the prefix's mean embedding."""
        return self.value_head(self.features(obs)).squeeze(-1)

    def value_parameters(self) -> list[nn.Parameter]:
        """The value head's parameters."""
        return list(self.value_head.parameters())

    def bc_loss(self, obs, target_chunks: torch.Tensor, valid: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """SmolVLA's flow-matching loss on the demonstrated chunks ``(B, H, action_dim)``, over
        the real action columns of the steps ``valid`` ``(B, H)`` marks."""
        images, tokens, masks, state = self.model_inputs(obs)
        losses = self.smolvla.flow_loss(images, tokens, masks, state, target_chunks.float(),
                                        generator=generator, reduction="none")
        losses = losses[:, :, :self.config.action_dim]
        weights = (torch.ones(losses.shape[:2], device=losses.device) if valid is None
                   else valid.to(losses.device, losses.dtype))
        return (losses * weights.unsqueeze(-1)).sum() / (
            weights.sum().clamp(min=1.0) * self.config.action_dim)

    def bc_scores(self, obs, target_chunks: torch.Tensor, valid: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> BCScores:
        """Held-out figures: the flow loss over the slots that count and the greedy chunk's
        error."""
        steps = (torch.ones(target_chunks.shape[:2], dtype=torch.bool,
                            device=target_chunks.device) if valid is None else valid)
        loss = self.bc_loss(obs, target_chunks, steps, generator)
        _, greedy = self.act(obs, deterministic=True)
        return continuous_bc_scores(loss, greedy, target_chunks, steps)

    def fit_normalizer(self, obs) -> dict[str, float]:
        """Nothing to fit."""
        return {}

    def frozen_reference(self) -> SmolVLAPolicy:
        """The policy as it is now, frozen (a deep copy in eval mode): the KL reference."""
        return frozen_copy(self)

    def freeze_encoder(self) -> None:
        """Raises: ValueError: SmolVLA's vision encoder is part of its backbone (LoRA adapts it)."""
        raise ValueError("algo.freeze_encoder=true needs a policy with an image encoder of its "
                         "own (policy=tiny_vla or hf_vla); policy='smolvla' has none (use "
                         "policy.lora_rank to train adapters only)")

    def encode_frozen(self, obs) -> dict[str, torch.Tensor]:
        """``obs`` unchanged: nothing is frozen."""
        return dict(obs)

    # --- saving and export --------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the policy to ``path`` (:func:`harness.policies.saving.save_policy`)."""
        from harness.policies.saving import save_policy

        save_policy(path, self)

    def save_pretrained(self, folder: str | os.PathLike, overwrite: bool = False) -> Path:
        """The LeRobot checkpoint folder (:meth:`write_lerobot_folder`)."""
        return self.write_lerobot_folder(folder, overwrite=overwrite)

    def export_graph(self, keys: tuple[str, ...]) -> nn.Module:
        """Raises: TypeError: ONNX export covers the mlp and tiny_vla networks; SmolVLA exports
        as a LeRobot folder (``format=lerobot``)."""
        raise TypeError("cannot export policy=smolvla to ONNX; export it as a LeRobot "
                        "checkpoint folder (format=lerobot), or export an mlp or tiny_vla "
                        "policy")

    def export_record(self) -> dict:
        """Raises: TypeError, as :meth:`export_graph`."""
        return self.export_graph(())

    @staticmethod
    def migrate_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state
