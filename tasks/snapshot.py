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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from tasks.language import tokenize

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
    # a writable copy: MuJoCo 3.3's binding refuses the read-only view of the bytes
    state = np.frombuffer(physics, dtype=np.float64).copy()
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


def check_snapshot(snapshot: Any, state_size: int,
                   check_task_state: Callable[[dict[str, Any]], list[str]] | None = None,
                   ) -> np.ndarray:
    """Check every field of ``snapshot`` that a restore writes, before it writes any: whatever
    a file's digest says (it has no key), a forged snapshot must not reach the simulator.

    Args:
        snapshot: What was passed to ``restore``.
        state_size: ``mj_stateSize`` of the model it is restored into.
        check_task_state: The task's check of its own fields (``Task.check_state``): the names
            of those missing or malformed.

    Returns:
        The instruction's token ids, so that the restore need not tokenize it again.

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
        "gripper_cmd": _finite(state["gripper_cmd"]) and -1.0 <= state["gripper_cmd"] <= 1.0,
        "instruction": isinstance(state["instruction"], str),
    }
    bad = [key for key, ok in checks.items() if not ok]
    bad += check_task_state(state) if check_task_state is not None else []
    if bad:
        raise ValueError(f"snapshot.task_state has missing or malformed {bad}: "
                         f"{ {key: state.get(key) for key in bad} }")
    try:
        tokens = tokenize(state["instruction"])
    except ValueError as error:
        raise ValueError(f"snapshot.task_state['instruction']: {error}") from None
    rng = snapshot.rng_state
    if not isinstance(rng, dict) or not isinstance(rng.get("bit_generator"), str) \
            or "state" not in rng:
        raise ValueError(f"snapshot.rng_state is not a numpy bit-generator state: {rng!r}")
    return tokens


def check_structure(snapshot: Any, signature: str, task: str) -> None:
    """Refuse anything but a :class:`Snapshot` of a model of ``signature`` (task ``task``).

    Raises:
        TypeError: Not a :class:`Snapshot`.
        ValueError: Naming both models' signatures and tasks.
    """
    if not isinstance(snapshot, Snapshot):
        raise TypeError(f"restore() takes a tasks.Snapshot (from env.snapshot()), got a "
                        f"{type(snapshot).__name__}")
    if snapshot.model_signature != signature:
        raise ValueError(f"snapshot of model {snapshot.model_signature} (task {snapshot.task!r}) "
                         f"cannot be restored into model {signature} (task {task!r})")


def check_randomization_signature(snapshot: Snapshot, current: str) -> None:
    """Refuse a snapshot taken under other randomised parameters than ``current``'s.

    Raises:
        ValueError: Naming both signatures.
    """
    if snapshot.randomization_signature != current:
        raise ValueError(
            f"snapshot was taken with randomisation {snapshot.randomization_signature}, this "
            f"env's model has {current}; use env.reset(options={{'snapshot': s}}) to re-apply "
            "the snapshot's randomisation")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) \
        and not isinstance(value, bool) and math.isfinite(float(value))


SNAPSHOT_FILE_FORMAT = 1
# Unpacked content of one snapshot file: a few kilobytes in practice (physics state, goal,
# randomised model arrays), so 16 MiB refuses only what is not a snapshot.
MAX_SNAPSHOT_BYTES = 16 * 2**20


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
    """Read bytes of :func:`snapshot_to_bytes` (no pickle), checking their SHA-256 and shape.

    Every archive member's size is checked before it is decompressed (:func:`_read_arrays`), and
    the record's fields by type; the values are checked by the restore (:func:`check_snapshot`).

    Args:
        data: The bytes.
        source: What they came from, for error messages (a file, a demo step...).

    Raises:
        ValueError: Not such bytes, another format, content that does not match its digest, or
            a member or field of the wrong size or type (named).
    """
    try:
        arrays = _read_arrays(bytes(data), source)
        record = json.loads(arrays.pop("record").tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, NotImplementedError,
            zipfile.BadZipFile) as error:
        raise ValueError(f"{source} is not a snapshot file of tasks.save_snapshot: "
                         f"{error}") from None
    if not isinstance(record, dict) or record.get("format") != SNAPSHOT_FILE_FORMAT:
        found = record.get("format") if isinstance(record, dict) else record
        raise ValueError(f"{source}: snapshot file format {found!r}; expected "
                         f"{SNAPSHOT_FILE_FORMAT}")
    recorded = record.pop("sha256", None)
    if recorded != _digest(arrays, record):
        raise ValueError(f"{source}: its content does not match its SHA-256 (changed or damaged)")
    types = {"task": str, "model_signature": str, "randomization_signature": str,
             "task_state": dict, "rng_state": dict}
    bad = [key for key, kind in types.items() if not isinstance(record.get(key), kind)]
    physics = arrays.get("physics")
    if physics is None or physics.dtype != np.float64 or physics.ndim != 1:
        bad.append("physics")
    if bad:
        raise ValueError(f"{source}: snapshot field(s) {bad} missing or of the wrong type; "
                         f"expected {types} and physics a float64 vector")
    task_state = {**record["task_state"],
                  **{key[len("task_state."):]: value for key, value in arrays.items()
                     if key.startswith("task_state.")}}
    randomization = {key[len("randomization."):]: value for key, value in arrays.items()
                     if key.startswith("randomization.")}
    return Snapshot(task=record["task"], model_signature=record["model_signature"],
                    randomization_signature=record["randomization_signature"],
                    physics=physics.tobytes(), task_state=task_state,
                    rng_state=record["rng_state"], randomization=randomization)


def _read_arrays(data: bytes, source: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` without pickle, sizes checked before anything is unpacked.

    The zip directory's sizes are checked against :data:`MAX_SNAPSHOT_BYTES` (``zipfile``
    unpacks no more than a member declares), then each ``.npy`` header's shape against its
    member's size, so a small file cannot make this allocate more than the limit.

    Raises:
        ValueError: A member too large, not ``.npy``, or whose header disagrees with its size.
    """
    arrays = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = archive.infolist()
        total = sum(member.file_size for member in members)
        if total > MAX_SNAPSHOT_BYTES:
            largest = max(members, key=lambda member: member.file_size)
            raise ValueError(f"{source}: its members unpack to {total} bytes (the largest, "
                             f"{largest.filename!r}, {largest.file_size}); a snapshot file holds "
                             f"at most {MAX_SNAPSHOT_BYTES}")
        for member in members:
            payload = archive.read(member)
            buffer = io.BytesIO(payload)
            version = np.lib.format.read_magic(buffer)
            if not member.filename.endswith(".npy") or version not in ((1, 0), (2, 0)):
                raise ValueError(f"member {member.filename!r} is not an .npy array")
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(buffer)
            count = math.prod(shape)
            if dtype.hasobject or count * dtype.itemsize != len(payload) - buffer.tell():
                raise ValueError(f"member {member.filename!r} declares {shape} {dtype} in "
                                 f"{len(payload) - buffer.tell()} bytes of data")
            array = np.frombuffer(payload, dtype, count, offset=buffer.tell()).copy()
            arrays[member.filename[:-4]] = array.reshape(shape, order="F" if fortran else "C")
    return arrays


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
        size = Path(path).stat().st_size
        if size > MAX_SNAPSHOT_BYTES:
            raise OSError(f"it has {size} bytes; a snapshot file holds at most "
                          f"{MAX_SNAPSHOT_BYTES}")
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
