"""``reach``: move the gripper's grasp point to a target marker.

Difficulty levels (each in [0, 1]): ``goal_distance`` moves the target from 5 cm to 20 cm away
from the gripper's start; ``spawn`` widens the gripper's start box from +-2 cm to +-10 cm.
Success: grasp point within 3 cm of the target. Reward terms: ``distance`` (minus metres to the
target, weight 1), ``success`` (1 on success, weight 1).
"""

from __future__ import annotations

import numpy as np

from tasks import scene
from tasks.experts import move_towards
from tasks.task import GoalRegion, Task, TaskEnv, distance

SUCCESS_RADIUS = 0.03


def reach_success(ee: np.ndarray, goal: np.ndarray) -> bool:
    """Grasp point within ``SUCCESS_RADIUS`` of the goal."""
    return distance(ee, goal) < SUCCESS_RADIUS


def reach_margin(ee: np.ndarray, goal: np.ndarray) -> float:
    """Metres from the grasp point to the edge of the success ball (negative inside)."""
    return float(np.linalg.norm(ee - goal) - SUCCESS_RADIUS)


class Reach(Task):
    name = "reach"
    levels = ("goal_distance", "spawn")
    reward_weights = {"distance": 1.0, "success": 1.0}
    max_episode_steps = 50
    state_dim = 6
    version = 2  # 2 (2026-12-03): the goal lies around the gripper's start, not the world origin

    def build(self, spec) -> None:
        scene.add_marker(spec, "goal", "green", radius=0.02)

    def bind(self, model) -> None:
        self.goal_mocap = int(model.body("goal").mocapid[0])

    def reset(self, env: TaskEnv, levels: dict[str, float]) -> None:
        rng = env.np_random
        distance = 0.05 + 0.15 * levels["goal_distance"]
        direction = rng.normal(size=3)
        direction[2] *= 0.5
        direction /= np.linalg.norm(direction)
        goal = env.ee_position + distance * direction
        goal = np.clip(goal, [-0.25, -0.25, 0.03], [0.25, 0.25, 0.25])
        env.data.mocap_pos[self.goal_mocap] = goal
        self.state = {"goal": goal.copy(), "instruction": "reach the green target"}

    def observe(self, env: TaskEnv) -> np.ndarray:
        goal = self.state["goal"]
        return np.concatenate((goal, goal - env.ee_position))

    def is_success(self, env: TaskEnv) -> bool:
        return reach_success(env.ee_position, self.state["goal"])

    def success_margin(self, env: TaskEnv) -> float:
        return reach_margin(env.ee_position, self.state["goal"])

    def goal_region(self) -> GoalRegion:
        return GoalRegion(self.state["goal"], SUCCESS_RADIUS)

    def reward_terms(self, env: TaskEnv, success: bool) -> dict[str, float]:
        return {"distance": -distance(env.ee_position, self.state["goal"]),
                "success": float(success)}

    def expert_action(self, env: TaskEnv) -> np.ndarray:
        return np.append(move_towards(env.ee_position, self.state["goal"]), -1.0)
