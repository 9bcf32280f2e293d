"""Policies to ONNX: one graph from the raw observation arrays to greedy actions.

The graph takes exactly what the env returns, each array with a leading batch axis of any size:
``pixels`` uint8 ``(B, H, W, 3)``, ``state`` / ``proprio`` float32, ``instruction`` int64 token
ids; only the keys the policy reads are inputs. The policy's own preprocessing is traced into
it (pixels to CHW floats in ``[0, 1]``, the mean instruction embedding, the float casts of
``harness.policies.obs_to_batch``), and so is the action rule: outputs are ``logits``
``(B, action_dim, num_bins)``, the greedy ``tokens`` (first arg-max, as ``torch.argmax``) and
their bin-centre ``actions`` ``-1 + 2 * token / (num_bins - 1)``. A deploy side feeds the env's
arrays and reads ``actions``; :mod:`harness.deploy` does so without torch. A policy with action
chunks (``chunk_size = H > 1``) gives the whole chunk: ``logits`` ``(B, H * action_dim,
num_bins)``, ``tokens`` ``(B, H * action_dim)`` and ``actions`` ``(B, H, action_dim)``; the
record's ``execute_steps`` says how many of them the deploy side plays per decision.

A continuous action head (``policy/head=gaussian|flow``) gives ``actions`` alone, the torch
policy's greedy decode traced as it is (:meth:`ActionHead.greedy
<harness.policies.heads.ActionHead.greedy>`): ``tanh`` of the Gaussian's mean chunk, or the
flow's ``K`` noiseless Euler steps from ``x_0 = 0`` (unrolled, ``K`` fixed), clipped to
``[-1, 1]``. The record names the head and its rule (the head's ``greedy_rule``); the parity
check compares these float actions within the tolerance, where tokens compare an exact arg-max.
What the graph computes is the policy's own (:meth:`harness.policies.Policy.export_graph`): the
mlp and tiny_vla networks export with any head; the other kinds refuse by name.

Exporter: ``torch.onnx.export(..., dynamo=False)``, the TorchScript tracer, at opset
:data:`OPSET`. The ``torch.export``-based exporter that torch 2.9+ uses by default needs the
``onnxscript`` package; the tracer needs nothing beyond torch and onnx, and these policies have no
data-dependent control flow for it to miss (the parity check below would catch one). In the
exported copy an ``avg_pool`` TinyVLA's adaptive pooling becomes the same fixed windows
(:class:`WindowAveragePool`), since ONNX cannot pool 11 x 11 to 4 x 4; the torch policy is not
touched.
"""

from __future__ import annotations

import copy
import io
import json
import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from harness.deploy import EXPORT_FORMAT, METADATA_KEY, observation_dtype
from harness.policies import Policy, obs_to_batch

OPSET = 17
_TORCH_DTYPES = {"uint8": torch.uint8, "int64": torch.int64, "float32": torch.float32}


def input_keys(policy: Policy) -> tuple[str, ...]:
    """The observation keys ``policy`` reads: the graph's inputs, in order."""
    return policy.spec.input_keys


class WindowAveragePool(nn.Module):
    """``nn.AdaptiveAvgPool2d`` for one input size, as two constant averaging matrices.

    ONNX has no adaptive pooling whose output size does not divide the input size (an
    ``avg_pool`` TinyVLA at 84 px pools 11 x 11 to 4 x 4); these matrices average the very
    windows torch does, ``[floor(i * n / m), ceil((i + 1) * n / m))``, with two ``MatMul``s.
    """

    def __init__(self, input_size: Sequence[int], output_size: int | Sequence[int | None]) -> None:
        super().__init__()
        if isinstance(output_size, int):
            output_size = (output_size, output_size)
        outputs = [n if m is None else m for n, m in zip(input_size, output_size, strict=True)]
        self.register_buffer("rows", _window_means(input_size[0], outputs[0]))  # (m_h, H)
        self.register_buffer("cols", _window_means(input_size[1], outputs[1]).T)  # (W, m_w)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, C, m_h, m_w)``."""
        return self.rows @ features @ self.cols


def _window_means(size: int, windows: int) -> torch.Tensor:
    """``(windows, size)``: row ``i`` averages ``[floor(i * size / windows), ceil(...))``."""
    matrix = torch.zeros(windows, size)
    for i in range(windows):
        start, end = (i * size) // windows, -((-(i + 1) * size) // windows)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


def _fixed_pools(policy: Policy, example: Mapping[str, torch.Tensor]) -> Policy:
    """``policy`` with each ``nn.AdaptiveAvgPool2d`` replaced by the :class:`WindowAveragePool`
    of the input size it sees on ``example`` (fixed, since the image size is)."""
    sizes: dict[str, tuple[int, ...]] = {}
    hooks = [module.register_forward_pre_hook(
        lambda _, args, name=name: sizes.__setitem__(name, tuple(args[0].shape[-2:])))
        for name, module in policy.named_modules() if isinstance(module, nn.AdaptiveAvgPool2d)]
    with torch.no_grad():
        policy.features(example)
    for hook in hooks:
        hook.remove()
    for name, size in sizes.items():
        parent, _, child = name.rpartition(".")
        pool = WindowAveragePool(size, policy.get_submodule(name).output_size)
        setattr(policy.get_submodule(parent), child, pool)
    return policy


def export_onnx(
    policy: Policy,
    record: Mapping[str, Any],
    observations: Sequence[Mapping[str, np.ndarray]] = (),
    tolerance: float = 1e-4,
) -> tuple[bytes, dict[str, Any]]:
    """The ONNX model of ``policy``, checked against it, with its deploy record in the metadata.

    Args:
        policy: The policy; it is copied, so its device and training mode stay as they are.
        record: What the caller knows of its origin: at least ``task`` and ``task_options``
            (the env it was trained on), usually ``source`` (checkpoint path, SHA-256, algo) and
            ``evaluation`` (the run's evaluation seed and difficulties).
        observations: Raw env observations on which the graph must reproduce the policy
            (:func:`compare_with_torch`); none skips the check.
        tolerance: Largest absolute logit difference allowed, greedy tokens being equal; with
            a continuous head, largest absolute action difference.

    Returns:
        ``(model bytes, full record)``: ``record`` plus the graph inputs (shape without the batch
        axis, dtype), the ``action_head``, outputs, ``action_dim``, ``chunk_size`` and
        ``execute_steps`` (actions per decision, and played per decision), for tokens
        ``num_bins``, the bin centres and their rule, for a continuous head its
        ``greedy_rule``, the policy config, the exporter, the parity check and the export
        date (UTC).

    Raises:
        TypeError: A kind that ONNX export does not cover (``hf_vla``, ``smolvla``), by name.
        ValueError: ``record`` lacks ``task`` or ``task_options``, the exporter fails on a layer, or
            the graph does not reproduce the policy within ``tolerance`` (the message gives the
            figures).
    """
    actions = policy.export_record()  # refuses a kind that ONNX export does not cover
    missing = [key for key in ("task", "task_options") if key not in record]
    if missing:
        raise ValueError(f"the export record lacks {missing}; the deploy side needs the task")
    keys = input_keys(policy)
    inputs = [{"name": key, "shape": list(policy.obs_shapes[key]),
               "dtype": observation_dtype(key)} for key in keys]
    example = tuple(torch.zeros((1, *entry["shape"]), dtype=_TORCH_DTYPES[entry["dtype"]])
                    for entry in inputs)
    copied = copy.deepcopy(policy).cpu().eval()
    copied = _fixed_pools(copied, dict(zip(keys, example, strict=True)))
    kind, head, outputs = policy.spec.kind, actions["action_head"], actions["outputs"]
    traced = _trace(copied.export_graph(keys), example, keys, kind, outputs)
    model = onnx.load_from_string(traced)
    onnx.checker.check_model(model)
    parity = compare_with_torch(traced, policy, observations) if observations else None
    if parity is not None:
        _check_parity(parity, tolerance, kind, head)
    full = {
        "format": EXPORT_FORMAT,
        **record,
        "policy": {"kind": kind, **policy.config.to_saved()},
        "inputs": inputs,
        **actions,
        "exporter": {"torch": torch.__version__, "onnx": onnx.__version__, "opset": OPSET,
                     "method": "torch.onnx.export(dynamo=False)"},
        "parity": None if parity is None else {**parity, "tolerance": tolerance},
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    onnx.helper.set_model_props(model, {METADATA_KEY: json.dumps(full)})
    what = ", ".join("greedy tokens" if name == "tokens" else name for name in outputs)
    model.doc_string = (f"{kind} {'token' if head == 'tokens' else head} policy for task "
                        f"{record['task']!r}: raw observation arrays -> {what}; see the "
                        f"{METADATA_KEY!r} metadata")
    return model.SerializeToString(), full


def _check_parity(parity: Mapping[str, Any], tolerance: float, kind: str, head: str) -> None:
    """Refuse a graph that does not reproduce the torch policy (see :func:`compare_with_torch`).

    Raises:
        ValueError: Tokens: a logit difference above ``tolerance``, or any greedy token or
            action that differs; a continuous head: an action difference above ``tolerance``.
            The message gives the figures.
    """
    if "max_abs_logit_diff" in parity:
        if (parity["max_abs_logit_diff"] > tolerance or parity["token_mismatches"]
                or parity["action_mismatches"]):
            raise ValueError(f"the ONNX graph does not reproduce the {kind} policy: "
                             f"{parity} (tolerance {tolerance} on logits; no greedy token or "
                             "action may differ)")
    elif not parity["max_abs_action_diff"] <= tolerance:  # a NaN fails too
        raise ValueError(f"the ONNX graph does not reproduce the {kind} policy's {head} head: "
                         f"{parity} (tolerance {tolerance} on greedy actions)")


def _trace(module: nn.Module, example: tuple[torch.Tensor, ...], keys: Sequence[str],
           kind: str, outputs: Sequence[str]) -> bytes:
    """The ONNX bytes of ``module`` traced on ``example``, every axis 0 a dynamic batch, its
    outputs named ``outputs``.

    Raises:
        ValueError: The exporter fails on a layer of the ``kind`` policy.
    """
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # The tracer announces its deprecation in favour of the exporter that needs onnxscript,
        # and flags torch.as_tensor in tokens_to_actions, an identity on a tensor.
        for category in (DeprecationWarning, FutureWarning, UserWarning, torch.jit.TracerWarning):
            warnings.simplefilter("ignore", category)
        try:
            torch.onnx.export(module, example, buffer, dynamo=False, opset_version=OPSET,
                              input_names=list(keys), output_names=list(outputs),
                              dynamic_axes={name: {0: "batch"} for name in (*keys, *outputs)})
        except RuntimeError as error:  # torch.onnx's errors, SymbolicValueError included
            raise ValueError(f"torch.onnx.export cannot export this {kind} policy: "
                             f"{error}") from error
    return buffer.getvalue()


def compare_with_torch(model: bytes, policy: Policy,
                       observations: Sequence[Mapping[str, np.ndarray]]) -> dict[str, Any]:
    """Run the exported graph and the torch policy's own greedy graph
    (:meth:`harness.policies.Policy.export_graph`) on the same observations, as one batch.

    Args:
        model: The ONNX model bytes.
        policy: The torch policy it was exported from.
        observations: Raw observation dicts from the env.

    Returns:
        ``observations`` (the count), ``max_abs_logit_diff``, and ``token_mismatches`` and
        ``action_mismatches``: greedy tokens, and their actions, that differ from the torch
        policy's, over all dimensions. With a continuous head (no logits): ``observations``
        and ``max_abs_action_diff``, the largest absolute difference from the torch policy's
        greedy actions.
    """
    policy = copy.deepcopy(policy).cpu().eval()
    keys = input_keys(policy)
    batch = obs_to_batch(list(observations))
    outputs = policy.export_record()["outputs"]
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    got = dict(zip(outputs, session.run(list(outputs), {key: batch[key].numpy() for key in keys}),
                   strict=True))
    with torch.no_grad():
        expected = policy.export_graph(keys)(*(batch[key] for key in keys))
    expected = {name: value.numpy().reshape(got[name].shape)
                for name, value in zip(outputs, expected, strict=True)}
    if "logits" not in got:
        difference = np.abs(got["actions"] - expected["actions"])
        return {"observations": len(observations), "max_abs_action_diff": float(difference.max())}
    return {"observations": len(observations),
            "max_abs_logit_diff": float(np.abs(got["logits"] - expected["logits"]).max()),
            "token_mismatches": int((got["tokens"] != expected["tokens"]).sum()),
            "action_mismatches": int((got["actions"] != expected["actions"]).sum())}


def sample_observations(env, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``count`` observations of real env steps under seeded uniform random actions (resets
    included), for the export's parity check."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    observations = [obs]
    while len(observations) < count:
        obs, _, terminated, truncated, _ = env.step(
            rng.uniform(-1.0, 1.0, env.action_space.shape).astype(np.float32))
        if terminated or truncated:
            obs, _ = env.reset()
        observations.append(obs)
    return observations
