"""What a ``policy.model`` folder may hold, checked before ``transformers`` or ``peft`` reads it.

A model folder is data, never code: ``transformers`` runs Python files of a folder whose JSON
names them (``auto_map``) once a user answers "y" to its prompt, and unpickles ``.bin`` weights.
So every JSON file the libraries read is parsed here first (a file that is not a JSON object, or
that names custom code, is refused by name), weights are read from safetensors only (any pickled
file in the folder or its adapter is refused by name), and the ``hf_vla.json`` of a saved policy
and its LoRA adapter are checked field by field. :func:`check_folder` does all of it, from the
config check, so a bad folder stops a run before its run folder exists.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SPEC_FILE = "hf_vla.json"  # the action-bin spec written beside a saved policy
SPEC_FORMAT = 1
ADAPTER_DIR = "adapter"  # LoRA adapters of a saved policy (peft's save_pretrained)
HEADS_FILE = "heads.safetensors"  # value head and proprio projection of a saved policy
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# JSON files transformers reads (and would follow an ``auto_map`` of) when it loads a folder.
LIBRARY_JSON = ("config.json", "processor_config.json", "preprocessor_config.json",
                "tokenizer_config.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_BINS = 65536
MAX_SIDE = 4096  # largest side of an observation array a saved policy may declare


def read_json(path: Path, model: str) -> dict[str, Any]:
    """The JSON object in ``path`` of folder ``model``.

    Raises:
        ValueError: Naming the file: unreadable, not JSON, or not an object.
    """
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"policy.model={model!r}: {path} is not readable JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"policy.model={model!r}: {path} holds a {type(value).__name__}; "
                         "expected a JSON object")
    return value


def check_folder(folder: str | os.PathLike, num_bins: int, architectures: Iterable[str]) -> str:
    """Refuse a model folder that names code, holds pickles or a malformed policy spec.

    Args:
        folder: ``policy.model``, a directory.
        num_bins: ``policy.num_bins``; a saved policy must have been trained with as many.
        architectures: The ``model_type`` values the policy drives.

    Returns:
        The folder's ``model_type``.

    Raises:
        ValueError: Naming the file and the field, and what was expected.
    """
    model, folder = str(folder), Path(folder)
    config = read_json(folder / "config.json", model)
    for name in LIBRARY_JSON:
        if (folder / name).is_file():
            _refuse_code(folder / name, read_json(folder / name, model), model)
    model_type = config.get("model_type")
    if model_type not in tuple(architectures):
        raise ValueError(f"policy.model={model!r} is a {model_type!r} model "
                         f"({folder / 'config.json'}); policy=hf_vla drives {tuple(architectures)}")
    _refuse_pickles(folder, model)
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"policy.model={model!r} holds no {WEIGHT_FILES[0]}: weights are read "
                         "from safetensors only (save_pretrained(folder, safe_serialization=True))")
    spec = read_spec(folder)
    if spec is not None and spec["config"]["num_bins"] != num_bins:
        raise ValueError(f"policy.model={model!r} is an hf_vla policy saved with num_bins="
                         f"{spec['config']['num_bins']}; set policy.num_bins to match, not "
                         f"{num_bins}")
    if (folder / ADAPTER_DIR).exists():
        check_adapter(folder / ADAPTER_DIR, model)
    return model_type


def check_adapter(adapter: Path, model: str) -> dict[str, Any]:
    """The ``adapter_config.json`` of a saved LoRA adapter, once the folder is checked.

    Raises:
        ValueError: A missing file, pickled weights, or a config that is not LoRA's or that
            names code.
    """
    _refuse_pickles(adapter, model)
    missing = [name for name in ADAPTER_FILES if not (adapter / name).is_file()]
    if missing:
        raise ValueError(f"policy.model={model!r}: its adapter folder {adapter} lacks {missing}; "
                         "adapters are read from safetensors only")
    config = read_json(adapter / ADAPTER_FILES[0], model)
    if config.get("peft_type") != "LORA":
        raise ValueError(f"policy.model={model!r}: {adapter / ADAPTER_FILES[0]} has peft_type="
                         f"{config.get('peft_type')!r}; expected 'LORA'")
    _refuse_code(adapter / ADAPTER_FILES[0], config, model)
    return config


def read_spec(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The checked ``hf_vla.json`` of a saved policy, or ``None`` for a plain model folder.

    Raises:
        ValueError: Naming the file and the field: not JSON, another format, or a field of the
            wrong type or out of range.
    """
    path = Path(folder) / SPEC_FILE
    if not path.is_file():
        return None
    spec = read_json(path, str(folder))
    config, shapes = spec.get("config"), spec.get("obs_shapes")
    bins = config.get("num_bins") if isinstance(config, dict) else None
    problems = {
        "format": spec.get("format") == SPEC_FORMAT,
        "config": isinstance(config, dict),
        "config.num_bins": _integer(bins, 2, MAX_BINS),
        "obs_shapes": isinstance(shapes, dict) and all(
            isinstance(shape, list) and 1 <= len(shape) <= 3
            and all(_integer(side, 1, MAX_SIDE) for side in shape) for shape in shapes.values()),
    }
    bad = [field for field, ok in problems.items() if not ok]
    if bad:
        found = {field: spec.get(field) if "." not in field else bins for field in bad}
        raise ValueError(f"{path}: malformed field(s) {bad} ({found}); expected format "
                         f"{SPEC_FORMAT}, a config object with num_bins in [2, {MAX_BINS}] and "
                         f"obs_shapes of 1 to 3 sides in [1, {MAX_SIDE}] each, as "
                         "save_pretrained writes")
    return spec


def _integer(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _refuse_code(path: Path, content: dict[str, Any], model: str) -> None:
    """Refuse a JSON file that points transformers at Python code (``auto_map``); peft's
    ``auto_mapping`` is read by ``AutoPeftModel`` only, which is never called."""
    if content.get("auto_map"):
        raise ValueError(f"policy.model={model!r}: {path} names custom code (auto_map="
                         f"{content['auto_map']!r}); policy=hf_vla never runs code from a model "
                         "folder")


def _refuse_pickles(folder: Path, model: str) -> None:
    """Refuse pickled files, which ``torch.load`` would read instead of safetensors."""
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickled:
        raise ValueError(f"policy.model={model!r}: {folder} holds pickled file(s) {pickled}; "
                         "weights are read from safetensors only (save_pretrained(folder, "
                         "safe_serialization=True)), remove them")
