"""The behaviours that roll out detector-data episodes (:data:`POLICIES`).

- ``expert``: the scripted expert.
- ``noisy_expert``: the expert with Gaussian action noise (misses and wobbles).
- ``offset_goal``: the expert aiming at a point just outside the success region (cube parked
  1-3 cm beside the target, held next to the goal): near-misses that stay still.
- ``stop_short``: the expert until it is within ``hard_margin`` of success, then holding still
  (cube almost on the target, drawer almost open).
- ``decoy``: the empty gripper sent to the goal and wandering there, in tasks whose success needs
  an object at the goal (``push``, ``pick_place``): negatives where the gripper hides the goal as
  the object does on success.
- ``perturbed``: the expert, then random actions from a random step on (successes undone).
- ``random``: uniform random actions.

Where a task has no goal region (the drawer), ``offset_goal`` and ``decoy`` become
``stop_short``; where the gripper itself must reach the goal (``reach``), ``decoy`` does. What a
task offers is read from the task (:meth:`tasks.task.Task.goal_region`), never from its name.
"""

from __future__ import annotations

import numpy as np

POLICIES = (
    "expert", "noisy_expert", "offset_goal", "stop_short", "decoy", "perturbed", "random",
)


def offset_goal(env, rng: np.random.Generator, hard_margin: float) -> np.ndarray | None:
    """A goal displaced so that reaching it misses success by 0.3 cm .. ``hard_margin``; ``None``
    when the task has no goal region."""
    region = env.unwrapped.task.goal_region()
    if region is None:
        return None
    direction = rng.normal(size=3)
    if region.planar:
        direction[2] = 0.0
    direction /= np.linalg.norm(direction)
    distance = region.radius + rng.uniform(0.003, hard_margin)
    goal = np.array(region.goal, dtype=float)
    return goal + distance * direction


class EpisodePolicy:
    """One episode's behaviour, drawn from :data:`POLICIES` (see the module docstring).

    Args:
        kind: One of :data:`POLICIES`; :attr:`kind` says what it became for this task.
        env: The episode's environment, already reset.
        rng: The episode's generator; every draw of the behaviour comes from it.
        noise: ``[low, high]`` of the action noise of ``noisy_expert``.
        hard_margin: Metres from the success boundary that count as near.
    """

    def __init__(self, kind: str, env, rng: np.random.Generator, noise: tuple[float, float],
                 hard_margin: float) -> None:
        import tasks

        self.kind, self.env, self.rng = kind, env, rng
        noise_std = rng.uniform(*noise) if kind == "noisy_expert" else 0.0
        self.expert = tasks.ScriptedExpert(env, noise=noise_std, seed=int(rng.integers(2**31)))
        task = env.unwrapped.task
        self.goal = offset_goal(env, rng, hard_margin) if kind == "offset_goal" else None
        if kind == "offset_goal" and self.goal is None:
            self.kind = "stop_short"  # no goal to displace (drawer): stop short instead
        if kind == "decoy":
            region = task.goal_region()
            if region is not None and region.needs_object:
                goal = np.asarray(region.goal, dtype=float)
                height = goal[2] + rng.uniform(-0.01, 0.03)
                self.decoy = np.array([*(goal[:2] + rng.normal(0, 0.01, 2)), max(height, 0.02)])
                self.decoy_gripper = float(rng.choice([-1.0, 1.0]))
            else:  # the gripper at the goal is success (reach) or there is no goal (drawer)
                self.kind = "stop_short"
        self.stop_margin = rng.uniform(0.002, hard_margin)
        self.switch_step = int(rng.integers(10, env.unwrapped.max_episode_steps))
        self.holding = False
        self.gripper = -1.0

    def __call__(self, margin: float, step: int) -> np.ndarray:
        """The action at ``step``, given the state's current success margin."""
        if self.kind == "random" or (self.kind == "perturbed" and step >= self.switch_step):
            return self.rng.uniform(-1, 1, 4).astype(np.float32)
        if self.kind == "stop_short" and (self.holding or 0 < margin < self.stop_margin):
            self.holding = True
            return np.array([0.0, 0.0, 0.0, self.gripper], dtype=np.float32)
        if self.kind == "decoy":
            return self._decoy_action()
        with self.env.unwrapped.task.aiming_at(self.goal):
            action = self.expert()
        self.gripper = float(action[3])
        return action

    def _decoy_action(self) -> np.ndarray:
        """Travel high to above the goal, descend onto it, then wander there."""
        from tasks.experts import move_towards

        ee = self.env.unwrapped.ee_position
        if np.linalg.norm(ee[:2] - self.decoy[:2]) > 0.015:
            target = np.array([*self.decoy[:2], max(self.decoy[2], 0.09)])
            motion = move_towards(ee, target)
        else:
            motion = move_towards(ee, self.decoy, gain=0.5) + self.rng.normal(0, 0.3, 3)
        return np.append(np.clip(motion, -1, 1), self.decoy_gripper).astype(np.float32)
