"""How episodes end: success, or which way they fail.

A success rate says how often a policy succeeds, not what it does when it fails. Every episode
is put in one of :data:`OUTCOMES`, from the simulator state alone (the task's success margin and
how far each object in play moved), so that a fine-tuning run can be read as "fewer wrong
cubes" or "more near misses turned into successes":

* ``success``: the task's predicate at the last step (``info["is_success"]``);
* ``near miss``: a failure whose last state is within :data:`NEAR_MISS` metres of the success
  boundary (:meth:`tasks.task.Task.success_margin`);
* ``moved the named object``: the object the instruction names
  (:meth:`tasks.task.Task.named_object`) moved at least :data:`MOVED` metres at some step, but
  ended farther from success;
* ``moved another object only``: the named object stayed put and another one moved (a
  distractor pushed instead);
* ``moved nothing``: no object in play moved;
* ``missed``: a failure in a task without objects (``reach``), farther than a near miss.

Objects are the task's :meth:`tasks.task.Task.movable_objects` (free and slide joints); a free
joint's displacement is its position's, a slide joint's its travel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

OUTCOMES: tuple[str, ...] = ("success", "near miss", "moved the named object",
                             "moved another object only", "moved nothing", "missed")
NEAR_MISS = 0.02  # metres from the success boundary
MOVED = 0.01      # metres an object must move to count as moved


@dataclass(frozen=True)
class EpisodeOutcome:
    """One episode's outcome and the figures it was read from (metres)."""

    seed: int | None
    outcome: str
    success: bool
    final_margin: float
    named_moved: float
    others_moved: float
    length: int


def classify(success: bool, final_margin: float, named_moved: float, others_moved: float,
             has_objects: bool) -> str:
    """The outcome (one of :data:`OUTCOMES`) of an episode.

    Args:
        success: The task's predicate at the last step.
        final_margin: Signed metres to the success boundary at the last step (positive outside).
        named_moved: Largest displacement of the named object during the episode (0 without
            one).
        others_moved: Largest displacement of any other object in play (0 without any).
        has_objects: Whether the task has objects in play at all.
    """
    if success:
        return "success"
    if final_margin <= NEAR_MISS:
        return "near miss"
    if not has_objects:
        return "missed"
    if named_moved >= MOVED:
        return "moved the named object"
    if others_moved >= MOVED:
        return "moved another object only"
    return "moved nothing"


def _joint_position(model: mujoco.MjModel, data: mujoco.MjData, joint: str) -> np.ndarray:
    spec = model.joint(joint)
    address, kind = int(spec.qposadr[0]), int(spec.type[0])
    width = 3 if kind == mujoco.mjtJoint.mjJNT_FREE else 1
    if kind not in (mujoco.mjtJoint.mjJNT_FREE, mujoco.mjtJoint.mjJNT_SLIDE):
        raise ValueError(f"joint {joint!r} is neither free nor slide (type {kind}); "
                         "movable_objects must name free or slide joints")
    return data.qpos[address:address + width].copy()


class OutcomeRecorder(gym.Wrapper):
    """Records an :class:`EpisodeOutcome` in :attr:`outcomes` at the end of every episode
    (``terminated`` or ``truncated``); observations, rewards and actions pass through
    untouched, so a policy plays exactly as it would without the wrapper."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.outcomes: list[EpisodeOutcome] = []
        self._seed: int | None = None
        self._start: dict[str, np.ndarray] = {}
        self._moved: dict[str, float] = {}
        self._named: str | None = None
        self._length = 0

    def _positions(self) -> dict[str, np.ndarray]:
        base = self.env.unwrapped
        return {joint: _joint_position(base.model, base.data, joint)
                for joint in base.task.movable_objects(base)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        base = self.env.unwrapped
        self._seed, self._length = seed, 0
        self._start = self._positions()
        self._moved = dict.fromkeys(self._start, 0.0)
        self._named = base.task.named_object(base)
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._length += 1
        for joint, position in self._positions().items():
            moved = float(np.linalg.norm(position - self._start[joint]))
            self._moved[joint] = max(self._moved.get(joint, 0.0), moved)
        if terminated or truncated:
            base = self.env.unwrapped
            success = bool(info["is_success"])
            margin = float(base.task.success_margin(base))
            named = self._moved.get(self._named, 0.0) if self._named else 0.0
            others = max((v for k, v in self._moved.items() if k != self._named), default=0.0)
            self.outcomes.append(EpisodeOutcome(
                self._seed, classify(success, margin, named, others, bool(self._start)),
                success, margin, named, others, self._length))
        return obs, reward, terminated, truncated, info


def tally(outcomes: Sequence[EpisodeOutcome]) -> dict[str, Any]:
    """Counts and shares per outcome (every one of :data:`OUTCOMES`, zeros included), the
    episodes, and the per-episode records as dicts."""
    counts = Counter(o.outcome for o in outcomes)
    total = len(outcomes)
    return {"episodes": total,
            "counts": {name: counts.get(name, 0) for name in OUTCOMES},
            "shares": {name: counts.get(name, 0) / total if total else float("nan")
                       for name in OUTCOMES},
            "records": [asdict(o) for o in outcomes]}
