"""``drawer_open``: pull the cabinet's drawer open by its handle.

Difficulty levels (each in [0, 1]): ``initial_opening`` (the drawer starts 6 cm open at 0, shut
at 1) and ``spawn`` (gripper start box +-2 to +-10 cm). Success: the drawer joint reads at least
``OPEN_THRESHOLD`` = 10 cm (of 15 cm travel). Reward terms: ``reach`` (minus gripper-handle
distance, weight 0.5), ``open`` (opening as a fraction of the travel, weight 2), ``success``
(weight 1).
"""

from __future__ import annotations

import numpy as np

from tasks import scene
from tasks.experts import move_towards
from tasks.task import Task, TaskEnv, distance

OPEN_THRESHOLD = 0.10


def drawer_success(opening: float) -> bool:
    """The drawer's joint position is at least ``OPEN_THRESHOLD`` metres."""
    return bool(opening >= OPEN_THRESHOLD)


def drawer_margin(opening: float) -> float:
    """Metres the drawer still has to open to reach ``OPEN_THRESHOLD`` (negative beyond it)."""
    return float(OPEN_THRESHOLD - opening)


class DrawerOpen(Task):
    name = "drawer_open"
    levels = ("initial_opening", "spawn")
    reward_weights = {"reach": 0.5, "open": 2.0, "success": 1.0}
    max_episode_steps = 80
    state_dim = 8
    state_keys = ()  # no goal: the drawer's own joint says how far it is open

    def build(self, spec) -> None:
        scene.add_cabinet(spec)

    def bind(self, model) -> None:
        self.drawer_qpos = int(model.joint("drawer").qposadr[0])
        self.drawer_qvel = int(model.joint("drawer").dofadr[0])
        self.handle_site = model.site("handle").id

    def reset(self, env: TaskEnv, levels: dict[str, float]) -> None:
        env.data.qpos[self.drawer_qpos] = 0.06 * (1.0 - levels["initial_opening"])
        self.state = {"instruction": "open the drawer"}

    def movable_objects(self, env: TaskEnv) -> tuple[str, ...]:
        """The drawer's slide joint: how far open it starts."""
        return ("drawer",)

    def opening(self, env: TaskEnv) -> float:
        return float(env.data.qpos[self.drawer_qpos])

    def observe(self, env: TaskEnv) -> np.ndarray:
        handle = env.data.site_xpos[self.handle_site]
        return np.concatenate((
            handle, handle - env.ee_position,
            (self.opening(env), env.data.qvel[self.drawer_qvel]),
        ))

    def is_success(self, env: TaskEnv) -> bool:
        return drawer_success(self.opening(env))

    def success_margin(self, env: TaskEnv) -> float:
        return drawer_margin(self.opening(env))

    def reward_terms(self, env: TaskEnv, success: bool) -> dict[str, float]:
        handle = env.data.site_xpos[self.handle_site]
        return {
            "reach": -distance(env.ee_position, handle),
            "open": self.opening(env) / scene.DRAWER_TRAVEL,
            "success": float(success),
        }

    def expert_action(self, env: TaskEnv) -> np.ndarray:
        """Hover over the handle half-open, lower the fingers around it, close, pull out."""
        ee = env.ee_position
        handle = env.data.site_xpos[self.handle_site]
        if np.linalg.norm(ee - handle) < 0.012:
            if env.finger_opening < 0.02:
                return np.append(move_towards(ee, handle + [0, -0.06, 0], gain=0.7), 1.0)
            return np.array([0.0, 0.0, 0.0, 1.0])
        if np.linalg.norm(ee[:2] - handle[:2]) < 0.008:
            return np.append(move_towards(ee, handle), 0.0)
        return np.append(move_towards(ee, handle + [0, 0, 0.07]), 0.0)
