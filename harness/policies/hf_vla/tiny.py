"""Named vision-language models built offline, with random weights: ``tiny:*`` and ``small:*``.

``policy.model=tiny:paligemma`` (or ``tiny:idefics3``, ``small:paligemma``, ``small:idefics3``)
builds a real ``transformers`` model of that architecture, scaled down, with weights drawn from
a fixed seed, so the same name always gives the same weights (as a downloaded checkpoint would),
and a processor assembled here: a word-level tokenizer (``tokenizers``) over the prompt words,
our tasks' instruction vocabulary (:data:`tasks.language.CORE_VOCAB`) and ``num_bins`` reserved
action tokens ``<act_0> ... <act_{K-1}>``, the last ordinary ids of the vocabulary, wrapped as a
``PreTrainedTokenizerFast``, and the architecture's image processor. Nothing is downloaded.

=========  ==========  ==========  =======================  ============  ===============
size       image side  patch       vision (width, layers)   text (width,  parameters, 256
                                                            layers)       bins (paligemma
                                                                          / idefics3)
=========  ==========  ==========  =======================  ============  ===============
``tiny``   32          16 / 8      32, 1                    64, 2         0.21 M / 0.14 M
``small``  64          16 / 8      64, 2                    128, 4        0.90 M / 0.75 M
=========  ==========  ==========  =======================  ============  ===============

Both architectures see 4 (``tiny``) or 16 (``small``) image tokens: PaliGemma one per patch,
Idefics3 one per 2 x 2 patches after its pixel shuffle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tasks.language import CORE_VOCAB

ARCHITECTURES: tuple[str, ...] = ("paligemma", "idefics3")
PROMPT_WORDS: tuple[str, ...] = ("In", ":", "What", "action", "should", "the", "robot", "take",
                                 "to", "?", "Out")
IMAGE_TOKENS: tuple[str, ...] = ("<image>", "<fake_token_around_image>", "<global-img>",
                                 "<end_of_utterance>")
WEIGHT_SEED = 0  # every named model's weights; the name fixes them, as a checkpoint would


@dataclass(frozen=True)
class TinySize:
    """Dimensions of one named size (see the module docstring's table)."""

    image_size: int
    vision_hidden: int
    vision_layers: int
    text_hidden: int
    text_layers: int
    heads: int


SIZES: dict[str, TinySize] = {
    "tiny": TinySize(image_size=32, vision_hidden=32, vision_layers=1, text_hidden=64,
                     text_layers=2, heads=2),
    "small": TinySize(image_size=64, vision_hidden=64, vision_layers=2, text_hidden=128,
                      text_layers=4, heads=4),
}
NAMES: tuple[str, ...] = tuple(f"{size}:{arch}" for size in SIZES for arch in ARCHITECTURES)


def is_named(model: str) -> bool:
    """Whether ``model`` is one of :data:`NAMES`."""
    return model in NAMES


def build_tokenizer(num_bins: int):
    """A word-level ``PreTrainedTokenizerFast``: special tokens, the image placeholders, the
    prompt and instruction words, then ``<act_0> ... <act_{num_bins-1}>`` as the last ids.

    The words are our tasks' (:data:`tasks.language.CORE_VOCAB`): the suites' words map to
    ``<unk>`` here, so that the tiny models' ids and seeded weights stay what they were."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<bos>", "<eos>", *IMAGE_TOKENS]
    words = list(dict.fromkeys([*PROMPT_WORDS, *CORE_VOCAB[2:]]))
    actions = [f"<act_{k}>" for k in range(num_bins)]
    vocab = {token: i for i, token in enumerate([*specials, *words, *actions])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>",
                                   eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS)})
    return fast


def build_named(name: str, num_bins: int, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """The model and processor ``name`` stands for, with weights seeded by :data:`WEIGHT_SEED`
    (the global torch generator is left as it was).

    Args:
        name: One of :data:`NAMES`.
        num_bins: Action tokens to reserve in the vocabulary.
        dtype: Parameter dtype.

    Returns:
        ``(model, processor)``: a ``PaliGemmaForConditionalGeneration`` or
        ``Idefics3ForConditionalGeneration`` in eval mode, and its processor.

    Raises:
        ValueError: ``name`` is not one of :data:`NAMES`.
    """
    if name not in NAMES:
        raise ValueError(f"policy.model={name!r} is not a named model; choose one of {NAMES}")
    size_name, architecture = name.split(":")
    size = SIZES[size_name]
    tokenizer = build_tokenizer(num_bins)
    build = _paligemma if architecture == "paligemma" else _idefics3
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(WEIGHT_SEED)
        model, processor = build(size, tokenizer, dtype)
    return model.eval(), processor


def _text_config(size: TinySize, vocab_size: int) -> dict[str, Any]:
    return {"hidden_size": size.text_hidden, "intermediate_size": 2 * size.text_hidden,
            "num_hidden_layers": size.text_layers, "num_attention_heads": size.heads,
            "num_key_value_heads": 1, "head_dim": size.text_hidden // size.heads,
            "vocab_size": vocab_size, "max_position_embeddings": 512, "pad_token_id": 0,
            "bos_token_id": 2, "eos_token_id": 3}


def _vision_config(size: TinySize, patch_size: int) -> dict[str, Any]:
    return {"hidden_size": size.vision_hidden, "intermediate_size": 2 * size.vision_hidden,
            "num_hidden_layers": size.vision_layers, "num_attention_heads": size.heads,
            "image_size": size.image_size, "patch_size": patch_size}


def _paligemma(size: TinySize, tokenizer, dtype: torch.dtype):
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    patch = 16
    image_processor = SiglipImageProcessorPil(
        size={"height": size.image_size, "width": size.image_size},
        image_seq_length=(size.image_size // patch) ** 2)
    processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    config = PaliGemmaConfig(
        vision_config={"model_type": "siglip_vision_model", **_vision_config(size, patch)},
        text_config={"model_type": "gemma", **_text_config(size, len(processor.tokenizer))},
        image_token_id=processor.image_token_id, projection_dim=size.text_hidden,
        hidden_size=size.text_hidden, vocab_size=len(processor.tokenizer))
    return PaliGemmaForConditionalGeneration(config).to(dtype), processor


def _idefics3(size: TinySize, tokenizer, dtype: torch.dtype):
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    patch, scale = 8, 2
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": size.image_size}, max_image_size={"longest_edge": size.image_size},
        do_image_splitting=False)
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                  image_seq_len=(size.image_size // patch) ** 2 // scale**2)
    config = Idefics3Config(
        vision_config=_vision_config(size, patch),
        text_config={"model_type": "llama", **_text_config(size, len(processor.tokenizer))},
        image_token_id=processor.image_token_id, scale_factor=scale, pad_token_id=0)
    return Idefics3ForConditionalGeneration(config).to(dtype), processor
