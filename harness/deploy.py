"""Run an exported policy in the simulator through onnxruntime alone, without torch.

An exported policy (``scripts/export_policy.py``, :mod:`harness.export`) is one ONNX graph from
the raw observation arrays the env returns, each with a leading batch axis, to greedy
``actions``; the preprocessing is inside the graph. A token policy's graph also gives its
``logits`` ``(B, action_dim, num_bins)`` and greedy ``tokens`` ``(B, action_dim)``, whose bin
centres are the actions; a continuous head's (``gaussian``, ``flow``) gives the actions alone,
its deterministic decode. Its ``metadata_props`` hold, under :data:`METADATA_KEY`, a JSON record
of what deploying it needs: the task and its options, the graph inputs with their shapes and
dtypes, the ``action_head`` (files from before heads hold tokens), ``action_dim``, ``num_bins``
and the bin-centre rule of tokens, the source checkpoint's SHA-256 and the export date. A policy
with action chunks declares ``chunk_size`` (its ``actions`` are ``(B, chunk_size,
action_dim)``) and ``execute_steps``: each decision plays that many actions before the graph
sees the next observation.

Before its first decision a file must meet :class:`DeployLimits` (sizes, operators, constants,
and a trial warm-up decision bounded in memory and time in a process of its own), so that a
crafted file is refused by name instead of allocating gigabytes or hanging.

Nothing here imports torch (``tests/test_export.py`` checks it on ``scripts/deploy_policy.py``),
so this is the whole inference side a robot computer needs besides ``tasks`` for simulation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import gymnasium as gym
import numpy as np
import onnx
import onnxruntime as ort

import tasks
from harness.evaluation import EvaluationResult, evaluate

METADATA_KEY = "vla_rl_harness"
EXPORT_FORMAT = 1
OUTPUTS = ("logits", "tokens", "actions")  # of a token policy's graph
CONTINUOUS_OUTPUTS = ("actions",)  # of a continuous head's graph
ACTION_HEADS = ("tokens", "gaussian", "flow")  # the built-in heads (harness.policies.heads)
BIN_CENTRES_RULE = "action = -1 + 2 * token / (num_bins - 1)"


def observation_dtype(key: str) -> str:
    """The dtype of observation ``key`` as the env returns it and the graph takes it: ``pixels``
    uint8, ``instruction`` int64, the rest float32 (``harness.policies.obs_to_batch``'s rule)."""
    return {"pixels": "uint8", "instruction": "int64"}.get(key, "float32")


# Bounds of a deploy record (:func:`check_record`): far above any exported policy, low enough
# that a crafted record cannot make the deploy side allocate gigabytes or play for hours.
MAX_INPUT_ELEMENTS = 2**22  # per observation: 480 x 480 x 3 pixels is 691,200
MAX_EPISODE_STEPS = 10_000  # the tasks' own horizons are 50 to 100 control steps
MAX_ACTION_DIM, MAX_BINS = 64, 65536
OBSERVATION_KEYS = ("pixels", "proprio", "state", "instruction")


@dataclass(frozen=True)
class DeployLimits:
    """Bounds an exported file must meet before its first decision (:class:`ExportedPolicy`):
    far above what ``scripts/export_policy.py`` writes, low enough that a crafted file cannot
    make the deploy side allocate gigabytes or hang.

    Attributes:
        model_bytes: The largest model file (exported policies are 10 KiB to a few MiB).
        record_bytes: The largest metadata (every ``metadata_props`` entry, the deploy record
            among them, and the model's descriptions, in all), read from the file's bytes
            before anything parses them (a record is a few KiB).
        tensor_elements: The largest constant tensor (a weight, a ``Constant``) and the largest
            tensor a ``ConstantOfShape`` or ``Range`` of constant sizes makes.
        warm_up_bytes: The address space of the process that makes the trial warm-up decision
            (:func:`trial_decision`), interpreter and onnxruntime (about 200 MB) included.
        warm_up_seconds: The wall-clock time of that process, its start included.
    """

    model_bytes: int = 256 * 2**20
    record_bytes: int = 2**20
    tensor_elements: int = 2**24
    warm_up_bytes: int = 2**30
    warm_up_seconds: float = 60.0


# The operators the exporter emits (harness.export on the mlp and tiny_vla networks, every
# head, chunks, keypoints, average pooling, residuals): a graph with any other, Loop, Scan, If,
# Expand, Tile and Resize among them, is refused. Each input below sets a size or a shape
# (Reshape's target, Slice's bounds, ConstantOfShape's shape, Range's bounds, the axes of
# Unsqueeze and ReduceSum) and must be computed from constants and input shapes alone, never
# from observation values: then every decision allocates what the trial warm-up decision does,
# and bounding that one bounds them all.
GRAPH_OPS = ("Add", "ArgMax", "Cast", "Clip", "Concat", "Constant", "ConstantOfShape", "Conv",
             "Cos", "Div", "Einsum", "Equal", "Exp", "Flatten", "Gather", "Gemm", "MatMul",
             "Mul", "Not", "Range", "ReduceSum", "Relu", "Reshape", "Shape", "Sigmoid", "Sin",
             "Slice", "Softmax", "Sub", "Tanh", "Transpose", "Unsqueeze")
SIZE_INPUTS = {"Reshape": (1,), "Slice": (1, 2, 3, 4), "ConstantOfShape": (0,),
               "Range": (0, 1, 2), "Unsqueeze": (1,), "ReduceSum": (1,)}
# Fields of onnx.proto's ModelProto that only describe the model: producer_name, _version,
# domain, doc_string, metadata_props.
_DESCRIPTION_FIELDS = {2: "producer_name", 3: "producer_version", 4: "domain", 6: "doc_string",
                       14: "metadata_props"}


def check_record(info: dict[str, Any], path: Path) -> None:
    """Check a deploy record field by field against its schema, with bounds.

    Args:
        info: The record (JSON of the model's :data:`METADATA_KEY` metadata).
        path: The model file, for messages.

    Raises:
        ValueError: Naming the file, the field, its value and what was expected.
    """
    def refuse(field: str, value: Any, expected: str) -> NoReturn:
        raise ValueError(f"{path}: its {METADATA_KEY!r} metadata has {field}={value!r}; "
                         f"expected {expected}")

    def integer(value: Any, low: int, high: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

    if info.get("task") not in tasks.TASKS:
        refuse("task", info.get("task"), f"one of {sorted(tasks.TASKS)}")
    options = info.get("task_options")
    if not isinstance(options, dict):
        refuse("task_options", options, "an object of task options")
    if "max_episode_steps" in options and not integer(options["max_episode_steps"], 1,
                                                      MAX_EPISODE_STEPS):
        refuse("task_options.max_episode_steps", options["max_episode_steps"],
               f"an integer in [1, {MAX_EPISODE_STEPS}]")
    policy_config = info.get("policy")
    if not isinstance(policy_config, dict) or not isinstance(policy_config.get("kind"), str):
        refuse("policy", policy_config, "the policy config, with its kind")
    if not isinstance(info.get("exported_at"), str):
        refuse("exported_at", info.get("exported_at"), "the export date")
    if not integer(info.get("action_dim"), 1, MAX_ACTION_DIM):
        refuse("action_dim", info.get("action_dim"), f"an integer in [1, {MAX_ACTION_DIM}]")
    head = info.get("action_head", "tokens")  # exports from before heads are token policies
    if not (isinstance(head, str) and head.isidentifier()):
        refuse("action_head", head, f"a head's name, such as one of {ACTION_HEADS}")
    if head == "tokens" and not integer(info.get("num_bins"), 2, MAX_BINS):
        refuse("num_bins", info.get("num_bins"), f"an integer in [2, {MAX_BINS}]")
    chunk = info.get("chunk_size", 1)  # exports from before action chunks hold one action
    if not integer(chunk, 1, MAX_EPISODE_STEPS):
        refuse("chunk_size", chunk, f"an integer in [1, {MAX_EPISODE_STEPS}]")
    if not integer(info.get("execute_steps", chunk), 1, chunk):
        refuse("execute_steps", info.get("execute_steps"), f"an integer in [1, chunk_size={chunk}]")
    entries = info.get("inputs")
    if not isinstance(entries, list) or not entries:
        refuse("inputs", entries, "a list of {name, shape, dtype}")
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if name not in OBSERVATION_KEYS or [e.get("name") for e in entries].count(name) > 1:
            refuse(f"inputs[{i}].name", name, f"one of {OBSERVATION_KEYS}, once each")
        if not isinstance(shape, list) or not 1 <= len(shape) <= 3 \
                or not all(integer(side, 1, MAX_INPUT_ELEMENTS) for side in shape) \
                or np.prod(shape, dtype=float) > MAX_INPUT_ELEMENTS:
            refuse(f"inputs[{i}].shape", shape, f"1 to 3 sides of at most {MAX_INPUT_ELEMENTS} "
                   "elements in all")
        if entry.get("dtype") != observation_dtype(name):
            refuse(f"inputs[{i}].dtype", entry.get("dtype"), repr(observation_dtype(name)))
    evaluation = info.get("evaluation") or {}
    if not isinstance(evaluation, dict):
        refuse("evaluation", evaluation, "an object with seed and difficulties")
    if "seed" in evaluation and not integer(evaluation["seed"], 0, 2**63 - 1):
        refuse("evaluation.seed", evaluation["seed"], "an integer >= 0")
    horizon = evaluation.get("max_episode_steps")
    if horizon is not None and not integer(horizon, 1, MAX_EPISODE_STEPS):
        refuse("evaluation.max_episode_steps", horizon,
               f"an integer in [1, {MAX_EPISODE_STEPS}], or null")
    difficulties = evaluation.get("difficulties")
    if difficulties is not None and not (isinstance(difficulties, list) and difficulties and all(
            isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= 1
            for d in difficulties)):
        refuse("evaluation.difficulties", difficulties, "a list of numbers in [0, 1]")


def _varint(file: BinaryIO) -> int:
    """The protobuf varint at ``file``'s position."""
    value = 0
    for shift in range(0, 70, 7):
        byte = file.read(1)
        if not byte:
            raise ValueError("the file ends inside a field")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
    raise ValueError("a varint longer than 10 bytes")


def description_bytes(file: BinaryIO, size: int) -> dict[str, int]:
    """Bytes of each describing field of a serialised ONNX ``ModelProto`` (metadata, doc
    string, producer), found by walking its top-level protobuf fields and seeking past their
    contents: nothing is parsed or held, however large a field is.

    Args:
        file: The model file, at its start.
        size: Its size in bytes.

    Returns:
        Field name -> bytes, for the fields present (``metadata_props``: all entries).

    Raises:
        ValueError: Not a protobuf message (a field past the end, an unknown wire type).
    """
    found: dict[str, int] = {}
    while file.tell() < size:
        tag = _varint(file)
        number, wire = tag >> 3, tag & 7
        if number == 0 or wire not in (0, 1, 2, 5):
            raise ValueError(f"field {number} of wire type {wire} at byte {file.tell()}")
        if wire == 0:
            _varint(file)
            continue
        length = {1: 8, 5: 4}.get(wire) or _varint(file)
        if file.tell() + length > size:
            raise ValueError(f"field {number} of {length} bytes runs past the end")
        if wire == 2 and number in _DESCRIPTION_FIELDS:
            name = _DESCRIPTION_FIELDS[number]
            found[name] = found.get(name, 0) + length
        file.seek(length, os.SEEK_CUR)
    return found


def check_ops(model: onnx.ModelProto, path: Path, limits: DeployLimits) -> None:
    """Refuse a graph that could allocate without bound or loop: operators other than
    :data:`GRAPH_OPS` (of the default domain, no functions), constant tensors over
    ``limits.tensor_elements``, and sizes (:data:`SIZE_INPUTS`) computed from observation
    values or, when constant, over that bound.

    Raises:
        ValueError: Naming the file, the node and its operator, and the rule or limit.
    """
    graph = model.graph
    if model.functions or graph.sparse_initializer:
        raise ValueError(f"{path}: the graph has model functions or sparse initializers; the "
                         "exporter writes neither")
    constants: dict[str, np.ndarray] = {}
    for tensor in graph.initializer:
        elements = int(np.prod(tensor.dims, dtype=float))
        if elements > limits.tensor_elements:
            raise ValueError(f"{path}: its initializer {tensor.name!r} has {elements:,} elements;"
                             f" the limit is tensor_elements={limits.tensor_elements:,}")
        constants[tensor.name] = tensor
    from_values = {entry.name for entry in graph.input} - set(constants)
    known = from_values | set(constants) | {""}  # "": an optional input left out
    for node in graph.node:
        where = f"{path}: node {node.name!r} ({node.op_type})"
        if node.domain not in ("", "ai.onnx") or node.op_type not in GRAPH_OPS:
            raise ValueError(f"{where} of domain {node.domain or 'ai.onnx'!r} is not an "
                             f"operator the exporter emits; allowed: {', '.join(GRAPH_OPS)}")
        # In order, each name made once (ONNX's rule): the walk below then sees every source.
        if not set(node.input) <= known or set(node.output) & known:
            raise ValueError(f"{where} reads a tensor not made before it or remakes one: "
                             "the nodes are not in topological order")
        known.update(node.output)
        if node.op_type == "Constant":
            kinds = sorted(a.name for a in node.attribute)
            if not set(kinds) <= {"value", "value_int", "value_ints", "value_float",
                                  "value_floats"}:
                raise ValueError(f"{where} holds {kinds}; the exporter writes dense values only")
            elements = max((int(np.prod(a.t.dims, dtype=float)) if a.name == "value"
                            else len(a.ints) + len(a.floats) for a in node.attribute), default=0)
            if elements > limits.tensor_elements:
                raise ValueError(f"{where} has {elements:,} elements; the limit is "
                                 f"tensor_elements={limits.tensor_elements:,}")
            if kinds == ["value"]:
                constants[node.output[0]] = node.attribute[0].t
        for index in SIZE_INPUTS.get(node.op_type, ()):
            name = node.input[index] if index < len(node.input) else ""
            if name in from_values:
                raise ValueError(f"{where}: its input {index} ({name!r}), which sets a size or a "
                                 "shape, is computed from observation values; sizes must come "
                                 "from constants and input shapes alone")
        if node.op_type in ("ConstantOfShape", "Range") and all(
                name in constants for name in node.input):
            literal = [onnx.numpy_helper.to_array(constants[name]) for name in node.input]
            made = (np.prod(literal[0], dtype=float) if node.op_type == "ConstantOfShape"
                    else np.ceil((literal[1] - literal[0]) / literal[2]))
            if made > limits.tensor_elements:
                raise ValueError(f"{where} makes a tensor of {made:,.0f} elements; the limit is "
                                 f"tensor_elements={limits.tensor_elements:,}")
        if node.op_type != "Shape" and any(name in from_values for name in node.input):
            from_values.update(node.output)


def _static_shape(value: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    """A graph input's or output's shape after the batch axis, each side a number or a name."""
    dims = value.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims[1:])


def check_graph(graph: onnx.GraphProto, inputs: dict[str, tuple[tuple[int, ...], Any]],
                info: dict[str, Any], path: Path) -> None:
    """Refuse a graph whose inputs or outputs differ from its deploy record: ``actions``
    ``(B, action_dim)``, or ``(B, chunk_size, action_dim)`` for a chunk; for tokens also
    ``logits`` ``(B, chunk_size * action_dim, num_bins)`` and ``tokens`` ``(B, chunk_size *
    action_dim)``, when the graph gives them. An output side the graph leaves named must be
    the record's in the trial decision (:func:`trial_decision`).

    Raises:
        ValueError: Naming the file and both descriptions.
    """
    constants = {tensor.name for tensor in graph.initializer}
    taken = {value.name: (_static_shape(value), str(onnx.helper.tensor_dtype_to_np_dtype(
        value.type.tensor_type.elem_type))) for value in graph.input if value.name not in constants}
    declared = {name: (shape, str(dtype)) for name, (shape, dtype) in inputs.items()}
    outputs = {value.name: _static_shape(value) for value in graph.output}
    action_dim, chunk_size = info["action_dim"], info.get("chunk_size", 1)
    expected = {"actions": (action_dim,) if chunk_size == 1 else (chunk_size, action_dim)}
    if info.get("action_head", "tokens") == "tokens":
        expected |= {"logits": (chunk_size * action_dim, info["num_bins"]),
                     "tokens": (chunk_size * action_dim,)}
    # A side the tracer left named (a chunk's reshape) is checked on the trial decision's
    # actions (trial_decision); a numbered one must be the record's.
    wrong = {name: shape for name, shape in outputs.items() if name in expected and (
        len(shape) != len(expected[name]) or any(
            isinstance(side, int) and side != want
            for side, want in zip(shape, expected[name], strict=True)))}
    if taken != declared or "actions" not in outputs or wrong:
        raise ValueError(f"{path}: the graph takes {taken} and gives {outputs}, but its "
                         f"{METADATA_KEY!r} metadata declares {declared}, action_dim="
                         f"{action_dim} and chunk_size={chunk_size} (outputs {expected})")


TRIAL_SCRIPT = Path(__file__).with_name("deploy_trial.py")


def trial_decision(model: bytes, inputs: list[dict[str, Any]], actions: tuple[int, ...],
                   path: Path, limits: DeployLimits) -> float:
    """Make the warm-up decision (zero observations of ``inputs``, batch 1) in a process of its
    own (:mod:`harness.deploy_trial`), its address space capped at ``limits.warm_up_bytes`` and
    killed after ``limits.warm_up_seconds``; its ``actions`` must have the shape ``(1,
    *actions)``.

    Returns:
        The decision's seconds in that process.

    Raises:
        ValueError: It ran out of time, failed (an allocation past the bound, a graph that
            fails on zeros) or gave actions of another shape, naming the file and the limit.
    """
    command = [sys.executable, "-I", str(TRIAL_SCRIPT), str(limits.warm_up_bytes),
               json.dumps(inputs)]
    try:
        done = subprocess.run(command, input=model, capture_output=True,
                              timeout=limits.warm_up_seconds)
    except subprocess.TimeoutExpired:
        raise ValueError(f"{path}: the warm-up decision did not finish within warm_up_seconds="
                         f"{limits.warm_up_seconds:g}") from None
    if done.returncode != 0:
        error = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise ValueError(f"{path}: the warm-up decision on zero observations of its declared "
                         f"inputs {inputs} failed within warm_up_bytes={limits.warm_up_bytes:,} "
                         f"of address space (exit status {done.returncode}): {error}")
    trial = json.loads(done.stdout.decode().strip().splitlines()[-1])
    if tuple(trial["actions_shape"]) != (1, *actions):
        raise ValueError(f"{path}: the warm-up decision gives actions of shape "
                         f"{tuple(trial['actions_shape'])}; its {METADATA_KEY!r} metadata "
                         f"declares {(1, *actions)} (action_dim={actions[-1]}"
                         + (f", chunk_size={actions[0]})" if len(actions) > 1 else ")"))
    return float(trial["decision_s"])


def read_model(path: Path, limits: DeployLimits) -> tuple[bytes, onnx.ModelProto]:
    """The bytes and the parsed model of ``path``, its size and its metadata's size checked
    before either is parsed.

    Raises:
        ValueError: A file or metadata over the limits, or no ONNX model, naming the file.
    """
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size > limits.model_bytes:
            raise ValueError(f"{path} is {size:,} bytes; the limit is model_bytes="
                             f"{limits.model_bytes:,}")
        try:
            described = description_bytes(file, size)
        except ValueError as error:
            raise ValueError(f"{path} is not an ONNX model onnxruntime can load: {error}") from None
        if sum(described.values()) > limits.record_bytes:
            raise ValueError(f"{path}: its metadata and descriptions are {described} bytes, "
                             f"{sum(described.values()):,} in all; the limit is record_bytes="
                             f"{limits.record_bytes:,}")
        file.seek(0)
        data = file.read(size)
    try:
        return data, onnx.load_from_string(data)
    except Exception as error:  # protobuf's DecodeError and onnx's own
        raise ValueError(f"{path} is not an ONNX model onnxruntime can load: {error}") from None


class ExportedPolicy:
    """An exported policy in an onnxruntime session: task observation dict -> greedy action (or
    the ``execute_steps`` actions of a chunk), timing every call. Its :attr:`action_head` says
    what the graph decodes: ``tokens`` (bin centres of the greedy tokens), ``gaussian`` (the
    squashed mean) or ``flow`` (the noiseless Euler steps from zero); all give ``actions``.

    Args:
        path: The ``.onnx`` file.
        threads: onnxruntime intra-op threads; 1 models one core of a robot computer.
        warm_up: Run the graph once on zeros here too, so that the first timed call is not the
            one that allocates.
        limits: The bounds the file must meet before this process loads its graph: file and
            metadata sizes, operators and constants (:func:`check_ops`), and the memory and
            time of a trial warm-up decision in a process of its own (:func:`trial_decision`).

    Raises:
        FileNotFoundError: No file at ``path``.
        ValueError: Not an ONNX model onnxruntime can load, not one written by
            ``scripts/export_policy.py`` (no deploy record in its metadata), a record or graph
            that differ, or a file over ``limits``; naming the file, the field or node, and the
            limit.
    """

    def __init__(self, path: str | os.PathLike, threads: int = 1, warm_up: bool = True,
                 limits: DeployLimits = DeployLimits()) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no exported policy at {path}")
        data, model = read_model(path, limits)
        record = {entry.key: entry.value for entry in model.metadata_props}.get(METADATA_KEY)
        if record is None:
            raise ValueError(f"{path} has no {METADATA_KEY!r} metadata: it was not written by "
                             "scripts/export_policy.py, so its task and inputs are unknown")
        try:
            self.info: dict[str, Any] = json.loads(record)
        except ValueError as error:
            raise ValueError(f"{path}: its {METADATA_KEY!r} metadata is not JSON: "
                             f"{error}") from None
        if not isinstance(self.info, dict) or self.info.get("format") != EXPORT_FORMAT:
            found = self.info.get("format") if isinstance(self.info, dict) else self.info
            raise ValueError(f"{path} holds an export of format {found!r}; this version reads "
                             f"format {EXPORT_FORMAT}")
        check_record(self.info, path)
        self.inputs = {entry["name"]: (tuple(entry["shape"]), np.dtype(entry["dtype"]))
                       for entry in self.info["inputs"]}
        self.action_dim = self.info["action_dim"]
        self.action_head: str = self.info.get("action_head", "tokens")
        self.chunk_size = self.info.get("chunk_size", 1)
        self.execute_steps = self.info.get("execute_steps", self.chunk_size)
        check_graph(model.graph, self.inputs, self.info, path)
        check_ops(model, path, limits)
        # Bounded in a process of its own before this one allocates anything for the graph
        # (onnxruntime folds constants when it loads a model): every later decision allocates
        # what this one does (GRAPH_OPS).
        played = (self.action_dim,) if self.chunk_size == 1 else (self.chunk_size,
                                                                     self.action_dim)
        trial_decision(data, self.info["inputs"], played, path, limits)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self.session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime raises its own pybind types for a bad file
            raise ValueError(f"{path} is not an ONNX model onnxruntime can load: {error}") from None
        self.path = path
        self.inference_seconds: list[float] = []
        if warm_up:
            try:
                self.session.run(["actions"], {name: np.zeros((1, *shape), dtype)
                                               for name, (shape, dtype) in self.inputs.items()})
            except Exception as error:  # onnxruntime's own pybind error types
                raise ValueError(f"{path}: the graph fails on zero observations of its declared "
                                 f"inputs {self.info['inputs']}: {error}") from None

    def check_observation_space(self, space: gym.Space, where: str) -> None:
        """Refuse observations the graph was not exported for.

        Args:
            space: The env's observation space.
            where: The env, in words, for the message (task name and options).

        Raises:
            ValueError: A graph input the observation lacks, or of another shape or dtype.
        """
        keys = sorted(space.spaces) if isinstance(space, gym.spaces.Dict) else []
        for name, (shape, dtype) in self.inputs.items():
            got = space.spaces[name] if name in keys else None
            if got is None or tuple(got.shape) != shape or np.dtype(got.dtype) != dtype:
                found = (f"{tuple(got.shape)} {np.dtype(got.dtype)}" if got is not None
                         else f"nothing (its keys are {keys})")
                raise ValueError(
                    f"{self.path.name} takes observation {name!r} of shape {shape} {dtype}, but "
                    f"{where} gives {found}; it was exported for task {self.info['task']!r} with "
                    f"options {self.info['task_options']}")

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """The greedy action ``(action_dim,)`` float32 for one raw observation dict; with
        action chunks, the chunk's first ``execute_steps`` actions ``(k, action_dim)``."""
        start = time.perf_counter()
        feeds = {name: np.asarray(obs[name], dtype)[None] for name, (_, dtype) in
                 self.inputs.items()}
        (actions,) = self.session.run(["actions"], feeds)
        self.inference_seconds.append(time.perf_counter() - start)
        return actions[0] if self.chunk_size == 1 else actions[0, :self.execute_steps]


class _TimedEnv(gym.Wrapper):
    """Times every ``step`` (physics and camera), the env's part of a control step."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.step_seconds: list[float] = []

    def step(self, action):
        start = time.perf_counter()
        out = self.env.step(action)
        self.step_seconds.append(time.perf_counter() - start)
        return out


def latency_ms(seconds: list[float]) -> dict[str, float]:
    """p50, p99, mean and max of durations in seconds, in milliseconds."""
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
            "mean": float(ms.mean()), "max": float(ms.max())}


@dataclass
class DeployResult:
    """Outcomes of a deployment run and its per-control-step timings.

    Attributes:
        evaluation: Episodes, success rate and its interval.
        task: The task played.
        task_options: The options it was built with.
        control_period_s: Simulated seconds per control step (``timestep * substeps``).
        inference_s: Policy time per decision: observation dict in, action (or chunk) out;
            one per control step without action chunks.
        step_s: Full control step: ``env.step`` (physics and camera), after the policy's
            time when a decision was taken at that step.
    """

    evaluation: EvaluationResult
    task: str
    task_options: dict[str, Any]
    control_period_s: float
    inference_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """JSON-able summary: the evaluation's, plus latencies in milliseconds."""
        return {"task": self.task, "task_options": self.task_options,
                **self.evaluation.summary(), "control_period_ms": self.control_period_s * 1e3,
                "inference_ms": latency_ms(self.inference_s), "step_ms": latency_ms(self.step_s)}


def deploy(
    policy: ExportedPolicy,
    episodes: int,
    task: str | None = None,
    task_options: dict[str, Any] | None = None,
    difficulties: list[float] | None = None,
    seed: int | None = None,
) -> DeployResult:
    """Play ``episodes`` greedy episodes per difficulty with an exported policy.

    Args:
        policy: The exported policy.
        episodes: Episodes per difficulty.
        task: Defaults to the task it was exported for.
        task_options: Overrides of the exported task options (e.g. ``max_episode_steps``).
        difficulties: Default: the training run's evaluation difficulties.
        seed: First episode seed; default: the training run's test seed, so that the figures
            match ``scripts/evaluate.py`` on the source checkpoint.

    Raises:
        ValueError: An unknown task or option, or observations the graph does not take.
    """
    info = policy.info
    task = task or info["task"]
    options = {**info["task_options"], **(task_options or {})}
    env = _TimedEnv(tasks.make(task, **options))
    try:
        where = f"task {task!r}" + (f" with overrides {task_options}" if task_options else "")
        policy.check_observation_space(env.observation_space, where)
    except ValueError:
        env.close()
        raise
    evaluation = info.get("evaluation") or {}
    if difficulties is None:
        difficulties = evaluation.get("difficulties") or [options.get("difficulty", 1.0)]
    seed = int(evaluation.get("seed", 1_000_000)) if seed is None else seed
    config = env.unwrapped.config
    policy.inference_seconds.clear()
    decided_at: list[int] = []  # the control step at which each decision was taken

    def decide(obs: dict[str, np.ndarray]) -> np.ndarray:
        decided_at.append(len(env.step_seconds))
        return policy(obs)

    # The run's evaluation horizon (eval.max_episode_steps), as scripts/evaluate.py plays it,
    # unless the caller sets the env's own.
    max_episode_steps = (None if "max_episode_steps" in (task_options or {})
                         else evaluation.get("max_episode_steps"))
    result = evaluate(decide, lambda: env, episodes, list(difficulties), seed, 0,
                      max_episode_steps)
    inference = list(policy.inference_seconds)
    step_s = list(env.step_seconds)
    for step, seconds in zip(decided_at, inference, strict=True):
        step_s[step] = seconds + step_s[step]
    return DeployResult(result, task, options, config.timestep * config.substeps, inference,
                        step_s)
