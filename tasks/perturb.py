"""Inexact resets: a start state with the gripper and the task's objects displaced a little, as
a real robot that cannot put them back exactly would leave them.

:func:`perturb_start` moves, in place, the gripper (position in 3-D and its target with it, and
a turn about the vertical) and each object the task names (:meth:`tasks.task.Task.movable_objects`:
free objects slide in the table plane and turn about the vertical, slide joints move along their
axis within their range). A draw that makes any pair of geoms interpenetrate more than they did
(by over ``PENETRATION_TOLERANCE``) is rejected and drawn again, so the state is physically
valid; velocities stay as they were (zero at a reset). :func:`perturbed_snapshots` gives one
perturbed snapshot per generator, for the attempts of a group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

from tasks.base import WORKSPACE_HIGH, WORKSPACE_LOW, ManipulationEnv
from tasks.checks import check_number
from tasks.snapshot import Snapshot

PENETRATION_TOLERANCE = 5e-4  # metres deeper than before that a draw may push two geoms together
MAX_TRIES = 50


@dataclass(frozen=True)
class ResetNoise:
    """Standard deviations of an inexact reset.

    Attributes:
        position: Metres, per axis of motion (x, y, z of the gripper; x, y of a free object;
            the axis of a slide joint).
        rotation: Radians of the turn about the vertical (gripper and free objects).
    """

    position: float = 0.0
    rotation: float = 0.0

    def __post_init__(self) -> None:
        for name in ("position", "rotation"):
            if check_number(f"reset_noise.{name}", getattr(self, name)) < 0:
                raise ValueError(f"reset_noise.{name}={getattr(self, name)!r}; expected a "
                                 "standard deviation >= 0")

    @property
    def on(self) -> bool:
        """Whether anything is perturbed."""
        return self.position > 0 or self.rotation > 0


def _penetrations(model: mujoco.MjModel, data: mujoco.MjData) -> dict[tuple[int, int], float]:
    """Deepest penetration (metres, > 0) of each pair of geoms in contact."""
    depth: dict[tuple[int, int], float] = {}
    for contact in data.contact[:data.ncon]:
        pair = (int(min(contact.geom)), int(max(contact.geom)))
        depth[pair] = max(depth.get(pair, 0.0), -float(contact.dist))
    return depth


def _yaw(quat: np.ndarray, angle: float) -> np.ndarray:
    """``quat`` turned by ``angle`` radians about the world's vertical."""
    turn = np.array([np.cos(angle / 2), 0.0, 0.0, np.sin(angle / 2)])
    out = np.zeros(4)
    mujoco.mju_mulQuat(out, turn, np.asarray(quat, float))
    return out


def _draw(env: ManipulationEnv, noise: ResetNoise, rng: np.random.Generator,
          joints: Sequence[str]) -> None:
    m, d = env.model, env.data
    q = int(m.joint("gripper_free").qposadr[0])
    target = env.mocap_id
    position = d.qpos[q:q + 3] + rng.normal(0.0, noise.position, 3)
    position = np.clip(position, WORKSPACE_LOW, WORKSPACE_HIGH)
    d.qpos[q:q + 3] = position
    d.mocap_pos[target] = position
    angle = rng.normal(0.0, noise.rotation)
    d.qpos[q + 3:q + 7] = _yaw(d.qpos[q + 3:q + 7], angle)
    d.mocap_quat[target] = _yaw(d.mocap_quat[target], angle)
    for name in joints:
        joint = m.joint(name)
        adr = int(joint.qposadr[0])
        if joint.type[0] == mujoco.mjtJoint.mjJNT_FREE:
            d.qpos[adr:adr + 2] += rng.normal(0.0, noise.position, 2)
            d.qpos[adr + 3:adr + 7] = _yaw(d.qpos[adr + 3:adr + 7], rng.normal(0.0, noise.rotation))
        else:
            low, high = joint.range
            d.qpos[adr] = np.clip(d.qpos[adr] + rng.normal(0.0, noise.position), low, high)


def perturb_start(env: ManipulationEnv, noise: ResetNoise, rng: np.random.Generator) -> int:
    """Displace the gripper and the task's movable objects of ``env`` in place (see the module
    docstring), drawing from ``rng`` until no pair of geoms interpenetrates more than before.

    Args:
        env: The task env (``.unwrapped`` is taken), at the start state to perturb.
        noise: Standard deviations.
        rng: Where the displacements come from (deterministic per attempt).

    Returns:
        The number of draws it took; 0 when none of ``MAX_TRIES`` was valid and the state was
        left as it was.
    """
    env = env.unwrapped
    m, d = env.model, env.data
    if not noise.on:
        return 1
    mujoco.mj_forward(m, d)
    before = _penetrations(m, d)
    qpos, mocap_pos, mocap_quat = d.qpos.copy(), d.mocap_pos.copy(), d.mocap_quat.copy()
    joints = env.task.movable_objects(env)
    for tries in range(1, MAX_TRIES + 1):
        _draw(env, noise, rng, joints)
        mujoco.mj_forward(m, d)
        after = _penetrations(m, d)
        if all(depth <= before.get(pair, 0.0) + PENETRATION_TOLERANCE
               for pair, depth in after.items()):
            return tries
        d.qpos[:], d.mocap_pos[:], d.mocap_quat[:] = qpos, mocap_pos, mocap_quat
    mujoco.mj_forward(m, d)
    return 0


def perturbed_snapshots(env, snapshot: Snapshot, noise: ResetNoise,
                        generators: Sequence[np.random.Generator]) -> list[Snapshot]:
    """One snapshot per generator: ``snapshot`` restored into ``env`` and perturbed with it.

    ``env`` (its ``.unwrapped``) is left at the last perturbed state; with ``noise`` off every
    entry is ``snapshot`` itself.
    """
    if not noise.on:
        return [snapshot] * len(generators)
    base = env.unwrapped
    out = []
    for rng in generators:
        base.reset(options={"snapshot": snapshot})  # re-applies its randomisation, if any
        perturb_start(base, noise, rng)
        out.append(base.snapshot())
    return out
