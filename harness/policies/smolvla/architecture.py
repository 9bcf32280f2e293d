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

A folder is untrusted input, so nothing in its configs may size the network unchecked: JSON files
are refused above :data:`MAX_JSON_BYTES` before they are parsed, and every field that shapes a
tensor or divides another is typed and bounded here (the ``*_LIMITS`` tables), with transformers'
own defaults for the backbone fields a config leaves out (:func:`check_vlm_config`).
"""

from __future__ import annotations

import dataclasses
import json
import math
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

MAX_JSON_BYTES = 1_000_000  # a real config.json is a few kB
MAX_LAYERS = 256  # of the backbone, its vision tower or the expert
MAX_WIDTH = 65_536  # a hidden, MLP or head width
MAX_HEADS = 1_024
MAX_VOCAB = 1 << 20
MAX_IMAGE = 4_096  # pixels along a side
MAX_TOKENS = 1 << 20  # prefix_length, max_position_embeddings
MAX_PARAMETERS = 4_000_000_000  # default limit of a folder's network (16 GB in float32)

# (lowest, highest) of the numbers of config.json and of the backbone config; None: no lower
# bound (LeRobot reads <= 0 as "off"). A float limit also refuses NaN and infinities.
POLICY_LIMITS: dict[str, tuple[int | float | None, int | float]] = {
    "chunk_size": (1, 1_024), "max_state_dim": (1, 4_096), "max_action_dim": (1, 4_096),
    "num_steps": (1, 1_000), "prefix_length": (None, MAX_TOKENS),
    "num_expert_layers": (None, MAX_LAYERS), "num_vlm_layers": (None, MAX_LAYERS),
    "self_attn_every_n_layers": (None, MAX_LAYERS), "expert_width_multiplier": (1e-3, 16.0),
    "min_period": (1e-9, 1e6), "max_period": (1e-9, 1e6)}
TEXT_LIMITS: dict[str, tuple[int | float, int | float]] = {
    "vocab_size": (1, MAX_VOCAB), "hidden_size": (1, MAX_WIDTH),
    "intermediate_size": (1, MAX_WIDTH), "num_hidden_layers": (1, MAX_LAYERS),
    "num_attention_heads": (1, MAX_HEADS), "num_key_value_heads": (1, MAX_HEADS),
    "head_dim": (2, MAX_WIDTH), "max_position_embeddings": (1, MAX_TOKENS),
    "rms_norm_eps": (1e-12, 1.0), "attention_dropout": (0.0, 0.999)}
VISION_LIMITS: dict[str, tuple[int | float, int | float]] = {
    "hidden_size": (1, MAX_WIDTH), "intermediate_size": (1, MAX_WIDTH),
    "num_hidden_layers": (1, MAX_LAYERS), "num_attention_heads": (1, MAX_HEADS),
    "num_channels": (3, 3), "image_size": (1, MAX_IMAGE), "patch_size": (1, MAX_IMAGE),
    "layer_norm_eps": (1e-12, 1.0), "attention_dropout": (0.0, 0.999)}
TOP_LIMITS: dict[str, tuple[int | float, int | float]] = {"scale_factor": (1, 64)}
NULLABLE = ("num_key_value_heads", "head_dim")  # LlamaConfig derives them when null
FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias")


class CheckpointError(ValueError):
    """A folder or config that is not a SmolVLA checkpoint this module can load."""


def bound_problem(key: str, value: Any, limits: tuple[int | float | None, int | float]
                  ) -> str | None:
    """What is wrong with ``value`` for ``limits`` (see :data:`POLICY_LIMITS`), or ``None``.

    An int limit asks for an int in ``[lowest, highest]``, a float limit for a finite number in
    ``[lowest, highest]``.
    """
    low, high = limits
    if isinstance(high, int):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{key}={value!r} is not of type int"
        if (low is not None and value < low) or value > high:
            return f"{key}={value} must be " + (f">= {low} and " if low is not None else "") \
                + f"<= {high}"
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key}={value!r} is not a number"
    if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
        return f"{key}={value} must be finite and in [{low}, {high}]"
    return None


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
            values[spec.name] = value
        problems = [problem for name, limits in POLICY_LIMITS.items()
                    if (problem := bound_problem(name, values[name], limits))]
        if problems:
            raise CheckpointError(f"{source}: " + "; ".join(problems))
        values.update({spec.name: float(values[spec.name]) for spec in dataclasses.fields(cls)
                       if spec.type == "float"})
        arch = cls(**values)
        if arch.attention_mode not in ATTENTION_MODES:
            problems.append(f"attention_mode={arch.attention_mode!r} is not one of "
                            f"{ATTENTION_MODES}")
        if arch.add_image_special_tokens:
            problems.append("add_image_special_tokens=true is not supported (it needs the "
                            "backbone tokenizer's image token ids)")
        if not arch.min_period < arch.max_period:
            problems.append(f"need 0 < min_period ({arch.min_period}) < max_period "
                            f"({arch.max_period})")
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
        backbone: ``vlm`` checked, with transformers' defaults for the fields it leaves out
            (:func:`check_vlm_config`).
    """

    policy: dict[str, Any]
    vlm: dict[str, Any]
    patch_positions: str = "exact"
    arch: Architecture = field(init=False)
    backbone: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.patch_positions not in PATCH_POSITIONS:
            raise CheckpointError(f"patch_positions={self.patch_positions!r}; expected one of "
                                  f"{PATCH_POSITIONS}")
        if self.policy.get("type") != POLICY_TYPE:
            raise CheckpointError(f"policy config has type={self.policy.get('type')!r}; "
                                  f"expected {POLICY_TYPE!r}")
        object.__setattr__(self, "arch", Architecture.from_policy(self.policy, "policy config"))
        object.__setattr__(self, "backbone", check_vlm_config(self.vlm, "backbone config"))
        self._check_image_size()
        self._check_expert_width()
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

    @property
    def width(self) -> int:
        """The backbone's hidden width."""
        return self.backbone["text_config"]["hidden_size"]

    @property
    def expert_width(self) -> int:
        """The expert's hidden width: the backbone's times ``expert_width_multiplier``."""
        return int(self.width * self.arch.expert_width_multiplier)

    def layer_counts(self) -> tuple[int, int]:
        """``(backbone layers kept, expert layers)``.

        Raises:
            CheckpointError: The expert's layer count does not divide the backbone's.
        """
        available = self.backbone["text_config"]["num_hidden_layers"]
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

    def _check_image_size(self) -> None:
        """Refuse an image size the vision tower's patches and the pixel shuffle cannot cut:
        the policy resizes frames to ``resize_imgs_with_padding[0]`` pixels a side."""
        size = self.policy.get("resize_imgs_with_padding")
        if not (isinstance(size, list) and len(size) == 2
                and not any(bound_problem("", side, (1, MAX_IMAGE)) for side in size)):
            raise CheckpointError(f"resize_imgs_with_padding={size!r}; need [height, width], "
                                  f"ints in [1, {MAX_IMAGE}] (the image size LeRobot resizes "
                                  "frames to)")
        patch = self.backbone["vision_config"]["patch_size"]
        scale = self.backbone["scale_factor"]
        side = size[0] // patch
        if side < 1 or side % scale:
            raise CheckpointError(f"resize_imgs_with_padding={size} cuts {side} patches of "
                                  f"vision_config.patch_size={patch} a side, which is not a "
                                  f"positive multiple of scale_factor={scale} (the pixel "
                                  "shuffle's)")

    def _check_expert_width(self) -> None:
        """Refuse an expert width the flow-time embedding cannot fill (it needs an even one)."""
        width = self.expert_width
        if width < 2 or width % 2:
            raise CheckpointError(f"expert_width_multiplier={self.arch.expert_width_multiplier} "
                                  f"of text_config.hidden_size={self.width} gives an expert of "
                                  f"width {width}; it must be even and >= 2")


def check_vlm_config(vlm: dict[str, Any], source: str) -> dict[str, Any]:
    """The backbone config checked: a SmolVLM/Idefics3 one that names no code, whose sizes are
    typed and bounded (:data:`TEXT_LIMITS`, :data:`VISION_LIMITS`, :data:`TOP_LIMITS`) and
    divide where the network divides them. Fields it leaves out take transformers' defaults,
    which are checked too.

    Returns:
        ``SmolVLMConfig.to_dict()`` of it: every field, defaults filled in.

    Raises:
        CheckpointError: Naming ``source`` and the fields.
    """
    from transformers import SmolVLMConfig

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
    _check_fields(vlm, source, given_only=True)
    try:
        resolved = SmolVLMConfig.from_dict({**vlm, "model_type": "smolvlm"}).to_dict()
    except Exception as error:  # transformers' strict configs raise their own error types
        raise CheckpointError(f"{source}: transformers refuses it: {type(error).__name__}: "
                              f"{error}") from None
    _check_fields(resolved, source, given_only=False)
    text, vision = resolved["text_config"], resolved["vision_config"]
    problems = [
        f"{part}.hidden_size={values['hidden_size']} is not a multiple of {part}."
        f"num_attention_heads={values['num_attention_heads']}"
        for part, values in (("text_config", text), ("vision_config", vision))
        if values["hidden_size"] % values["num_attention_heads"]]
    if text["num_attention_heads"] % text["num_key_value_heads"]:
        problems.append(f"text_config.num_attention_heads={text['num_attention_heads']} is not "
                        f"a multiple of num_key_value_heads={text['num_key_value_heads']}")
    if text["head_dim"] % 2:
        problems.append(f"text_config.head_dim={text['head_dim']} must be even (rotary pairs)")
    if vision["patch_size"] > vision["image_size"]:
        problems.append(f"vision_config.patch_size={vision['patch_size']} exceeds image_size="
                        f"{vision['image_size']}")
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))
    return resolved


def _check_fields(vlm: dict[str, Any], source: str, given_only: bool) -> None:
    """Refuse the backbone config's numbers, flags and activations out of type or bounds,
    naming every one; with ``given_only``, only the fields ``vlm`` holds."""
    from transformers.activations import ACT2FN

    problems = []
    for prefix, values, limits in (("", vlm, TOP_LIMITS),
                                   ("text_config.", vlm["text_config"], TEXT_LIMITS),
                                   ("vision_config.", vlm["vision_config"], VISION_LIMITS)):
        for name, limit in limits.items():
            if name in values or not given_only:
                value = values.get(name)
                if not (value is None and given_only and name in NULLABLE):
                    problems.append(bound_problem(prefix + name, value, limit))
        for name in FLAGS:
            if name in values and not isinstance(values[name], bool):
                problems.append(f"{prefix}{name}={values[name]!r} is not of type bool")
        act = values.get("hidden_act")
        if prefix and act is not None and not (isinstance(act, str) and act in ACT2FN):
            problems.append(f"{prefix}hidden_act={act!r} is not an activation transformers has")
    text = vlm["text_config"]
    pad, vocab = text.get("pad_token_id"), text.get("vocab_size")
    if pad is not None and isinstance(vocab, int) and not (
            isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < vocab):
        problems.append(f"text_config.pad_token_id={pad!r} is not a token id below "
                        f"vocab_size={vocab}")
    problems = [problem for problem in problems if problem]
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path``, refused unread above :data:`MAX_JSON_BYTES`.

    Raises:
        CheckpointError: Naming ``what`` and ``path``: missing, too large, unreadable or not an
            object.
    """
    if not path.is_file():
        raise CheckpointError(f"{what}: {path} does not exist")
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise CheckpointError(f"{what}: {path} is {size} bytes; a config is at most "
                              f"{MAX_JSON_BYTES} (MAX_JSON_BYTES), so it is not read")
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise CheckpointError(f"{what}: {path} is not readable JSON: {error}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{what}: {path} holds a {type(value).__name__}; expected an "
                              "object")
    return value


def resolve_vlm_config(folder: Path, policy: dict[str, Any],
                       vlm_config: dict[str, Any] | str | os.PathLike | None
                       ) -> tuple[dict[str, Any], str]:
    """The backbone's config for the checkpoint in ``folder``, found without a network.

    Args:
        folder: The checkpoint folder.
        policy: Its ``config.json``.
        vlm_config: A config dict, or a folder holding the backbone's ``config.json`` (or that
            file), or ``None`` to look in ``folder/vlm_config.json`` and then in
            ``vlm_model_name`` when it is a local folder.

    Returns:
        ``(config, where it came from)``: the file read, or ``"the vlm_config argument"``.

    Raises:
        CheckpointError: None of those holds a config, naming where it looked.
    """
    if isinstance(vlm_config, dict):
        return vlm_config, "the vlm_config argument"
    if vlm_config is not None:
        path = Path(vlm_config)
        path = path / CONFIG_FILE if path.is_dir() else path
        return read_json(path, "vlm_config"), str(path)
    if (folder / VLM_CONFIG_FILE).is_file():
        return (read_json(folder / VLM_CONFIG_FILE, f"SmolVLA checkpoint {folder}"),
                str(folder / VLM_CONFIG_FILE))
    name = str(policy.get("vlm_model_name", Architecture.vlm_model_name))
    if (Path(name) / CONFIG_FILE).is_file():
        return (read_json(Path(name) / CONFIG_FILE, f"vlm_model_name of {folder}"),
                str(Path(name) / CONFIG_FILE))
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
