"""Reading and writing LeRobot SmolVLA checkpoint folders: ``config.json`` + ``model.safetensors``.

Reading checks, in this order, and refuses with :class:`CheckpointError` naming the folder: it is
a directory; it holds ``config.json`` (a JSON object with ``"type": "smolvla"``) and
``model.safetensors`` (weights are read from safetensors only; a folder with pickled weights
alone is refused); the backbone's config can be found offline (see
:func:`harness.policies.smolvla.architecture.resolve_vlm_config`); and, once the network is
built, the file's tensors are exactly the network's (missing, unexpected and mis-shaped names
listed). Tensors that share storage in the network (tied embeddings) may be stored under one
name only, as LeRobot's ``save_pretrained`` does.

Writing builds the whole folder under a temporary name beside the target, then renames it into
place, so a reader never sees half a checkpoint. A folder the group trainer writes also holds
the noise scales and the value head (:data:`HEADS_FILE`, :func:`read_heads`), which LeRobot
ignores.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from harness.policies.smolvla.architecture import (
    CONFIG_FILE,
    POLICY_TYPE,
    VLM_CONFIG_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    SmolVLAConfig,
    read_json,
    resolve_vlm_config,
)

PICKLED_WEIGHTS = ("pytorch_model.bin", "model.pt", "model.pth", "model.ckpt")
LISTED = 12  # names shown per problem in an error; the rest are counted


def read_checkpoint(folder: str | os.PathLike,
                    vlm_config: dict[str, Any] | str | os.PathLike | None = None,
                    patch_positions: str = "exact"
                    ) -> tuple[SmolVLAConfig, dict[str, torch.Tensor]]:
    """The config and the stored tensors of a SmolVLA checkpoint folder.

    Args:
        folder: A LeRobot SmolVLA checkpoint folder.
        vlm_config: Where the backbone's config is, when the folder does not say (see
            :func:`harness.policies.smolvla.architecture.resolve_vlm_config`).
        patch_positions: See :class:`~harness.policies.smolvla.architecture.SmolVLAConfig`.

    Returns:
        ``(config, tensors)``, tensors on the CPU as stored.

    Raises:
        CheckpointError: The folder is not a SmolVLA checkpoint, naming it and why.
    """
    from safetensors.torch import load_file

    path = Path(folder)
    if not path.is_dir():
        raise CheckpointError(f"SmolVLA checkpoint {path} is not a folder")
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (path / name).is_file()]
    if missing:
        pickled = [name for name in PICKLED_WEIGHTS if (path / name).is_file()]
        extra = f" (it has {pickled}: weights are read from safetensors only)" if pickled else ""
        raise CheckpointError(f"SmolVLA checkpoint {path} lacks {missing}{extra}; a LeRobot "
                              f"checkpoint holds {CONFIG_FILE} and {WEIGHTS_FILE}")
    policy = read_json(path / CONFIG_FILE, f"SmolVLA checkpoint {path}")
    if policy.get("type") != POLICY_TYPE:
        raise CheckpointError(f"{path / CONFIG_FILE} has type={policy.get('type')!r}; expected "
                              f"{POLICY_TYPE!r} (a LeRobot SmolVLA checkpoint)")
    vlm = resolve_vlm_config(path, policy, vlm_config)
    try:
        config = SmolVLAConfig(policy=policy, vlm=vlm, patch_positions=patch_positions)
    except CheckpointError as error:
        raise CheckpointError(f"SmolVLA checkpoint {path}: {error}") from None
    try:
        tensors = load_file(str(path / WEIGHTS_FILE), device="cpu")
    except Exception as error:  # safetensors raises its own error types for a bad header
        raise CheckpointError(f"{path / WEIGHTS_FILE} is not a readable safetensors file: "
                              f"{error}") from None
    return config, tensors


def tied_groups(module: torch.nn.Module) -> list[list[str]]:
    """Names of ``module``'s state that share storage, in groups of two or more."""
    groups: dict[tuple[int, int], list[str]] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        groups.setdefault(key, []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def match_state(module: torch.nn.Module, tensors: dict[str, torch.Tensor],
                source: str) -> dict[str, torch.Tensor]:
    """``tensors`` completed for ``module.load_state_dict(..., strict=True)``.

    A name missing from ``tensors`` is filled from another name of its tied group.

    Raises:
        CheckpointError: Naming ``source`` and listing the missing, unexpected and mis-shaped
            names.
    """
    expected = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
    tensors = dict(tensors)
    for group in tied_groups(module):
        present = [name for name in group if name in tensors]
        for name in group:
            if present and name not in tensors:
                tensors[name] = tensors[present[0]]
    problems = {
        "missing": sorted(set(expected) - set(tensors)),
        "unexpected": sorted(set(tensors) - set(expected)),
        "mis-shaped": [f"{name} {tuple(tensors[name].shape)} (expected {expected[name]})"
                       for name in sorted(set(expected) & set(tensors))
                       if tuple(tensors[name].shape) != expected[name]],
    }
    found = {kind: names for kind, names in problems.items() if names}
    if found:
        lines = [f"{len(names)} {kind}: {names[:LISTED]}"
                 + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")
                 for kind, names in found.items()]
        raise CheckpointError(f"{source} does not match the SmolVLA network its config.json "
                              "describes: " + "; ".join(lines))
    return tensors


def write_checkpoint(folder: str | os.PathLike, config: SmolVLAConfig,
                     module: torch.nn.Module, overwrite: bool = False,
                     extra: Mapping[str, Mapping[str, torch.Tensor]] | None = None) -> Path:
    """Write ``config.json``, ``model.safetensors`` and ``vlm_config.json`` atomically.

    Tied tensors are stored once, under the first name of their group; each tensor is stored
    in the dtype it has.

    Args:
        folder: The checkpoint folder to create.
        config: The network's config; ``config.policy`` becomes ``config.json``.
        module: The network whose ``state_dict`` is saved.
        overwrite: Replace an existing ``folder`` (after the new one is complete).
        extra: More safetensors files written with the others, by file name.

    Returns:
        The folder.

    Raises:
        FileExistsError: ``folder`` exists and ``overwrite`` is false.
    """
    from safetensors.torch import save_file

    target = Path(folder)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    dropped = {name for group in tied_groups(module) for name in group[1:]}
    state = {name: tensor.detach().to("cpu").contiguous()
             for name, tensor in module.state_dict().items() if name not in dropped}
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        (staging / CONFIG_FILE).write_text(json.dumps(config.policy, indent=4) + "\n")
        (staging / VLM_CONFIG_FILE).write_text(json.dumps(config.vlm, indent=2) + "\n")
        save_file(state, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
        for name, tensors in (extra or {}).items():
            save_file({key: tensor.detach().to("cpu").contiguous()
                       for key, tensor in tensors.items()}, str(staging / name))
        if target.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.replace(target, retired / target.name)
            os.replace(staging, target)
            shutil.rmtree(retired)
        else:
            os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target


# The noise scales and the value head, beside the network in a folder this policy writes.
HEADS_FILE = "harness_heads.safetensors"


def head_shapes(flow_steps: int, hidden: int, config: SmolVLAConfig) -> dict[str, tuple[int, ...]]:
    """The shapes of :meth:`~harness.policies.smolvla.policy.SmolVLAPolicy.heads_state` for a
    network of ``config``."""
    arch = config.arch
    width = int(config.vlm["text_config"]["hidden_size"])
    return {"noise_logit": (flow_steps, arch.chunk_size * arch.max_action_dim),
            "value_head.0.weight": (hidden, width), "value_head.0.bias": (hidden,),
            "value_head.2.weight": (1, hidden), "value_head.2.bias": (1,)}


def read_heads(folder: str | os.PathLike, flow_steps: int, hidden: int,
               config: SmolVLAConfig) -> dict[str, torch.Tensor] | None:
    """The noise scales and the value head stored beside a SmolVLA folder, or ``None`` when it
    has none (a LeRobot checkpoint).

    Raises:
        ValueError: They do not fit ``flow_steps`` and ``hidden``, naming the file and both.
    """
    from safetensors.torch import load_file

    path = Path(folder) / HEADS_FILE
    if not path.is_file():
        return None
    heads = load_file(str(path))
    stored = {name: tuple(tensor.shape) for name, tensor in heads.items()}
    expected = head_shapes(flow_steps, hidden, config)
    if stored != expected:
        differ = ", ".join(f"{name} {stored.get(name)} (need {expected.get(name)})"
                           for name in sorted(stored.keys() | expected.keys())
                           if stored.get(name) != expected.get(name))
        raise ValueError(
            f"{path} holds noise scales and a value head that do not fit policy.flow_steps="
            f"{flow_steps} and policy.hidden={hidden}: {differ}; use the settings the folder "
            f"was written with, or delete {HEADS_FILE} to start fresh ones")
    return heads
