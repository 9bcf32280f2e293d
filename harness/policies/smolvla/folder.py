"""Reading and writing LeRobot SmolVLA checkpoint folders: ``config.json`` + ``model.safetensors``.

A folder is untrusted input: reading checks it whole before any tensor is allocated
(:func:`check_folder`) and refuses with :class:`CheckpointError`, naming the file and the field
or tensor, in this order: it is a directory; it holds ``config.json`` (a JSON object with
``"type": "smolvla"``) and ``model.safetensors`` (weights are read from safetensors only; a
folder with pickled weights alone is refused); the backbone's config can be found offline (see
:func:`harness.policies.smolvla.architecture.resolve_vlm_config`); both configs are at most
1 MB and every size in them is typed and bounded
(:mod:`harness.policies.smolvla.architecture`); the network they describe, built on the meta
device (shapes, no storage), has at most ``max_parameters`` parameters; and the tensors that
``model.safetensors``'s header declares are exactly the network's by name, shape and
floating-point dtype (missing, unexpected and mis-shaped names listed). Only then are the tensors
read (:func:`read_checkpoint`), and a NaN or infinite value is refused naming the tensor. Tensors
that share storage in the network (tied embeddings) may be stored under one name only, as
LeRobot's ``save_pretrained`` does.

Writing builds the whole folder under a temporary name beside the target, then renames it into
place, so a reader never sees half a checkpoint. A folder the group trainer writes also holds
the noise scales and the value head (:data:`HEADS_FILE`, :func:`read_heads`), which LeRobot
ignores.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.policies.smolvla.architecture import (
    CONFIG_FILE,
    MAX_PARAMETERS,
    POLICY_TYPE,
    VLM_CONFIG_FILE,
    WEIGHTS_FILE,
    Architecture,
    CheckpointError,
    SmolVLAConfig,
    check_vlm_config,
    read_json,
    resolve_vlm_config,
)

PICKLED_WEIGHTS = ("pytorch_model.bin", "model.pt", "model.pth", "model.ckpt")
LISTED = 12  # names shown per problem in an error; the rest are counted
MAX_HEADER_BYTES = 100_000_000  # a safetensors header (safetensors' own limit)
# Bytes per value of each safetensors dtype; the floating ones may hold any float parameter.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
               "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
StoredTensor = tuple[tuple[int, ...], str]  # (shape, safetensors dtype) from a header


def check_folder(folder: str | os.PathLike, network: Callable[[SmolVLAConfig], nn.Module],
                 vlm_config: dict[str, Any] | str | os.PathLike | None = None,
                 patch_positions: str = "exact",
                 max_parameters: int = MAX_PARAMETERS) -> SmolVLAConfig:
    """Everything about a SmolVLA checkpoint folder that can be checked without allocating a
    tensor: its files, its configs (bounded before they are parsed, every size typed and
    bounded), the size of the network they describe, and the names, shapes and dtypes in
    ``model.safetensors``'s header against that network.

    Args:
        folder: A LeRobot SmolVLA checkpoint folder.
        network: Builds the network a config describes (:class:`~harness.policies.smolvla.
            model.SmolVLAModel`); it is built on the meta device, without storage.
        vlm_config: Where the backbone's config is, when the folder does not say (see
            :func:`harness.policies.smolvla.architecture.resolve_vlm_config`).
        patch_positions: See :class:`~harness.policies.smolvla.architecture.SmolVLAConfig`.
        max_parameters: The largest network accepted, in parameters.

    Returns:
        The folder's config.

    Raises:
        CheckpointError: Naming the file, the field or tensor, and why.
    """
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
    vlm, vlm_source = resolve_vlm_config(path, policy, vlm_config)
    Architecture.from_policy(policy, str(path / CONFIG_FILE))
    check_vlm_config(vlm, vlm_source)
    try:
        config = SmolVLAConfig(policy=policy, vlm=vlm, patch_positions=patch_positions)
    except CheckpointError as error:
        raise CheckpointError(f"SmolVLA checkpoint {path} ({CONFIG_FILE} with the backbone "
                              f"config {vlm_source}): {error}") from None
    described = f"{path / CONFIG_FILE} with the backbone config {vlm_source}"
    network = network_state(network, config, described)
    check_parameter_count(network, max_parameters, described)
    header = read_header(path / WEIGHTS_FILE)
    wrong_dtype = [f"{name} {header[name][1]}" for name in sorted(header.keys() & network.keys())
                   if network[name].is_floating_point() != (header[name][1] in FLOAT_DTYPES)]
    compare_shapes({name: tuple(tensor.shape) for name, tensor in network.items()},
                   fill_tied({name: shape for name, (shape, _) in header.items()},
                             shared_groups(network)),
                   str(path / WEIGHTS_FILE), wrong_dtype)
    return config


def read_checkpoint(folder: str | os.PathLike, network: Callable[[SmolVLAConfig], nn.Module],
                    vlm_config: dict[str, Any] | str | os.PathLike | None = None,
                    patch_positions: str = "exact",
                    max_parameters: int = MAX_PARAMETERS
                    ) -> tuple[SmolVLAConfig, dict[str, torch.Tensor]]:
    """The config and the stored tensors of a SmolVLA checkpoint folder: :func:`check_folder`,
    then the tensors read and refused when any value is NaN or infinite.

    Args:
        folder, network, vlm_config, patch_positions, max_parameters: See
            :func:`check_folder`.

    Returns:
        ``(config, tensors)``, tensors on the CPU as stored.

    Raises:
        CheckpointError: The folder is not a SmolVLA checkpoint, naming the file and why.
    """
    config = check_folder(folder, network, vlm_config, patch_positions, max_parameters)
    path = Path(folder) / WEIGHTS_FILE
    tensors = load_tensors(path)
    check_finite(tensors, path)
    return config, tensors


def network_state(network: Callable[[SmolVLAConfig], nn.Module], config: SmolVLAConfig,
                  source: str) -> dict[str, torch.Tensor]:
    """The state of the network ``config`` describes (built by ``network``), as meta tensors:
    names, shapes and dtypes, no storage (tied names hold the same tensor).

    Raises:
        CheckpointError: The network cannot be built from ``config``, naming ``source``.
    """
    try:
        with torch.device("meta"):
            return network(config).state_dict(keep_vars=True)
    except Exception as error:  # transformers and torch raise their own types for a bad size
        raise CheckpointError(f"{source} describes a network that cannot be built: "
                              f"{type(error).__name__}: {error}") from None


def check_parameter_count(state: Mapping[str, torch.Tensor], max_parameters: int,
                          source: str) -> None:
    """Refuse a network of more than ``max_parameters`` parameters (tied ones counted once).

    Raises:
        CheckpointError: Naming ``source``, the count, its float32 size and the limit.
    """
    tied = {name for group in shared_groups(state) for name in group[1:]}
    count = sum(tensor.numel() for name, tensor in state.items() if name not in tied)
    if count > max_parameters:
        raise CheckpointError(f"{source} describes a network of {count:,} parameters "
                              f"({count * 4 / 1e9:.1f} GB in float32), above the limit of "
                              f"{max_parameters:,} (max_parameters)")


def read_header(path: Path) -> dict[str, StoredTensor]:
    """The tensors a safetensors file declares, from its header alone: the 8-byte length is
    bounded by :data:`MAX_HEADER_BYTES` and the file, each tensor's dtype, shape and byte range
    checked against each other and the file.

    Returns:
        ``{name: (shape, dtype)}`` (``__metadata__`` left out).

    Raises:
        CheckpointError: Naming ``path`` and what is wrong (and the tensor).
    """
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{path} is not a safetensors file: its header length "
                                  f"{length} is not within the file's {size} bytes (and at most "
                                  f"{MAX_HEADER_BYTES})")
        text = file.read(length)
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise CheckpointError(f"{path} is not a safetensors file: its header is not JSON: "
                              f"{error}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a safetensors file: its header is not an object")
    data_bytes = size - 8 - length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = stored_tensor(entry, data_bytes, f"{path}: tensor {name!r}")
    return tensors


def stored_tensor(entry: Any, data_bytes: int, source: str) -> StoredTensor:
    """One header entry checked: a known dtype, a shape of non-negative ints, and byte offsets
    inside the data that hold exactly that many values.

    Raises:
        CheckpointError: Naming ``source`` and the entry.
    """
    if not isinstance(entry, dict):
        raise CheckpointError(f"{source} has a header entry {entry!r}; expected an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise CheckpointError(f"{source} has dtype={dtype!r}; expected one of "
                              f"{sorted(DTYPE_BYTES)}")
    counts = [*shape, *offsets] if isinstance(shape, list) and isinstance(offsets, list) else []
    if (not counts or len(offsets) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts)):
        raise CheckpointError(f"{source} has shape={shape!r}, data_offsets={offsets!r}; expected "
                              "lists of non-negative ints, two offsets")
    begin, end = offsets
    if not begin <= end <= data_bytes or end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
        raise CheckpointError(f"{source} has shape={shape} of {dtype} at bytes {offsets}, which "
                              f"do not hold it within the file's {data_bytes} data bytes")
    return tuple(shape), dtype


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file whose header :func:`read_header` passed, on the CPU.

    Raises:
        CheckpointError: Naming ``path``: safetensors cannot read it.
    """
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as error:  # safetensors raises its own error types for a bad file
        raise CheckpointError(f"{path} is not a readable safetensors file: "
                              f"{type(error).__name__}: {error}") from None


def check_finite(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """Refuse NaN or infinite values, naming ``path`` and the tensors that hold them.

    Raises:
        CheckpointError: Naming the file and the tensors.
    """
    bad = sorted(name for name, tensor in tensors.items()
                 if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()))
    if bad:
        raise CheckpointError(f"{path} holds NaN or infinite values in {len(bad)} tensors: "
                              f"{bad[:LISTED]}" + (f" and {len(bad) - LISTED} more"
                                                   if len(bad) > LISTED else ""))


def shared_groups(state: Mapping[str, torch.Tensor]) -> list[list[str]]:
    """Names of ``state`` that share storage (the same tensor, for meta tensors), in groups of
    two or more."""
    groups: dict[Any, list[str]] = {}
    for name, tensor in state.items():
        key = id(tensor) if tensor.is_meta else (tensor.untyped_storage().data_ptr(),
                                                 tensor.storage_offset())
        groups.setdefault(key, []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def tied_groups(module: torch.nn.Module) -> list[list[str]]:
    """Names of ``module``'s state that share storage, in groups of two or more."""
    return shared_groups(module.state_dict(keep_vars=True))


def fill_tied(stored: Mapping[str, Any], groups: list[list[str]]) -> dict[str, Any]:
    """``stored`` with each name missing from a tied group filled from another of its names."""
    stored = dict(stored)
    for group in groups:
        present = [name for name in group if name in stored]
        for name in group:
            if present and name not in stored:
                stored[name] = stored[present[0]]
    return stored


def compare_shapes(expected: Mapping[str, tuple[int, ...]], stored: Mapping[str, tuple[int, ...]],
                   source: str, wrong_dtype: list[str] | None = None) -> None:
    """Refuse stored tensors that are not exactly the network's.

    Raises:
        CheckpointError: Naming ``source`` and listing the missing, unexpected, mis-shaped and
            (``wrong_dtype``) non-float names.
    """
    problems = {
        "missing": sorted(set(expected) - set(stored)),
        "unexpected": sorted(set(stored) - set(expected)),
        "mis-shaped": [f"{name} {stored[name]} (expected {expected[name]})"
                       for name in sorted(set(expected) & set(stored))
                       if stored[name] != expected[name]],
        "not of a floating-point dtype": wrong_dtype or [],
    }
    found = {kind: names for kind, names in problems.items() if names}
    if found:
        lines = [f"{len(names)} {kind}: {names[:LISTED]}"
                 + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")
                 for kind, names in found.items()]
        raise CheckpointError(f"{source} does not match the SmolVLA network its config.json "
                              "describes: " + "; ".join(lines))


def match_state(module: torch.nn.Module, tensors: dict[str, torch.Tensor],
                source: str) -> dict[str, torch.Tensor]:
    """``tensors`` completed for ``module.load_state_dict(..., strict=True)``.

    A name missing from ``tensors`` is filled from another name of its tied group.

    Raises:
        CheckpointError: Naming ``source`` and listing the missing, unexpected and mis-shaped
            names.
    """
    tensors = fill_tied(tensors, tied_groups(module))
    compare_shapes({name: tuple(tensor.shape) for name, tensor in module.state_dict().items()},
                   {name: tuple(tensor.shape) for name, tensor in tensors.items()}, source)
    return tensors


def write_checkpoint(folder: str | os.PathLike, config: SmolVLAConfig,
                     module: torch.nn.Module, overwrite: bool = False,
                     extra: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
                     marked: bool = False) -> Path:
    """Write ``config.json``, ``model.safetensors`` and ``vlm_config.json`` atomically.

    Tied tensors are stored once, under the first name of their group; each tensor is stored
    in the dtype it has.

    Args:
        folder: The checkpoint folder to create.
        config: The network's config; ``config.policy`` becomes ``config.json``.
        module: The network whose ``state_dict`` is saved.
        overwrite: Replace an existing ``folder`` (after the new one is complete) that holds
            only what this writes (:func:`~harness.policies.smolvla.out_folder.check_replaceable`).
        extra: More safetensors files written with the others, by file name.
        marked: Write :data:`~harness.policies.smolvla.out_folder.MARKER_FILE` too, and replace
            only a folder that holds one.

    Returns:
        The folder.

    Raises:
        ValueError: ``folder`` is the working directory or a folder above it.
        FileExistsError: ``folder`` exists and ``overwrite`` is false, or it holds what this
            did not write.
    """
    from safetensors.torch import save_file

    from harness.policies.smolvla.out_folder import (
        MARKER_FILE,
        check_out_folder,
        check_replaceable,
        marker_record,
    )

    target = Path(folder)
    check_out_folder(target)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True to replace it")
    if target.exists():
        check_replaceable(target, {CONFIG_FILE, WEIGHTS_FILE, VLM_CONFIG_FILE, *(extra or {})},
                          marked)
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
        if marked:
            record = marker_record(path.name for path in staging.iterdir())
            (staging / MARKER_FILE).write_text(json.dumps(record, indent=2) + "\n")
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
    return {"noise_logit": (flow_steps, arch.chunk_size * arch.max_action_dim),
            "value_head.0.weight": (hidden, config.width), "value_head.0.bias": (hidden,),
            "value_head.2.weight": (1, hidden), "value_head.2.bias": (1,)}


def read_heads(folder: str | os.PathLike, flow_steps: int, hidden: int,
               config: SmolVLAConfig) -> dict[str, torch.Tensor] | None:
    """The noise scales and the value head stored beside a SmolVLA folder, or ``None`` when it
    has none (a LeRobot checkpoint). The file's header is checked before a tensor is read, and
    the values must be finite.

    Raises:
        CheckpointError: (a ``ValueError``) The file is not a safetensors file, its tensors do
            not fit ``flow_steps`` and ``hidden`` or are not floating-point, or a value is NaN
            or infinite, naming the file (and the tensors).
    """
    path = Path(folder) / HEADS_FILE
    if not path.is_file():
        return None
    header = read_header(path)
    stored = {name: shape for name, (shape, _) in header.items()}
    expected = head_shapes(flow_steps, hidden, config)
    if stored != expected:
        differ = ", ".join(f"{name} {stored.get(name)} (need {expected.get(name)})"
                           for name in sorted(stored.keys() | expected.keys())
                           if stored.get(name) != expected.get(name))
        raise CheckpointError(
            f"{path} holds noise scales and a value head that do not fit policy.flow_steps="
            f"{flow_steps} and policy.hidden={hidden}: {differ}; use the settings the folder "
            f"was written with, or delete {HEADS_FILE} to start fresh ones")
    wrong_dtype = sorted(f"{name} {dtype}" for name, (_, dtype) in header.items()
                         if dtype not in FLOAT_DTYPES)
    if wrong_dtype:
        raise CheckpointError(f"{path} holds tensors of no floating-point dtype: {wrong_dtype}")
    heads = load_tensors(path)
    check_finite(heads, path)
    return heads
