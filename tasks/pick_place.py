"""``pick_place``: grasp the red cube and hold it at a goal above the table.

Difficulty levels (each in [0, 1]): ``goal_height`` (goal 4 to 18 cm above the table),
``goal_distance`` (5 to 17 cm from the cube in the table plane) and ``spawn`` (cube box +-3 to
+-15 cm, gripper start box). Success: cube centre within 3 cm of the goal. Reward terms:
``reach`` (minus gripper-cube distance, weight 0.5), ``grasp`` (1 while the cube is held between
the fingers, weight 0.25), ``place`` (minus cube-goal distance, weight 2), ``success`` (weight 1).
"""

from __future__ import annotations

import numpy as np

from tasks import scene
from tasks.experts import move_towards
from tasks.push import HOME, sample_goal
from tasks.task import GoalRegion, Task, TaskEnv, distance

SUCCESS_RADIUS = 0.03


def place_success(cube: np.ndarray, goal: np.ndarray) -> bool:
    """Cube centre within ``SUCCESS_RADIUS`` of the goal."""
    return distance(cube, goal) < SUCCESS_RADIUS


def place_margin(cube: np.ndarray, goal: np.ndarray) -> float:
    """Metres from the cube centre to the edge of the success ball (negative inside)."""
    return float(np.linalg.norm(cube - goal) - SUCCESS_RADIUS)


def is_grasped(ee: np.ndarray, cube: np.ndarray, finger_opening: float) -> bool:
    """The cube sits between closed fingers: near the grasp point, fingers on its faces."""
    return distance(ee, cube) < 0.02 and finger_opening < 2 * scene.CUBE_HALF + 0.006


class PickPlace(Task):
    name = "pick_place"
    levels = ("goal_height", "goal_distance", "spawn")
    reward_weights = {"reach": 0.5, "grasp": 0.25, "place": 2.0, "success": 1.0}
    max_episode_steps = 100
    state_dim = 16

    def build(self, spec) -> None:
        scene.add_cube(spec, "cube_red", "red", parked_x=0.0)
        scene.add_marker(spec, "goal", "green", radius=0.02)

    def bind(self, model) -> None:
        self.cube_body = model.body("cube_red").id
        self.goal_mocap = int(model.body("goal").mocapid[0])

    def reset(self, env: TaskEnv, levels: dict[str, float]) -> None:
        rng = env.np_random
        spread = 0.03 + 0.12 * levels["spawn"]
        cube = HOME + rng.uniform(-spread, spread, 2)
        goal_xy = sample_goal(rng, cube, 0.05 + 0.12 * levels["goal_distance"])
        goal = np.array([*goal_xy, 0.04 + 0.14 * levels["goal_height"]])
        env.set_free_body("cube_red", (*cube, scene.CUBE_HALF))
        env.data.mocap_pos[self.goal_mocap] = goal
        self.state = {"goal": goal, "instruction": "pick up the red cube and place it at the goal"}

    def observe(self, env: TaskEnv) -> np.ndarray:
        cube = env.data.xpos[self.cube_body]
        goal = self.state["goal"]
        quat = env.data.xquat[self.cube_body]
        return np.concatenate((cube, quat, cube - env.ee_position, goal, goal - cube))

    def is_success(self, env: TaskEnv) -> bool:
        return place_success(env.data.xpos[self.cube_body], self.state["goal"])

    def success_margin(self, env: TaskEnv) -> float:
        return place_margin(env.data.xpos[self.cube_body], self.state["goal"])

    def goal_region(self) -> GoalRegion:
        return GoalRegion(self.state["goal"], SUCCESS_RADIUS, needs_object=True)

    def movable_objects(self, env: TaskEnv) -> tuple[str, ...]:
        return ("cube_red",)

    def reward_terms(self, env: TaskEnv, success: bool) -> dict[str, float]:
        cube = env.data.xpos[self.cube_body]
        return {
            "reach": -distance(env.ee_position, cube),
            "grasp": float(is_grasped(env.ee_position, cube, env.finger_opening)),
            "place": -distance(cube, self.state["goal"]),
            "success": float(success),
        }

    def expert_action(self, env: TaskEnv) -> np.ndarray:
        """Hover over the cube, descend open, close, then carry the cube to the goal."""
        ee = env.ee_position
        cube = env.data.xpos[self.cube_body]
        if is_grasped(ee, cube, env.finger_opening):
            return np.append(move_towards(ee, self.state["goal"] + ee - cube), 1.0)
        if np.linalg.norm(ee[:2] - cube[:2]) < 0.008:
            if ee[2] > cube[2] + 0.006:
                return np.append(move_towards(ee, cube), -1.0)
            return np.array([0.0, 0.0, 0.0, 1.0])
        if ee[2] < cube[2] + 0.03 and np.linalg.norm(ee[:2] - cube[:2]) < 0.05:
            return np.append(move_towards(ee, [*ee[:2], cube[2] + 0.06]), -1.0)
        return np.append(move_towards(ee, [*cube[:2], cube[2] + 0.05]), -1.0)
