"""``push``: push the named cube onto the green target.

Three cubes exist in every scene (red, blue, yellow); one is named in the instruction ("push the
blue cube to the green target"), the others are distractors or wait welded in place under the
table. Difficulty levels (each in [0, 1]): ``goal_distance`` (target 6 to 18 cm from the cube),
``spawn`` (cube box +-3 to +-15 cm, gripper start box) and ``distractors`` (0 below 1/3, 1 below
2/3, else 2 distractor cubes on the table). Success: the named cube's centre within 3 cm of the
target in the table plane and resting on the table. Reward terms: ``reach`` (minus gripper-cube
distance, weight 0.5), ``push`` (minus cube-target distance, weight 2), ``success`` (weight 1).
"""

from __future__ import annotations

import numpy as np

from tasks import scene
from tasks.experts import move_towards
from tasks.task import GoalRegion, Task, TaskEnv, distance

CUBES = ("red", "blue", "yellow")
SUCCESS_RADIUS = 0.03
HOME = np.array([0.0, 0.02])  # centre of the spawn region on the table


def push_success(cube: np.ndarray, goal: np.ndarray) -> bool:
    """Cube centre within ``SUCCESS_RADIUS`` of the goal in x-y, and on the table."""
    return distance(cube[:2], goal[:2]) < SUCCESS_RADIUS and bool(cube[2] < 0.03)


def push_margin(cube: np.ndarray, goal: np.ndarray) -> float:
    """Metres from the cube centre to the edge of the target disc in x-y (negative inside).

    It ignores height: a cube lifted above the target has a negative margin, yet
    :func:`push_success` also asks that the cube rest on the table.
    """
    return float(np.linalg.norm(cube[:2] - goal[:2]) - SUCCESS_RADIUS)


def _far_from(point: np.ndarray, others: list[np.ndarray], distance: float) -> bool:
    return all(np.linalg.norm(point - other) >= distance for other in others)


def _distance_to_segment(point: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    ab = b - a
    t = np.clip(np.dot(point - a, ab) / max(np.dot(ab, ab), 1e-12), 0.0, 1.0)
    return float(np.linalg.norm(point - (a + t * ab)))


def sample_goal(rng: np.random.Generator, origin: np.ndarray, distance: float) -> np.ndarray:
    """A point ``distance`` away from ``origin`` in x-y, kept inside the table's work area."""
    for _ in range(100):
        angle = rng.uniform(0, 2 * np.pi)
        goal = origin + distance * np.array([np.cos(angle), np.sin(angle)])
        if np.all(np.abs(goal - HOME) <= 0.2):
            return goal
    return np.clip(goal, HOME - 0.2, HOME + 0.2)


class Push(Task):
    name = "push"
    levels = ("goal_distance", "spawn", "distractors")
    reward_weights = {"reach": 0.5, "push": 2.0, "success": 1.0}
    max_episode_steps = 100
    state_dim = 22
    state_keys = ("goal", "target")

    def check_state(self, state: dict) -> list[str]:
        """The goal (:meth:`Task.check_state`) and ``target``, the index of a cube."""
        bad = super().check_state(state)
        target = state.get("target")
        if "target" not in bad and (isinstance(target, bool) or not isinstance(
                target, (int, np.integer)) or not 0 <= target < len(CUBES)):
            bad.append("target")
        return bad

    def build(self, spec) -> None:
        for i, colour in enumerate(CUBES):
            scene.add_cube(spec, f"cube_{colour}", colour, parked_x=-0.2 + 0.2 * i,
                           parkable=True)
        scene.add_marker(spec, "goal", "green", radius=0.03)

    def bind(self, model) -> None:
        self.cube_bodies = [model.body(f"cube_{c}").id for c in CUBES]
        self.park_welds = [model.equality(f"park_cube_{c}").id for c in CUBES]
        self.goal_mocap = int(model.body("goal").mocapid[0])

    def reset(self, env: TaskEnv, levels: dict[str, float]) -> None:
        rng = env.np_random
        target = int(rng.integers(len(CUBES)))
        spread = 0.03 + 0.12 * levels["spawn"]
        cube = HOME + rng.uniform(-spread, spread, 2)
        goal = sample_goal(rng, cube, 0.06 + 0.12 * levels["goal_distance"])
        count = min(2, int(levels["distractors"] * 3))
        # Distractors stay clear of the cube, the goal and the path the cube must travel.
        behind = cube - 0.08 * (goal - cube) / np.linalg.norm(goal - cube)
        placed = [cube, goal]
        for i, colour in enumerate(CUBES):
            parked = i != target
            if i == target:
                position = (*cube, scene.CUBE_HALF)
            else:
                position = (-0.2 + 0.2 * i, 0.2, scene.PARK_Z + scene.CUBE_HALF)
                if count > 0:
                    for _ in range(200):
                        xy = HOME + rng.uniform(-0.2, 0.2, 2)
                        if _far_from(xy, placed, 0.07) and \
                                _distance_to_segment(xy, behind, goal) > 0.06:
                            placed.append(xy)
                            position = (*xy, scene.CUBE_HALF)
                            parked = False
                            count -= 1
                            break
            env.set_free_body(f"cube_{colour}", position)
            env.data.eq_active[self.park_welds[i]] = parked
        env.data.mocap_pos[self.goal_mocap] = (*goal, 0.0)
        self.state = {
            "goal": np.array([*goal, scene.CUBE_HALF]),
            "target": target,
            "instruction": f"push the {CUBES[target]} cube to the green target",
        }

    def cube_position(self, env: TaskEnv, index: int | None = None) -> np.ndarray:
        body = self.cube_bodies[self.state["target"] if index is None else index]
        return env.data.xpos[body]

    def observe(self, env: TaskEnv) -> np.ndarray:
        target = self.state["target"]
        cube = self.cube_position(env)
        quat = env.data.xquat[self.cube_bodies[target]]
        goal = self.state["goal"]
        others = [env.data.xpos[b] for i, b in enumerate(self.cube_bodies) if i != target]
        return np.concatenate((cube, quat, cube - env.ee_position, goal, goal - cube, *others))

    def is_success(self, env: TaskEnv) -> bool:
        return push_success(self.cube_position(env), self.state["goal"])

    def success_margin(self, env: TaskEnv) -> float:
        return push_margin(self.cube_position(env), self.state["goal"])

    def goal_region(self) -> GoalRegion:
        return GoalRegion(self.state["goal"], SUCCESS_RADIUS, planar=True, needs_object=True)

    def movable_objects(self, env: TaskEnv) -> tuple[str, ...]:
        """The cubes on the table (the named one and the distractors), not the parked ones."""
        return tuple(f"cube_{colour}" for colour, weld in zip(CUBES, self.park_welds, strict=True)
                     if not env.data.eq_active[weld])

    def named_object(self, env: TaskEnv) -> str:
        return f"cube_{CUBES[self.state['target']]}"

    def reward_terms(self, env: TaskEnv, success: bool) -> dict[str, float]:
        cube = self.cube_position(env)
        return {
            "reach": -distance(env.ee_position, cube),
            "push": -distance(cube[:2], self.state["goal"][:2]),
            "success": float(success),
        }

    def expert_action(self, env: TaskEnv) -> np.ndarray:
        """Go behind the cube (seen from the goal), lower the closed gripper, push it along."""
        ee = env.ee_position
        cube = self.cube_position(env)
        to_goal = self.state["goal"][:2] - cube[:2]
        direction = to_goal / max(np.linalg.norm(to_goal), 1e-9)
        offset = ee[:2] - cube[:2]
        along = float(offset @ direction)
        lateral = float(offset @ np.array([-direction[1], direction[0]]))
        push_height, travel_height = 0.02, 0.07
        behind = cube[:2] - 0.05 * direction
        if along < -0.025 and abs(lateral) < 0.012 and ee[2] < push_height + 0.015:
            # In place: drive through the cube towards the goal, steering back onto the line.
            target_xy = cube[:2] + 0.04 * direction - 2.0 * lateral * np.array(
                [-direction[1], direction[0]]
            )
            target = np.array([*target_xy, push_height])
            return np.append(move_towards(ee, target, gain=0.6), 1.0)
        if np.linalg.norm(ee[:2] - behind) < 0.012:
            return np.append(move_towards(ee, [*behind, push_height]), 1.0)
        if ee[2] < travel_height - 0.01 and np.linalg.norm(offset) < 0.07:
            return np.append(move_towards(ee, [*ee[:2], travel_height + 0.01]), 1.0)
        return np.append(move_towards(ee, [*behind, max(travel_height, push_height)]), 1.0)
