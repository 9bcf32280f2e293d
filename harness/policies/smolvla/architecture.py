"""What a SmolVLA network is made of: LeRobot's policy config plus the SmolVLM backbone's config.

A LeRobot SmolVLA checkpoint folder holds ``config.json`` (the policy config, ``"type":
"smolvla"``) and ``model.safetensors``. The policy config names the backbone by
``vlm_model_name`` (a hub id such as ``HuggingFaceTB/SmolVLM2-500M-Video-Instruct``, or a local
folder) and LeRobot reads the backbone's *architecture* from there at load time; the weights all
come from ``model.safetensors``. Nothing here downloads, so the backbone's ``config.json`` must be
local: :func:`resolve_vlm_config` looks for it, in order, in the ``vlm_config`` argument, in the
checkpoint's own ``vlm_config.json`` (which :meth:`SmolVLAModel.save_folder` writes and LeRobot
ignores), and in ``vlm_model_name`` when that is a local folder.

:class:`Architecture` holds the policy fields that shape the network or its sampling, with
LeRobot's ``SmolVLAConfig`` defaults; every other field of ``config.json`` is kept as it was and
written back unchanged. :func:`tiny_config` builds a small random SmolVLA offline, the way
:mod:`harness.policies.hf_vla.tiny` builds its tiny Idefics3.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POLICY_TYPE = "smolvla"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
VLM_CONFIG_FILE = "vlm_config.json"  # the backbone's transformers config, beside a saved policy
VLM_MODEL_TYPES = ("smolvlm", "idefics3")  # LeRobot builds SmolVLMForConditionalGeneration
ATTENTION_MODES = ("cross_attn", "self_attn")
# How the vision tower maps a patch to its position-table row (see SmolVLAConfig.patch_positions).
PATCH_POSITIONS = ("exact", "shifted")


class CheckpointError(ValueError):
    """A folder or config that is not a SmolVLA checkpoint this module can load."""


@dataclass(frozen=True)
class Architecture:
    """The fields of LeRobot's ``SmolVLAConfig`` that shape the network or its sampling.

    Defaults are LeRobot's. ``num_vlm_layers <= 0`` keeps every backbone layer;
    ``num_expert_layers <= 0`` gives the expert as many layers as the (truncated) backbone;
    ``self_attn_every_n_layers <= 0`` makes every layer a cross-attention layer in
    ``cross_attn`` mode; ``prefix_length <= 0`` leaves the prefix unpadded.
    """

    chunk_size: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_steps: int = 10
    vlm_model_name: str = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
    add_image_special_tokens: bool = False
    attention_mode: str = "cross_attn"
    prefix_length: int = -1
    num_expert_layers: int = -1
    num_vlm_layers: int = 16
    self_attn_every_n_layers: int = 2
    expert_width_multiplier: float = 0.75
    min_period: float = 4e-3
    max_period: float = 4.0

    @classmethod
    def from_policy(cls, policy: dict[str, Any], source: str) -> Architecture:
        """The architecture fields of a policy config, checked.

        Raises:
            CheckpointError: Naming ``source``, the field, its value and what was expected.
        """
        values = {}
        for spec in dataclasses.fields(cls):
            value = policy.get(spec.name, spec.default)
            kind = {"int": int, "str": str, "bool": bool, "float": (int, float)}[spec.type]
            if not isinstance(value, kind) or (spec.type != "bool" and isinstance(value, bool)):
                raise CheckpointError(f"{source}: {spec.name}={value!r} is not of type {spec.type}")
            values[spec.name] = float(value) if spec.type == "float" else value
        arch = cls(**values)
        problems = [
            f"{name}={getattr(arch, name)} must be >= 1"
            for name in ("chunk_size", "max_state_dim", "max_action_dim", "num_steps")
            if getattr(arch, name) < 1]
        if arch.attention_mode not in ATTENTION_MODES:
            problems.append(f"attention_mode={arch.attention_mode!r} is not one of "
                            f"{ATTENTION_MODES}")
        if arch.add_image_special_tokens:
            problems.append("add_image_special_tokens=true is not supported (it needs the "
                            "backbone tokenizer's image token ids)")
        if not 0 < arch.min_period < arch.max_period:
            problems.append(f"need 0 < min_period ({arch.min_period}) < max_period "
                            f"({arch.max_period})")
        if arch.expert_width_multiplier <= 0:
            problems.append(f"expert_width_multiplier={arch.expert_width_multiplier} must be > 0")
        if problems:
            raise CheckpointError(f"{source}: " + "; ".join(problems))
        return arch


@dataclass(frozen=True)
class SmolVLAConfig:
    """A SmolVLA network: LeRobot's policy config and the backbone's transformers config.

    Attributes:
        policy: ``config.json`` of a LeRobot checkpoint, every field kept (``"type": "smolvla"``).
        vlm: The backbone's config as ``SmolVLMConfig.to_dict()`` gives it (``model_type``
            ``smolvlm`` or ``idefics3``, with ``text_config`` and ``vision_config``).
        patch_positions: Which position-table row the vision tower gives patch ``h`` of ``n``
            along a side of a table of ``s`` rows: the bucket of ``h / n`` among the boundaries
            ``k / s``. ``"exact"`` is ``transformers`` 5's rule (LeRobot 0.6, transformers
            5.4-5.5): ``h`` when ``n = s``. ``"shifted"`` is transformers 4.57's (LeRobot 0.4.4),
            which scales ``h / n`` by ``1 - 1e-6`` first and so puts every patch that lies on a
            boundary one row down (``0, 0, 1, ..., s - 2`` when ``n = s``). The checkpoint does
            not record which one its weights were trained with.
        arch: The checked architecture fields of ``policy``.
    """

    policy: dict[str, Any]
    vlm: dict[str, Any]
    patch_positions: str = "exact"
    arch: Architecture = field(init=False)

    def __post_init__(self) -> None:
        if self.patch_positions not in PATCH_POSITIONS:
            raise CheckpointError(f"patch_positions={self.patch_positions!r}; expected one of "
                                  f"{PATCH_POSITIONS}")
        if self.policy.get("type") != POLICY_TYPE:
            raise CheckpointError(f"policy config has type={self.policy.get('type')!r}; "
                                  f"expected {POLICY_TYPE!r}")
        object.__setattr__(self, "arch", Architecture.from_policy(self.policy, "policy config"))
        check_vlm_config(self.vlm, "backbone config")
        layers = self.layer_counts()
        expert_vlm_mismatch = [i for i in range(0, layers[0], layers[0] // layers[1])
                               if self.self_attention_at(i)
                               != self.self_attention_at(i // (layers[0] // layers[1]))]
        if expert_vlm_mismatch:
            raise CheckpointError(
                f"num_vlm_layers={layers[0]}, num_expert_layers={layers[1]}, "
                f"self_attn_every_n_layers={self.arch.self_attn_every_n_layers}: backbone layers "
                f"{expert_vlm_mismatch} would run an expert layer built for the other attention "
                "kind (LeRobot cannot run this config either)")

    def layer_counts(self) -> tuple[int, int]:
        """``(backbone layers kept, expert layers)``.

        Raises:
            CheckpointError: The expert's layer count does not divide the backbone's.
        """
        available = self.vlm["text_config"]["num_hidden_layers"]
        vlm = self.arch.num_vlm_layers
        vlm = min(vlm, available) if vlm > 0 else available
        expert = self.arch.num_expert_layers if self.arch.num_expert_layers > 0 else vlm
        if vlm % expert:
            raise CheckpointError(f"num_expert_layers={expert} does not divide the backbone's "
                                  f"{vlm} layers")
        return vlm, expert

    def self_attention_at(self, layer: int) -> bool:
        """Whether layer ``layer`` is a joint self-attention layer (else the expert
        cross-attends to the backbone's keys and values of that layer)."""
        every = self.arch.self_attn_every_n_layers
        return self.arch.attention_mode != "cross_attn" or (every > 0 and layer % every == 0)


def check_vlm_config(vlm: dict[str, Any], source: str) -> None:
    """Refuse a backbone config that is not a SmolVLM/Idefics3 one or that names code.

    Raises:
        CheckpointError: Naming ``source`` and the field.
    """
    if vlm.get("model_type") not in VLM_MODEL_TYPES:
        raise CheckpointError(f"{source}: model_type={vlm.get('model_type')!r}; expected one of "
                              f"{VLM_MODEL_TYPES}")
    if vlm.get("auto_map"):
        raise CheckpointError(f"{source} names custom code (auto_map={vlm['auto_map']!r}); "
                              "code from a model folder is never run")
    for part in ("text_config", "vision_config"):
        if not isinstance(vlm.get(part), dict):
            raise CheckpointError(f"{source}: {part} is missing or not an object")
    if vlm["text_config"].get("model_type", "llama") != "llama":
        raise CheckpointError(f"{source}: text_config.model_type="
                              f"{vlm['text_config'].get('model_type')!r}; expected 'llama'")


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path``.

    Raises:
        CheckpointError: Naming ``what`` and ``path``: missing, unreadable or not an object.
    """
    if not path.is_file():
        raise CheckpointError(f"{what}: {path} does not exist")
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise CheckpointError(f"{what}: {path} is not readable JSON: {error}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{what}: {path} holds a {type(value).__name__}; expected an "
                              "object")
    return value


def resolve_vlm_config(folder: Path, policy: dict[str, Any],
                       vlm_config: dict[str, Any] | str | os.PathLike | None) -> dict[str, Any]:
    """The backbone's config for the checkpoint in ``folder``, found without a network.

    Args:
        folder: The checkpoint folder.
        policy: Its ``config.json``.
        vlm_config: A config dict, or a folder holding the backbone's ``config.json`` (or that
            file), or ``None`` to look in ``folder/vlm_config.json`` and then in
            ``vlm_model_name`` when it is a local folder.

    Raises:
        CheckpointError: None of those holds a config, naming where it looked.
    """
    if isinstance(vlm_config, dict):
        return vlm_config
    if vlm_config is not None:
        path = Path(vlm_config)
        return read_json(path / CONFIG_FILE if path.is_dir() else path, "vlm_config")
    if (folder / VLM_CONFIG_FILE).is_file():
        return read_json(folder / VLM_CONFIG_FILE, f"SmolVLA checkpoint {folder}")
    name = str(policy.get("vlm_model_name", Architecture.vlm_model_name))
    if (Path(name) / CONFIG_FILE).is_file():
        return read_json(Path(name) / CONFIG_FILE, f"vlm_model_name of {folder}")
    raise CheckpointError(
        f"SmolVLA checkpoint {folder}: its backbone vlm_model_name={name!r} is not a local folder "
        f"holding {CONFIG_FILE} and {folder / VLM_CONFIG_FILE} does not exist; nothing is "
        "downloaded, so pass vlm_config=<a folder holding the backbone's config.json>")


def build_vlm(config: SmolVLAConfig):
    """A randomly initialised ``SmolVLMForConditionalGeneration`` for ``config``, its text
    model cut to the kept layers (LeRobot keeps the first ``num_vlm_layers``)."""
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    vlm = dict(config.vlm)
    vlm["text_config"] = {**vlm["text_config"], "num_hidden_layers": config.layer_counts()[0]}
    vlm["model_type"] = "smolvlm"
    vlm.pop("auto_map", None)
    return SmolVLMForConditionalGeneration(SmolVLMConfig.from_dict(vlm))


def expert_intermediate_size(width: int, multiplier: int = 4, multiple_of: int = 256) -> int:
    """The expert MLP's width for expert width ``width``: the LLaMA rule, 2/3 of
    ``multiplier * width`` rounded up to a multiple of ``multiple_of`` (LeRobot's sizing)."""
    size = multiplier * int(2 * width / 3)
    return multiple_of * -(-size // multiple_of)


def tiny_config(chunk_size: int = 8, state_dim: int = 6, action_dim: int = 4,
                image_size: int = 32) -> SmolVLAConfig:
    """A small SmolVLA config: a 4-layer SmolVLM (width 64, 4 heads over 2 key/value heads,
    a 1-layer vision tower of width 32 on ``image_size`` images in 8-pixel patches, 2 x 2 pixel
    shuffle), and an expert of width 48 that cross-attends on odd layers.

    ``config.json`` gets one ``observation.images.front`` camera, ``observation.state`` and
    ``action`` features so that LeRobot's ``SmolVLAPolicy`` can load a saved folder.
    """
    text = {"model_type": "llama", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
            "tie_word_embeddings": False}
    vision = {"model_type": "smolvlm_vision", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": image_size,
              "patch_size": 8}
    vlm = {"model_type": "smolvlm", "text_config": text, "vision_config": vision,
           "scale_factor": 2, "image_token_id": 3, "tie_word_embeddings": False}
    features = {"observation.images.front": {"type": "VISUAL", "shape": [3, image_size,
                                                                          image_size]},
                "observation.state": {"type": "STATE", "shape": [state_dim]}}
    policy = {"type": POLICY_TYPE, "n_obs_steps": 1, "input_features": features,
              "output_features": {"action": {"type": "ACTION", "shape": [action_dim]}},
              "device": "cpu", "chunk_size": chunk_size, "n_action_steps": chunk_size,
              "max_state_dim": state_dim, "max_action_dim": action_dim, "num_steps": 10,
              "resize_imgs_with_padding": [image_size, image_size], "tokenizer_max_length": 16,
              "vlm_model_name": "tiny-smolvlm", "load_vlm_weights": False,
              "attention_mode": "cross_attn", "num_vlm_layers": 4, "num_expert_layers": -1,
              "self_attn_every_n_layers": 2, "expert_width_multiplier": 0.75}
    return SmolVLAConfig(policy=policy, vlm=vlm)
