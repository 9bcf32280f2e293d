"""The task contract: what a task object answers, and what it may use of its environment.

A task (``tasks/reach.py``, ``push.py``, ``pick_place.py``, ``drawer.py``) is a :class:`Task`
plugged into :class:`tasks.base.ManipulationEnv`. It owns everything specific to it: scene parts,
spawn sampler, success predicate and the signed distance to that predicate's boundary, reward
terms and scripted expert. Code outside ``tasks/`` asks the task object, never branches on its name.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import mujoco
import numpy as np

GOAL_BOUND = 1.0  # metres per axis from the table's centre: every goal lies over the table


def distance(a: np.ndarray, b: np.ndarray) -> float:
    """Euclidean distance of two small vectors (far cheaper than ``np.linalg.norm`` here)."""
    return math.dist(a.tolist(), b.tolist())


class TaskEnv(Protocol):
    """What a task reads and sets of its environment (a :class:`tasks.base.ManipulationEnv`)."""

    np_random: np.random.Generator
    data: mujoco.MjData

    @property
    def ee_position(self) -> np.ndarray:
        """World position of the gripper's grasp point."""

    @property
    def finger_opening(self) -> float:
        """Distance between the fingers' inner faces, metres."""

    def set_free_body(self, joint: str, position, quat=(1, 0, 0, 0)) -> None:
        """Place a free-jointed object."""


@dataclass(frozen=True, eq=False)
class GoalRegion:
    """Success as bringing a point (the gripper or an object) within ``radius`` of ``goal``.

    Attributes:
        goal: Centre of the region, world frame, metres.
        radius: Metres from ``goal`` inside which success holds.
        planar: Distances are measured in the table plane (x-y) only.
        needs_object: An object must reach the goal: the empty gripper there is a failure.
    """

    goal: np.ndarray
    radius: float
    planar: bool = False
    needs_object: bool = False


class Task:
    """What the robot must do: scene parts, spawn sampler, success, rewards and expert.

    Subclasses set the class attributes and implement the hooks. Task state that must survive a
    snapshot lives in ``self.state`` (a dict of plain values and small arrays); a task with a goal
    keeps it in ``self.state["goal"]``, which its expert aims at.
    """

    name: ClassVar[str]
    levels: ClassVar[tuple[str, ...]]  # named difficulty parameters, each in [0, 1]
    reward_weights: ClassVar[dict[str, float]]
    max_episode_steps: ClassVar[int]
    state_dim: ClassVar[int]  # length of the task part of the state vector
    # Raised when a fix changes what a reset draws (cached demos of an older version are not
    # reused: harness.start_policy.demo_file).
    version: ClassVar[int] = 1
    # The task's own fields of ``self.state`` besides the instruction, which a snapshot carries.
    state_keys: ClassVar[tuple[str, ...]] = ("goal",)

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}

    def build(self, spec: mujoco.MjSpec) -> None:
        """Add the task's objects to the scene."""
        raise NotImplementedError

    def bind(self, model: mujoco.MjModel) -> None:
        """Look up ids in the compiled model."""

    def reset(self, env: TaskEnv, levels: dict[str, float]) -> None:
        """Place objects and goal with ``env.np_random``; fill ``self.state`` (with instruction)."""
        raise NotImplementedError

    def check_state(self, state: dict[str, Any]) -> list[str]:
        """The task's own fields of a snapshot's task state that are missing or malformed, for
        the restore's error; by default ``goal``, a finite point within :data:`GOAL_BOUND`
        metres of the table's centre per axis."""
        bad = [key for key in self.state_keys if key not in state]
        if "goal" in self.state_keys and "goal" not in bad:
            goal = state["goal"]
            if not (isinstance(goal, np.ndarray) and goal.shape == (3,) and goal.dtype.kind == "f"
                    and bool((np.abs(goal) <= GOAL_BOUND).all())):
                bad.append("goal")
        return bad

    def observe(self, env: TaskEnv) -> np.ndarray:
        """The task part of the state vector (object poses, goal, relative vectors)."""
        raise NotImplementedError

    def is_success(self, env: TaskEnv) -> bool:
        """The scripted ground truth: one pure predicate on the simulator state."""
        raise NotImplementedError

    def success_margin(self, env: TaskEnv) -> float:
        """Signed metres to the success boundary: positive outside, negative inside.

        ``margin < 0`` agrees with :meth:`is_success` (to rounding on the boundary itself),
        except where the predicate adds a condition that is not a distance (the task's module
        names it). Detector data collection uses it to find near-misses; labels always come from
        :meth:`is_success`.
        """
        raise NotImplementedError

    def goal_region(self) -> GoalRegion | None:
        """The success region when success means bringing a point to a goal, else ``None``."""
        return None

    def movable_objects(self, env: TaskEnv) -> tuple[str, ...]:
        """Joints of the objects in play that an inexact reset may displace
        (:mod:`tasks.perturb`): free joints and slide joints. None by default (the gripper is
        always displaced)."""
        return ()

    def named_object(self, env: TaskEnv) -> str | None:
        """The joint (one of :meth:`movable_objects`) of the object success depends on, the one
        the instruction names; by default the only movable object, ``None`` with none or several
        (:mod:`harness.outcomes` reads it)."""
        objects = self.movable_objects(env)
        return objects[0] if len(objects) == 1 else None

    @contextmanager
    def aiming_at(self, goal: np.ndarray | None) -> Iterator[None]:
        """Within the block the expert aims at ``goal`` instead of the task's goal (``None``:
        no change); the true goal is put back afterwards. Near-miss demonstrations use it."""
        if goal is None:
            yield
            return
        true_goal = self.state["goal"]
        self.state["goal"] = goal
        try:
            yield
        finally:
            self.state["goal"] = true_goal

    def reward_terms(self, env: TaskEnv, success: bool) -> dict[str, float]:
        """Named dense reward terms; the reward is their weighted sum."""
        raise NotImplementedError

    def expert_action(self, env: TaskEnv) -> np.ndarray:
        """A privileged scripted controller's action for the current state."""
        raise NotImplementedError
