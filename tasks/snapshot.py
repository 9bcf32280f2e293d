"""Exact snapshots of a task environment.

A :class:`Snapshot` is a frozen, picklable value. Restoring it and replaying the same actions gives
bit-identical observations (pixels included) and rewards, in this process or in another one that
received the pickle. ``mj_setState`` alone is not enough for that: derived quantities must be
recomputed with ``mj_forward``, and ``mj_forward`` overwrites the solver's warm-start, so the state
is set a second time after it (:func:`set_physics_state`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
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
