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

Nothing here imports torch (``tests/test_export.py`` checks it on ``scripts/deploy_policy.py``),
so this is the whole inference side a robot computer needs besides ``tasks`` for simulation.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np
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
_ORT_TYPES = {"tensor(float)": "float32", "tensor(uint8)": "uint8", "tensor(int64)": "int64"}


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
    difficulties = evaluation.get("difficulties")
    if difficulties is not None and not (isinstance(difficulties, list) and difficulties and all(
            isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= 1
            for d in difficulties)):
        refuse("evaluation.difficulties", difficulties, "a list of numbers in [0, 1]")


def check_graph(session: ort.InferenceSession, inputs: dict[str, tuple[tuple[int, ...], Any]],
                action_dim: int, path: Path, chunk_size: int = 1) -> None:
    """Refuse a graph whose inputs or ``actions`` output differ from its deploy record
    (``actions`` ``(B, action_dim)``, or ``(B, chunk_size, action_dim)`` for a chunk).

    Raises:
        ValueError: Naming the file and both descriptions.
    """
    graph = {node.name: (tuple(node.shape[1:]), _ORT_TYPES.get(node.type, node.type))
             for node in session.get_inputs()}
    declared = {name: (shape, str(dtype)) for name, (shape, dtype) in inputs.items()}
    actions = [node.shape for node in session.get_outputs() if node.name == "actions"]
    expected = [action_dim] if chunk_size == 1 else [chunk_size, action_dim]
    if graph != declared or not actions or actions[0][1:] != expected:
        raise ValueError(f"{path}: the graph takes {graph} and gives actions "
                         f"{actions[0][1:] if actions else None}, but its {METADATA_KEY!r} "
                         f"metadata declares {declared}, action_dim={action_dim} and "
                         f"chunk_size={chunk_size}")


class ExportedPolicy:
    """An exported policy in an onnxruntime session: task observation dict -> greedy action (or
    the ``execute_steps`` actions of a chunk), timing every call. Its :attr:`action_head` says
    what the graph decodes: ``tokens`` (bin centres of the greedy tokens), ``gaussian`` (the
    squashed mean) or ``flow`` (the noiseless Euler steps from zero); all give ``actions``.

    Args:
        path: The ``.onnx`` file.
        threads: onnxruntime intra-op threads; 1 models one core of a robot computer.
        warm_up: Run the graph once on zeros, so that the first timed call is not the one that
            allocates.

    Raises:
        FileNotFoundError: No file at ``path``.
        ValueError: Not an ONNX model onnxruntime can load, or not one written by
            ``scripts/export_policy.py`` (no deploy record in its metadata).
    """

    def __init__(self, path: str | os.PathLike, threads: int = 1, warm_up: bool = True) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no exported policy at {path}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self.session = ort.InferenceSession(str(path), options,
                                                providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime raises its own pybind types for a bad file
            raise ValueError(f"{path} is not an ONNX model onnxruntime can load: {error}") from None
        record = self.session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
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
        check_graph(self.session, self.inputs, self.action_dim, path, self.chunk_size)
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

    result = evaluate(decide, lambda: env, episodes, list(difficulties), seed)
    inference = list(policy.inference_seconds)
    step_s = list(env.step_seconds)
    for step, seconds in zip(decided_at, inference, strict=True):
        step_s[step] = seconds + step_s[step]
    return DeployResult(result, task, options, config.timestep * config.substeps, inference,
                        step_s)
