"""Run an exported token policy in the simulator through onnxruntime alone, without torch.

An exported policy (``scripts/export_policy.py``, :mod:`harness.export`) is one ONNX graph from
the raw observation arrays the env returns, each with a leading batch axis, to ``logits``
``(B, action_dim, num_bins)``, the greedy ``tokens`` ``(B, action_dim)`` and their bin-centre
``actions``; the preprocessing is inside the graph. Its ``metadata_props`` hold, under
:data:`METADATA_KEY`, a JSON record of what deploying it needs: the task and its options, the
graph inputs with their shapes and dtypes, ``num_bins``, ``action_dim`` and the bin-centre rule,
the source checkpoint's SHA-256 and the export date.

Nothing here imports torch (``tests/test_export.py`` checks it on ``scripts/deploy_policy.py``),
so this is the whole inference side a robot computer needs besides ``tasks`` for simulation.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime as ort

import tasks
from harness.evaluation import EvaluationResult, evaluate

METADATA_KEY = "vla_rl_harness"
EXPORT_FORMAT = 1
OUTPUTS = ("logits", "tokens", "actions")
BIN_CENTRES_RULE = "action = -1 + 2 * token / (num_bins - 1)"


def observation_dtype(key: str) -> str:
    """The dtype of observation ``key`` as the env returns it and the graph takes it: ``pixels``
    uint8, ``instruction`` int64, the rest float32 (``harness.policies.obs_to_batch``'s rule)."""
    return {"pixels": "uint8", "instruction": "int64"}.get(key, "float32")


class ExportedPolicy:
    """An exported token policy in an onnxruntime session: task observation dict -> greedy
    action, timing every call.

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
            self.inputs = {entry["name"]: (tuple(entry["shape"]), np.dtype(entry["dtype"]))
                           for entry in self.info["inputs"]}
            self.action_dim = int(self.info["action_dim"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}: its {METADATA_KEY!r} metadata is damaged: "
                             f"{error!r}") from None
        if self.info.get("format") != EXPORT_FORMAT:
            raise ValueError(f"{path} holds an export of format {self.info.get('format')!r}; this "
                             f"version reads format {EXPORT_FORMAT}")
        self.path = path
        self.inference_seconds: list[float] = []
        if warm_up:
            self.session.run(["actions"], {name: np.zeros((1, *shape), dtype)
                                           for name, (shape, dtype) in self.inputs.items()})

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
        """The greedy action ``(action_dim,)`` float32 for one raw observation dict."""
        start = time.perf_counter()
        feeds = {name: np.asarray(obs[name], dtype)[None] for name, (_, dtype) in
                 self.inputs.items()}
        (actions,) = self.session.run(["actions"], feeds)
        self.inference_seconds.append(time.perf_counter() - start)
        return actions[0]


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
        inference_s: Policy time per control step: observation dict in, action out.
        step_s: Full control step: the policy, then ``env.step`` (physics and camera).
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
    result = evaluate(policy, lambda: env, episodes, list(difficulties), seed)
    inference = list(policy.inference_seconds)
    return DeployResult(result, task, options, config.timestep * config.substeps, inference,
                        [a + b for a, b in zip(inference, env.step_seconds, strict=True)])
