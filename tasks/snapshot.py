"""Exact snapshots of a task environment.

A :class:`Snapshot` is a frozen, picklable value. Restoring it and replaying the same actions gives
bit-identical observations (pixels included) and rewards, in this process or in another one that
received the pickle. ``mj_setState`` alone is not enough for that: derived quantities must be
recomputed with ``mj_forward``, and ``mj_forward`` overwrites the solver's warm-start, so the state
is set a second time after it (:func:`set_physics_state`).

**Trust.** Pickle is for passing snapshots between the harness's own processes only: unpickling
a file runs whatever code it holds. On disk, snapshots go through :func:`save_snapshot` /
:func:`load_snapshot`: plain arrays in an ``.npz`` read with ``allow_pickle=False`` plus a JSON
record, with a SHA-256 of the content that a changed byte breaks. Every restore checks the
snapshot's fields (:func:`check_snapshot`) before it writes anything into the simulator.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

STATE_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION


@dataclass(frozen=True)
class Snapshot:
    """Everything needed to put an environment back exactly where it was.

    Attributes:
        task: The task name, e.g. ``"push"``.
        model_signature: Hash of the compiled model's structure and physics options.
        randomization_signature: Hash of the model parameters that domain randomisation changes.
        randomization: The randomised parameter values, so ``reset(options={"snapshot": s})`` can
            re-apply them in a fresh environment before restoring.
        physics: ``mj_getState(mjSTATE_INTEGRATION)`` as float64 bytes: qpos, qvel, act,
            warm-start, ctrl, mocap, time, equality activation, user data.
        task_state: The task's own state (goal, instruction, step count, difficulty, ...).
        rng_state: The state of the environment's ``np_random`` bit generator.
    """

    task: str
    model_signature: str
    randomization_signature: str
    physics: bytes
    task_state: dict[str, Any] = field(hash=False)
    rng_state: dict[str, Any] = field(hash=False)
    randomization: dict[str, Any] = field(hash=False, default_factory=dict)

    @property
    def time(self) -> float:
        """Simulation time at the snapshot (the state's first entry)."""
        return float(np.frombuffer(self.physics, dtype=np.float64)[0])


def get_physics_state(model: mujoco.MjModel, data: mujoco.MjData) -> bytes:
    """The full integration state as bytes."""
    state = np.empty(mujoco.mj_stateSize(model, STATE_SPEC), dtype=np.float64)
    mujoco.mj_getState(model, data, state, STATE_SPEC)
    return state.tobytes()


def set_physics_state(model: mujoco.MjModel, data: mujoco.MjData, physics: bytes) -> None:
    """Restore an integration state bit-exactly, derived quantities included."""
    state = np.frombuffer(physics, dtype=np.float64)
    expected = mujoco.mj_stateSize(model, STATE_SPEC)
    if state.size != expected:
        raise ValueError(f"physics state has {state.size} numbers; this model needs {expected}")
    mujoco.mj_setState(model, data, state, STATE_SPEC)
    mujoco.mj_forward(model, data)
    mujoco.mj_setState(model, data, state, STATE_SPEC)


def model_signature(model: mujoco.MjModel, task: str, substeps: int) -> str:
    """``"<task>:<hash>"`` of the model's structure and physics options: a snapshot restores only
    into a model with the same signature."""
    names = ",".join(
        mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, i) or "" for i in range(model.nbody)
    )
    m = model
    text = (
        f"{task}|nq={m.nq}|nv={m.nv}|nu={m.nu}|na={m.na}|nbody={m.nbody}|"
        f"ngeom={m.ngeom}|nmocap={m.nmocap}|dt={m.opt.timestep!r}|"
        f"substeps={substeps}|{names}"
    )
    return f"{task}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def plain_copy(value: Any) -> Any:
    """A deep copy made of plain, picklable values (arrays copied)."""
    if isinstance(value, dict):
        return {k: plain_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain_copy(v) for v in value)
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


TASK_STATE_KEYS = ("steps", "difficulty", "levels", "gripper_cmd", "instruction")


def check_snapshot(snapshot: Any, state_size: int) -> None:
    """Check every field of ``snapshot`` that a restore writes, before it writes any.

    Args:
        snapshot: What was passed to ``restore``.
        state_size: ``mj_stateSize`` of the model it is restored into.

    Raises:
        TypeError: Not a :class:`Snapshot`.
        ValueError: A field that is missing or malformed, named.
    """
    if not isinstance(snapshot, Snapshot):
        raise TypeError(f"restore() takes a tasks.Snapshot (from env.snapshot()), got a "
                        f"{type(snapshot).__name__}")
    physics = snapshot.physics
    if not isinstance(physics, bytes) or len(physics) != 8 * state_size:
        size = len(physics) // 8 if isinstance(physics, bytes) else type(physics).__name__
        raise ValueError(f"snapshot.physics holds {size} numbers; this model needs {state_size}")
    if not np.isfinite(np.frombuffer(physics, dtype=np.float64)).all():
        raise ValueError("snapshot.physics holds NaN or infinite numbers")
    state = snapshot.task_state
    missing = [key for key in TASK_STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise ValueError(f"snapshot.task_state lacks {missing}")
    checks = {
        "steps": isinstance(state["steps"], (int, np.integer)) and state["steps"] >= 0,
        "difficulty": _finite(state["difficulty"]) and 0.0 <= state["difficulty"] <= 1.0,
        "levels": isinstance(state["levels"], dict)
        and all(_finite(v) and 0.0 <= v <= 1.0 for v in state["levels"].values()),
        "gripper_cmd": _finite(state["gripper_cmd"]),
        "instruction": isinstance(state["instruction"], str),
    }
    bad = [key for key, ok in checks.items() if not ok]
    if bad:
        raise ValueError(f"snapshot.task_state has malformed {bad}: "
                         f"{ {key: state[key] for key in bad} }")
    rng = snapshot.rng_state
    if not isinstance(rng, dict) or not isinstance(rng.get("bit_generator"), str) \
            or "state" not in rng:
        raise ValueError(f"snapshot.rng_state is not a numpy bit-generator state: {rng!r}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) \
        and not isinstance(value, bool) and math.isfinite(float(value))


SNAPSHOT_FILE_FORMAT = 1


def snapshot_to_bytes(snapshot: Snapshot) -> bytes:
    """``snapshot`` as the bytes of an ``.npz`` without pickle: the physics state and every
    array as arrays, everything else as JSON, and a SHA-256 of both (see the module docstring).
    """
    arrays, record = _to_plain(snapshot)
    record["sha256"] = _digest(arrays, record)
    arrays["record"] = np.frombuffer(json.dumps(record, sort_keys=True).encode(), np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def snapshot_from_bytes(data: bytes, source: str = "snapshot bytes") -> Snapshot:
    """Read bytes of :func:`snapshot_to_bytes` (no pickle), checking their SHA-256.

    Args:
        data: The bytes.
        source: What they came from, for error messages (a file, a demo step...).

    Raises:
        ValueError: Not such bytes, another format, or content that does not match its digest.
    """
    try:
        with np.load(io.BytesIO(bytes(data)), allow_pickle=False) as loaded:
            arrays = {key: loaded[key] for key in loaded.files}
        record = json.loads(arrays.pop("record").tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{source} is not a snapshot file of tasks.save_snapshot: "
                         f"{error}") from None
    if record.get("format") != SNAPSHOT_FILE_FORMAT:
        raise ValueError(f"{source}: snapshot file format {record.get('format')!r}; expected "
                         f"{SNAPSHOT_FILE_FORMAT}")
    recorded = record.pop("sha256", None)
    if recorded != _digest(arrays, record):
        raise ValueError(f"{source}: its content does not match its SHA-256 (changed or damaged)")
    task_state = {**record["task_state"],
                  **{key[len("task_state."):]: value for key, value in arrays.items()
                     if key.startswith("task_state.")}}
    randomization = {key[len("randomization."):]: value for key, value in arrays.items()
                     if key.startswith("randomization.")}
    return Snapshot(task=record["task"], model_signature=record["model_signature"],
                    randomization_signature=record["randomization_signature"],
                    physics=arrays["physics"].tobytes(), task_state=task_state,
                    rng_state=record["rng_state"], randomization=randomization)


def save_snapshot(path: str | os.PathLike, snapshot: Snapshot) -> None:
    """Write ``snapshot`` to ``path`` (``.npz``, :func:`snapshot_to_bytes`), atomically."""
    data = snapshot_to_bytes(snapshot)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def load_snapshot(path: str | os.PathLike) -> Snapshot:
    """Read a file of :func:`save_snapshot` (no pickle), checking its SHA-256.

    Raises:
        ValueError: Not such a file, another format, or content that does not match its digest.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"{path} is not a snapshot file of tasks.save_snapshot: {error}") from None
    return snapshot_from_bytes(data, source=str(path))


def _to_plain(snapshot: Snapshot) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    if not isinstance(snapshot, Snapshot):
        raise TypeError(f"save_snapshot takes a tasks.Snapshot, got a {type(snapshot).__name__}")
    arrays = {"physics": np.frombuffer(snapshot.physics, dtype=np.float64)}
    plain = {}
    for key, value in snapshot.task_state.items():
        if isinstance(value, np.ndarray):
            arrays[f"task_state.{key}"] = value
        else:
            plain[key] = value.item() if isinstance(value, np.generic) else value
    for key, value in snapshot.randomization.items():
        arrays[f"randomization.{key}"] = np.asarray(value)
    record = {"format": SNAPSHOT_FILE_FORMAT, "task": snapshot.task,
              "model_signature": snapshot.model_signature,
              "randomization_signature": snapshot.randomization_signature,
              "task_state": plain, "rng_state": snapshot.rng_state}
    return arrays, record


def _digest(arrays: dict[str, np.ndarray], record: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode())
    for key in sorted(arrays):
        array = np.ascontiguousarray(arrays[key])
        digest.update(f"{key}|{array.dtype.str}|{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
