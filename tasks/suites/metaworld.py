"""Meta-World v3 tasks as ours: :class:`MetaWorldBackend`.

Each task is Meta-World's goal-observable env (``<name>-goal-observable``, the one its MT
benchmarks use), stepped by Meta-World's own code. What we change is only where a reset's random
numbers come from: Meta-World draws the start-state vector (object, goal, hand positions) from
our env's generator (its ``seeded_rand_vec`` path), over the task's own ``_random_reset_space``
(scaled around its centre by the difficulty), so that seeds and snapshots decide it.

- Success: ``info["success"]`` of Meta-World's ``evaluate_state``, on every step.
- State: Meta-World's 39 numbers (hand, gripper, two objects, the previous frame, goal).
- Expert: Meta-World's scripted policy for the task (``metaworld.policies.ENV_POLICY_MAP``).
- Snapshots also carry the model's body and site positions and the weld data, which Meta-World's
  reset writes into the *model* (drawer, door, goal marker positions).

Meta-World 3.1.1 runs on MuJoCo 3.3.x (on 4.0 its first reset fails): ``make suites``.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import numpy as np
from gymnasium.spaces import Box

from tasks.suites.adapter import SuiteBackend, SuiteError

# Meta-World v3's 50 tasks (metaworld.env_dict.ALL_V3_ENVIRONMENTS), and its MT10 set.
TASKS: tuple[str, ...] = (
    "assembly-v3", "basketball-v3", "bin-picking-v3", "box-close-v3",
    "button-press-topdown-v3", "button-press-topdown-wall-v3", "button-press-v3",
    "button-press-wall-v3", "coffee-button-v3", "coffee-pull-v3", "coffee-push-v3",
    "dial-turn-v3", "disassemble-v3", "door-close-v3", "door-lock-v3", "door-open-v3",
    "door-unlock-v3", "hand-insert-v3", "drawer-close-v3", "drawer-open-v3", "faucet-open-v3",
    "faucet-close-v3", "hammer-v3", "handle-press-side-v3", "handle-press-v3",
    "handle-pull-side-v3", "handle-pull-v3", "lever-pull-v3", "pick-place-wall-v3",
    "pick-out-of-hole-v3", "pick-place-v3", "plate-slide-v3", "plate-slide-side-v3",
    "plate-slide-back-v3", "plate-slide-back-side-v3", "peg-insert-side-v3",
    "peg-unplug-side-v3", "soccer-v3", "stick-push-v3", "stick-pull-v3", "push-v3",
    "push-wall-v3", "push-back-v3", "reach-v3", "reach-wall-v3", "shelf-place-v3",
    "sweep-into-v3", "sweep-v3", "window-open-v3", "window-close-v3",
)
MT10: tuple[str, ...] = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
    "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
)
# Every task's cameras (its scenes share them).
CAMERAS: tuple[str, ...] = ("topview", "corner", "corner2", "corner3", "corner4",
                            "behindGripper", "gripperPOV")


class MetaWorldBackend(SuiteBackend):
    """One Meta-World v3 task (:data:`TASKS`).

    Args:
        name: The task, e.g. ``"push-v3"``.

    Raises:
        SuiteError: An unknown task name.
    """

    suite: ClassVar[str] = "metaworld"
    default_camera: ClassVar[str] = "corner2"
    model_fields: ClassVar[tuple[str, ...]] = ("body_pos", "body_quat", "site_pos", "site_quat",
                                               "eq_data")
    # configuration and bookkeeping of the Python object, not state
    static_attributes: ClassVar[frozenset[str]] = frozenset({
        "_ezpickle_args", "_ezpickle_kwargs", "fullpath", "render_mode", "camera_id",
        "camera_name", "width", "height", "task_name", "current_seed", "_np_random_seed",
    })

    def __init__(self, name: str) -> None:
        if name not in TASKS:
            raise SuiteError(f"metaworld task {name!r} is unknown; choose one of {list(TASKS)}")
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE
        from metaworld.policies import ENV_POLICY_MAP

        self.name = name
        raw = ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[f"{name}-goal-observable"](seed=0)
        raw._freeze_rand_vec, raw.seeded_rand_vec = False, True  # drawn from raw.np_random
        # Our env ends episodes (max_episode_steps); Meta-World's own 500-step limit raises.
        self.max_episode_steps = int(raw.max_path_length)
        raw.max_path_length = 10**9
        self.raw, self.model, self.data = raw, raw.model, raw.data
        self._space = raw._random_reset_space
        self._low = np.asarray(raw._random_reset_space.low, np.float64)
        self._high = np.asarray(raw._random_reset_space.high, np.float64)
        self._policy = ENV_POLICY_MAP[name]()
        self._control_dt = float(raw.frame_skip * raw.model.opt.timestep)
        self._obs: np.ndarray = np.zeros(39)
        self._success = False

    def reset(self, rng: np.random.Generator, difficulty: float) -> None:
        raw = self.raw
        # Meta-World draws the start-state vector (and redraws it where a task rejects one)
        # from its env's generator: ours, whose state snapshots carry.
        raw._np_random = rng
        if difficulty == 1.0:
            raw._random_reset_space = self._space
        else:
            centre, half = (self._low + self._high) / 2, (self._high - self._low) / 2
            raw._random_reset_space = Box(centre - difficulty * half, centre + difficulty * half,
                                          dtype=np.float64)
        obs, _ = raw.reset()
        raw._random_reset_space = self._space
        self._obs = np.asarray(obs, np.float64)
        self._success = False  # Meta-World judges success on steps only

    def step(self, action: np.ndarray) -> tuple[float, bool, str | None]:
        obs, reward, _, _, info = self.raw.step(action)
        if self.raw._did_see_sim_exception:
            return 0.0, False, "MuJoCo raised an exception while Meta-World stepped the task"
        self._obs = np.asarray(obs, np.float64)
        self._success = bool(info["success"])
        return float(reward), self._success, None

    def is_success(self) -> bool:
        return self._success

    def observe(self) -> np.ndarray:
        return self._obs

    def proprio(self, gripper_cmd: float) -> np.ndarray:
        obs = self._obs
        velocity = (obs[0:3] - obs[18:21]) / self._control_dt
        return np.concatenate((obs[0:3], velocity, obs[3:4], [gripper_cmd]))

    def expert_action(self) -> np.ndarray:
        with warnings.catch_warnings():  # its gains saturate the action, which we clip anyway
            warnings.simplefilter("ignore", UserWarning)
            return np.asarray(self._policy.get_action(self._obs), np.float64)

    # The adapter's own state of the episode travels with the raw env's attributes.
    def attributes(self) -> dict[str, Any]:
        values = super().attributes()
        values["adapter_obs"], values["adapter_success"] = self._obs.copy(), self._success
        return values

    def set_attributes(self, values: dict[str, Any]) -> None:
        values = dict(values)
        self._obs = np.array(values.pop("adapter_obs"))
        self._success = bool(values.pop("adapter_success"))
        super().set_attributes(values)
