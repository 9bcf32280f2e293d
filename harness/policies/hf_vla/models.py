"""Where ``policy=hf_vla`` gets its model: a named offline build or a local folder, checked early.

``policy.model`` is one of :data:`harness.policies.hf_vla.tiny.NAMES` or a local directory holding
a saved ``transformers`` model *and* its processor (``save_pretrained`` of both, as a downloaded
checkpoint has them). Nothing is ever fetched from a model hub: folders are read with
``local_files_only=True``, and never run code: ``trust_remote_code=False`` on every call, weights
from safetensors only, and the whole folder checked first (:mod:`harness.policies.hf_vla.folder`).

Action tokens follow OpenVLA: bin ``k`` of ``K`` is the ``k``-th of the ``K`` highest ids of the
vocabulary that the tokenizer does not reserve (special or added tokens: the image placeholders,
PaliGemma's location tokens...), so they never collide with what the prompt is built from.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.policies.hf_vla import tiny as hf_tiny
from harness.policies.hf_vla.folder import ADAPTER_DIR, HEADS_FILE, SPEC_FILE, check_folder
from harness_common.files import atomic_dir

INSTALL_HINT = "pip install -e .[vla]"
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PROCESSOR_FILES: tuple[str, ...] = ("processor_config.json", "preprocessor_config.json")
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
# Every transformers call on a folder: nothing from a hub, no code from the folder.
LOCAL_ONLY: dict[str, bool] = {"local_files_only": True, "trust_remote_code": False}


@dataclass(frozen=True)
class Architecture:
    """How one ``model_type`` is driven.

    Attributes:
        image_dims: 4 for ``(B, 3, S, S)`` pixel values, 5 for ``(B, images, 3, S, S)``.
        prefix_lm: The prompt attends to itself both ways (PaliGemma's ``token_type_ids``).
        position_offset: First position id (PaliGemma counts from 1).
        encoder: Attributes of the inner model that turn pixels into image tokens.
    """

    image_dims: int
    prefix_lm: bool
    position_offset: int
    encoder: tuple[str, ...]


ARCHITECTURES: dict[str, Architecture] = {
    "paligemma": Architecture(4, True, 1, ("vision_tower", "multi_modal_projector")),
    "idefics3": Architecture(5, False, 0, ("vision_model", "connector")),  # SmolVLM (v1) too
}


def require_transformers() -> None:
    """Raise a clear ``ImportError`` when the ``vla`` extra is not installed."""
    try:
        import peft  # noqa: F401
        import safetensors  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as error:
        raise ImportError(f"policy=hf_vla needs transformers, peft, safetensors and tokenizers "
                          f"({error.name} is missing): {INSTALL_HINT}") from None


def check_model_name(model: str) -> None:
    """Refuse a ``policy.model`` that is neither a named build nor a folder with a processor.

    Raises:
        ValueError: Naming the value and what was expected.
    """
    if hf_tiny.is_named(model):
        return
    folder = Path(model)
    if not folder.is_dir():
        raise ValueError(f"policy.model={model!r} is neither a local directory nor a named model "
                         f"{hf_tiny.NAMES}")
    if not any((folder / name).is_file() for name in PROCESSOR_FILES) or not any(
            (folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"policy.model={model!r} holds no processor (one of {PROCESSOR_FILES} "
                         f"and a tokenizer, {TOKENIZER_FILES}); save it beside the model with "
                         "processor.save_pretrained(folder)")
    if not (folder / "config.json").is_file():
        raise ValueError(f"policy.model={model!r} holds no config.json: not a saved model")


def check_dtype(dtype: str, device: torch.device | str) -> torch.dtype:
    """The torch dtype ``policy.dtype`` names, checked to run on ``device``.

    Raises:
        ValueError: An unknown name, or ``bfloat16`` on a device without it.
    """
    if dtype not in DTYPES:
        raise ValueError(f"policy.dtype={dtype!r}; choose one of {tuple(DTYPES)}")
    device = torch.device(device)
    if dtype == "bfloat16":
        supported = True
        if device.type == "cuda":
            supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        elif device.type == "mps":
            try:
                torch.zeros(1, dtype=torch.bfloat16, device=device)
            except (RuntimeError, TypeError):
                supported = False
        if not supported:
            raise ValueError(f"policy.dtype='bfloat16', but device={str(device)!r} has no "
                             "bfloat16 support; use policy.dtype=float32")
    return DTYPES[dtype]


def action_token_ids(tokenizer, vocab_size: int, num_bins: int, model: str) -> torch.Tensor:
    """The ``num_bins`` highest unreserved ids below ``min(len(tokenizer), vocab_size)``, ascending.

    Raises:
        ValueError: The vocabulary has fewer unreserved ids than bins.
    """
    reserved = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    limit = min(len(tokenizer), vocab_size)
    ids: list[int] = []
    for token_id in range(limit - 1, -1, -1):
        if token_id not in reserved:
            ids.append(token_id)
            if len(ids) == num_bins:
                return torch.tensor(ids[::-1], dtype=torch.long)
    raise ValueError(f"policy.model={model!r}: its vocabulary has {len(ids)} ordinary tokens, "
                     f"too few to hold policy.num_bins={num_bins} action tokens")


def check_model(model: str, num_bins: int, dtype: str) -> None:
    """Every check of a ``policy=hf_vla`` model that needs no device and no weights: the name or
    folder, its processor, every file the libraries read (:func:`~harness.policies.hf_vla.folder.
    check_folder`: no code, no pickles, the saved spec and adapter) and, from the tokenizer
    alone, room for the action bins.

    Raises:
        ValueError: Naming the value (and the file).
        ImportError: The ``vla`` extra is missing.
    """
    check_model_name(model)
    if dtype not in DTYPES:
        raise ValueError(f"policy.dtype={dtype!r}; choose one of {tuple(DTYPES)}")
    if hf_tiny.is_named(model):
        return  # the named builds reserve exactly num_bins action tokens
    check_folder(model, num_bins, ARCHITECTURES)
    require_transformers()
    from transformers import AutoConfig, AutoTokenizer

    AutoConfig.from_pretrained(model, **LOCAL_ONLY)  # a config transformers cannot read
    tokenizer = AutoTokenizer.from_pretrained(model, **LOCAL_ONLY)
    action_token_ids(tokenizer, len(tokenizer), num_bins, model)


def load_model(model: str, num_bins: int, dtype: torch.dtype) -> tuple[Any, Any]:
    """The ``transformers`` model (eval mode, ``dtype``) and processor ``policy.model`` names.

    Raises:
        ValueError: See :func:`check_model_name` and
            :func:`~harness.policies.hf_vla.folder.check_folder`.
    """
    require_transformers()
    check_model_name(model)
    if hf_tiny.is_named(model):
        return hf_tiny.build_named(model, num_bins, dtype)
    check_folder(model, num_bins, ARCHITECTURES)
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model, **LOCAL_ONLY)
    if getattr(processor.image_processor, "do_image_splitting", False):
        processor.image_processor.do_image_splitting = False  # one global image per frame
    with quiet():
        vlm = AutoModelForImageTextToText.from_pretrained(model, use_safetensors=True,
                                                          **LOCAL_ONLY)
    return vlm.to(dtype).eval(), processor


@contextmanager
def quiet() -> Iterator[None]:
    """No ``transformers`` progress bars (loading and writing shards) and no library
    deprecation warnings inside the block."""
    import warnings

    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def save_policy_folder(policy, folder: str | os.PathLike, extra: dict[str, Any]) -> None:
    """Write an ``hf_vla`` policy to ``folder``, crash-safe
    (:func:`harness_common.files.atomic_dir`): the base model without adapters (``config.json``,
    ``model.safetensors``), the processor, with LoRA the adapters (``adapter/``, peft's format),
    the value head and proprio projection (``heads.safetensors``) and the action-bin spec with
    ``extra`` (``hf_vla.json``).

    Args:
        policy: A :class:`harness.policies.hf_vla.policy.HFVLAPolicy`.
        folder: The folder to (re)place.
        extra: More fields of ``hf_vla.json`` (the prompt).
    """
    from safetensors.torch import save_file

    with atomic_dir(folder) as tmp, quiet():
        base = {k.replace(".base_layer.", "."): v for k, v in policy.vlm.state_dict().items()
                if ".lora_" not in k}
        policy.vlm.save_pretrained(tmp, state_dict=base)
        policy.processor.save_pretrained(tmp)
        if policy.lora:
            policy.model.save_pretrained(tmp / ADAPTER_DIR)
        heads = {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()
                 if k.startswith(("value_head.", "proprio_projection."))}
        save_file(heads, tmp / HEADS_FILE)
        spec = {"format": 1, "config": {**dataclasses.asdict(policy.config), "model": None},
                "obs_shapes": {k: list(v) for k, v in policy.obs_shapes.items()},
                "action_token_ids": policy.action_ids.tolist(),
                "image_size": policy.image_size, **extra}
        (tmp / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")


def pixel_values(pixels: torch.Tensor, size: int, mean: torch.Tensor, std: torch.Tensor,
                 rescale: float) -> torch.Tensor:
    """uint8 frames ``(B, H, W, 3)`` -> float ``(B, 3, size, size)``: resized (bilinear,
    antialiased) when the side differs, rescaled, normalised by the processor's mean and std.

    Raises:
        TypeError: ``pixels`` is not uint8.
    """
    if pixels.dtype != torch.uint8:
        raise TypeError(f"pixels must be uint8 (B, H, W, 3), got {pixels.dtype}")
    image = pixels.permute(0, 3, 1, 2).float()
    if image.shape[-2:] != (size, size):
        image = torch.nn.functional.interpolate(image, size=(size, size), mode="bilinear",
                                                antialias=True, align_corners=False)
    return (image * rescale - mean) / std


def cache_argument(model) -> str:
    """The name ``model.forward`` takes the KV cache by (``cache`` from transformers 5.x)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def new_cache(config):
    """An empty KV cache (``DynamicCache``) for ``config``'s model."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:  # transformers 4.x
        return DynamicCache()


def set_checkpointing(vlm, on: bool) -> None:
    """Gradient (activation) checkpointing of ``vlm`` on or off, by this transformers' name."""
    kwargs = {"use_reentrant": False}
    if not hasattr(vlm, "activation_checkpointing_enable"):  # transformers before 5.x
        if on:
            vlm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        else:
            vlm.gradient_checkpointing_disable()
    elif on:
        vlm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        vlm.activation_checkpointing_disable()
