"""The manipulation environment shared by every task.

A task is a :class:`tasks.task.Task` object plugged into :class:`ManipulationEnv`, which owns the
MuJoCo model, the action and observation contract, rendering, difficulty and exact snapshots.
Options: :class:`tasks.config.TaskConfig`; domain randomisation: :mod:`tasks.randomization`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import mujoco
import numpy as np

from tasks import language, scene
from tasks.checks import check_action, check_int
from tasks.config import OBS_MODES, TaskConfig, check_difficulty, resolve_difficulty
from tasks.randomization import DomainRandomizer, RandomizationConfig
from tasks.rendering import Cameras, camera_views
from tasks.snapshot import (
    STATE_SPEC,
    Snapshot,
    check_randomization_signature,
    check_snapshot,
    check_structure,
    get_physics_state,
    model_signature,
    plain_copy,
    set_physics_state,
)
from tasks.task import Task, distance
from tasks.textures import add_randomization_parts

__all__ = [  # the env, and names other modules import from here
    "MAX_DELTA", "OBS_MODES", "PROPRIO_DIM", "WORKSPACE_HIGH", "WORKSPACE_LOW", "ManipulationEnv",
    "RandomizationConfig", "Task", "TaskConfig", "camera_views", "check_difficulty", "distance",
]

MAX_DELTA = 0.02  # metres of end-effector motion per control step at |action| = 1
WORKSPACE_LOW = np.array([-0.3, -0.3, 0.0])
WORKSPACE_HIGH = np.array([0.3, 0.3, 0.35])
PROPRIO_DIM = 8
_BADQPOS, _BADQVEL, _BADQACC = (int(getattr(mujoco.mjtWarning, f"mjWARN_BAD{q}"))
                                for q in ("QPOS", "QVEL", "QACC"))


class ManipulationEnv(gym.Env):
    """A tabletop manipulation task behind the Gymnasium API.

    **Action** ``Box(-1, 1, (4,))``: end-effector displacement ``dx, dy, dz`` (times
    ``MAX_DELTA`` = 2 cm per control step) and gripper (``-1`` open ... ``+1`` closed, a position
    command for both fingers). In-range values are used as they are; finite values outside
    ``[-1, 1]`` are clipped to it; NaN/inf or a wrong shape raise ``ValueError`` before anything is
    simulated. The target is kept inside the workspace box ``WORKSPACE_LOW..WORKSPACE_HIGH``.

    **Observation** ``Dict`` by ``obs_mode``:

    - ``state``: ``state`` float32 = proprio (8: end-effector position, linear velocity, finger
      opening, gripper command) followed by the task's object poses, goal and relative vectors.
    - ``pixels``: ``pixels`` uint8 ``(image_size, image_size, 3)`` from ``camera``, and ``proprio``.
    - ``pixels_state``: both of the above.
    - every mode: ``instruction`` int64 ``(language.MAX_TOKENS,)`` token ids.

    **Reward**: the weighted sum of the task's named terms, given in ``info["reward_terms"]``.
    ``info["is_success"]`` is the scripted predicate on every step. ``terminated`` on success
    (``terminate_on_success``); ``truncated`` after ``max_episode_steps`` or on a physics error
    (``info["physics_error"]``).

    **Reset options**: ``difficulty`` (in [0, 1], or a dict of the task's named levels),
    ``snapshot`` (restore exactly), ``instruction`` (override the text, in the task's vocabulary),
    ``randomization`` (this episode's ranges, ``RandomizationConfig.with_ranges``), ``noise_key``
    and ``imperfections`` (its imperfection scales; :mod:`tasks.wrappers`), ``max_episode_steps``
    (its step limit; a reset without it goes back to the configured one).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 25}
    reset_option_keys = ("difficulty", "snapshot", "instruction", "randomization", "noise_key",
                         "imperfections", "max_episode_steps")

    def __init__(self, task: Task, config: TaskConfig, render_mode: str | None = None) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r}; expected None or 'rgb_array'")
        self.task = task
        self.config = config
        self.render_mode = render_mode
        self.reward_weights = dict(task.reward_weights)
        unknown = sorted(set(config.reward_weights) - set(self.reward_weights))
        if unknown:
            raise ValueError(
                f"reward_weights {unknown} unknown for task {task.name!r}; "
                f"terms are {sorted(self.reward_weights)}"
            )
        self.reward_weights.update(config.reward_weights)
        self.max_episode_steps = int(config.max_episode_steps or task.max_episode_steps)
        self.configured_max_episode_steps = self.max_episode_steps  # a reset option overrides
        self.substeps = int(config.substeps)  # per control step (tasks.wrappers may vary it)

        spec = scene.new_spec(scene.SceneOptions(config.timestep, config.substeps))
        scene.add_table(spec)
        scene.add_lights(spec)
        scene.add_fixed_cameras(spec)
        scene.add_gripper(spec)
        task.build(spec)
        add_randomization_parts(spec, config.randomization)
        self.model = spec.compile()
        self.data = mujoco.MjData(self.model)
        self._bind()
        task.bind(self.model)
        self._cameras = Cameras(self.model)
        self.camera_names = self._cameras.names
        if config.camera not in self.camera_names:
            raise ValueError(f"camera={config.camera!r}; expected one of {self.camera_names}")
        self._camera_id = self.camera_names.index(config.camera)
        self._randomizer = DomainRandomizer(self.model, self.gripper_body)
        self.model_signature = model_signature(self.model, task.name, config.substeps)
        self._state_size = mujoco.mj_stateSize(self.model, STATE_SPEC)

        obs_spaces: dict[str, gym.Space] = {}
        if config.obs_mode in ("state", "pixels_state"):
            dim = PROPRIO_DIM + task.state_dim
            obs_spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        if config.obs_mode in ("pixels", "pixels_state"):
            size = int(config.image_size)
            obs_spaces["pixels"] = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
            obs_spaces["proprio"] = gym.spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32)
        obs_spaces["instruction"] = gym.spaces.Box(
            0, language.VOCAB_SIZE - 1, (language.MAX_TOKENS,), np.int64
        )
        self.observation_space = gym.spaces.Dict(obs_spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)

        self.steps = 0
        self.difficulty = float(config.difficulty)
        self.levels: dict[str, float] = {}
        self.instruction = ""
        self._tokens = np.zeros(language.MAX_TOKENS, np.int64)
        self._gripper_cmd = -1.0
        self._needs_reset = True

    # ----------------------------------------------------------------------------------- model
    def _bind(self) -> None:
        m = self.model
        self.ee_site = m.site("ee").id
        self.gripper_body = m.body("gripper").id
        self.mocap_id = int(m.body("ee_target").mocapid[0])
        self._gripper_qpos = int(m.joint("gripper_free").qposadr[0])
        self._gripper_qvel = int(m.joint("gripper_free").dofadr[0])
        self._finger_qpos = [int(m.joint(f"finger_{s}").qposadr[0]) for s in ("left", "right")]
        self._finger_ctrl = [m.actuator(f"finger_{s}").id for s in ("left", "right")]
        assert self._finger_ctrl[1] == self._finger_ctrl[0] + 1, "finger actuators are adjacent"
        self._finger_ctrl_slice = slice(self._finger_ctrl[0], self._finger_ctrl[0] + 2)

    def randomization_signature(self) -> str:
        """Hash of the model parameters that domain randomisation changes."""
        return self._randomizer.signature()

    def randomization_ranges(self) -> tuple[str, ...]:
        """The randomisation ranges (``RANGE_KEYS``) that change something in this scene."""
        return self._randomizer.ranges()

    # ---------------------------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.reset_option_keys))
        if unknown:
            raise ValueError(
                f"unknown reset option(s) {unknown}; allowed: {list(self.reset_option_keys)}"
            )
        # Every option is checked before anything changes: a refused reset leaves the env as it
        # was, randomised model arrays included.
        limit = options.get("max_episode_steps")  # this episode's, else the configured one
        limit = (self.configured_max_episode_steps if limit is None else
                 check_int("reset option max_episode_steps", limit, 1))
        if options.get("snapshot") is not None:
            self._reset_to(options["snapshot"], seed)
            self.max_episode_steps = limit
            return self._observe(), self._info(self.task.is_success(self))

        difficulty, levels = resolve_difficulty(
            options.get("difficulty"), self.config.difficulty, self.task.name, self.task.levels
        )
        block = self.config.randomization.with_ranges(options.get("randomization"))
        instruction = options.get("instruction")
        if instruction is not None:
            language.tokenize(str(instruction))
        super().reset(seed=seed)
        self.max_episode_steps, self.difficulty, self.levels = limit, difficulty, levels
        if block.enabled:
            self._randomizer.apply(self._randomizer.sample(block, self.np_random))
        elif self._randomizer.values:
            self._randomizer.apply({})
        mujoco.mj_resetData(self.model, self.data)
        self.steps = 0
        self._gripper_cmd = -1.0
        self._set_fingers(-1.0)
        spread = 0.02 + 0.08 * self.levels.get("spawn", self.difficulty)
        start = np.array([0.0, -0.06, 0.14]) + self.np_random.uniform(
            [-spread, -spread, -0.3 * spread], [spread, spread, 0.3 * spread]
        )
        self.set_gripper_position(start)
        # Positions for the task's reset (reach places its goal relative to ee_position): after
        # mj_resetData they are stale until the kinematics run.
        mujoco.mj_kinematics(self.model, self.data)
        self.task.reset(self, self.levels)
        if instruction is not None:
            self.task.state["instruction"] = str(instruction)
        self._set_instruction(self.task.state["instruction"])
        mujoco.mj_forward(self.model, self.data)
        self._needs_reset = False
        return self._observe(), self._info(self.task.is_success(self))

    def step(self, action):
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        action = check_action(action)
        m, d = self.model, self.data
        ee = d.site_xpos[self.ee_site]
        d.mocap_pos[self.mocap_id] = np.minimum(
            np.maximum(ee + MAX_DELTA * action[:3], WORKSPACE_LOW), WORKSPACE_HIGH
        )
        self._gripper_cmd = float(action[3])
        self._set_fingers(self._gripper_cmd)
        warnings_before = self._unstable_count()
        mujoco.mj_step(m, d, self.substeps)
        # Fresh positions for observation and success (mj_step leaves them one substep old);
        # mj_kinematics + mj_camlight touch no solver state, so replays stay bit-exact.
        mujoco.mj_kinematics(m, d)
        mujoco.mj_camlight(m, d)
        self.steps += 1

        error = self._physics_error(warnings_before)
        if error:
            self._needs_reset = True
            info = self._info(False)
            info["physics_error"] = error
            info["reward_terms"] = {k: 0.0 for k in self.reward_weights}
            return self._observe(safe=True), 0.0, False, True, info
        success = self.task.is_success(self)
        terms = self.task.reward_terms(self, success)
        reward = float(sum(self.reward_weights[k] * v for k, v in terms.items()))
        terminated = bool(success and self.config.terminate_on_success)
        truncated = self.steps >= self.max_episode_steps and not terminated
        info = self._info(success)
        info["reward_terms"] = terms
        return self._observe(), reward, terminated, truncated, info

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        height, width = self.config.render_size
        return self._cameras.render(self.data, self._camera_id, height, width, "high")

    def render_camera(self, camera: str, size: int | None = None, quality: str | None = None):
        """Render one frame from any named camera (e.g. for detector data or figures); cameras
        joined by ``+`` (``"front+overhead"``) give their square frames of the same instant side
        by side, left to right, as one ``(size, n * size, 3)`` image (a multi-view detector's)."""
        size = int(size or self.config.image_size)
        return self._cameras.render_views(self.data, camera, size,
                                          quality or self.config.render_quality)

    def camera_mounts(self, camera: str) -> list[dict]:
        """Where each view of ``camera`` is mounted as built (:meth:`Cameras.mounts`)."""
        return self._cameras.mounts(camera)

    def close(self) -> None:
        self._cameras.close()

    # ------------------------------------------------------------------------- snapshots
    def snapshot(self) -> Snapshot:
        """Capture the complete state: physics, task, step count, difficulty and RNG."""
        task_state = {key: plain_copy(value) for key, value in self.task.state.items()}
        task_state.update(steps=self.steps, difficulty=self.difficulty, levels=dict(self.levels),
                          gripper_cmd=self._gripper_cmd)
        return Snapshot(
            task=self.task.name, model_signature=self.model_signature,
            randomization_signature=self.randomization_signature(),
            physics=get_physics_state(self.model, self.data), task_state=task_state,
            rng_state=plain_copy(self.np_random.bit_generator.state),
            randomization={key: np.array(v) for key, v in self._randomizer.values.items()})

    def restore(self, snapshot: Snapshot) -> None:
        """Put the environment back exactly at ``snapshot``.

        Every field is checked before anything is written (:func:`tasks.snapshot.check_snapshot`
        and the task's :meth:`~tasks.task.Task.check_state`), so a bad snapshot leaves the
        environment as it was.

        Raises:
            TypeError: Not a :class:`Snapshot`.
            ValueError: A malformed field (named), or a snapshot of another task, model
                structure or randomisation than this env's (both signatures named).
        """
        check_structure(snapshot, self.model_signature, self.task.name)
        tokens = check_snapshot(snapshot, self._state_size, self.task.check_state)
        check_randomization_signature(snapshot, self.randomization_signature())
        self._write(snapshot, tokens)

    def _reset_to(self, snapshot: Any, seed: int | None) -> None:
        """``reset(options={"snapshot": ...})``: re-apply the snapshot's randomised parameters
        (checked first), then restore it; a refused snapshot leaves the previous ones."""
        if not isinstance(snapshot, Snapshot):
            raise ValueError(f"options['snapshot'] is a {type(snapshot).__name__}; "
                             "expected a tasks.Snapshot from env.unwrapped.snapshot()")
        check_structure(snapshot, self.model_signature, self.task.name)
        tokens = check_snapshot(snapshot, self._state_size, self.task.check_state)
        if snapshot.randomization is not self._randomizer.values:  # else checked and applied
            self._randomizer.check(snapshot.randomization)
        previous = self._randomizer.values
        self._randomizer.apply(snapshot.randomization)
        try:  # values that do not give the signature they were recorded with
            check_randomization_signature(snapshot, self.randomization_signature())
        except ValueError:
            self._randomizer.apply(previous)
            raise
        super().reset(seed=seed)
        self._write(snapshot, tokens)

    def _write(self, snapshot: Snapshot, tokens: np.ndarray) -> None:
        """Restore a checked snapshot; ``tokens``: its instruction's."""
        set_physics_state(self.model, self.data, snapshot.physics)
        state = dict(snapshot.task_state)
        self.steps, self.difficulty = int(state.pop("steps")), float(state.pop("difficulty"))
        self.levels, self._gripper_cmd = dict(state.pop("levels")), float(state.pop("gripper_cmd"))
        self.task.state = {key: plain_copy(value) for key, value in state.items()}
        self.instruction, self._tokens = self.task.state["instruction"], tokens
        self.np_random.bit_generator.state = plain_copy(snapshot.rng_state)
        self._needs_reset = False

    # ---------------------------------------------------------------------------- helpers
    def _set_fingers(self, command: float) -> None:
        span = scene.FINGER_OPEN - scene.FINGER_CLOSED
        opening = scene.FINGER_CLOSED + span * (1 - command) / 2
        self.data.ctrl[self._finger_ctrl_slice] = opening

    def _set_instruction(self, text: str) -> None:
        self.instruction = text
        self._tokens = language.tokenize(text)

    def set_gripper_position(self, position: np.ndarray) -> None:
        """Teleport the gripper and its mocap target (used at reset)."""
        q = self._gripper_qpos
        self.data.qpos[q:q + 3] = position
        self.data.qpos[q + 3:q + 7] = (1, 0, 0, 0)
        self.data.mocap_pos[self.mocap_id] = position
        for adr in self._finger_qpos:
            self.data.qpos[adr] = self.data.ctrl[self._finger_ctrl[0]]

    def set_free_body(self, joint: str, position, quat=(1, 0, 0, 0)) -> None:
        """Place a free-jointed object (qpos only; velocities are zero after reset); a resting
        object resized by domain randomisation still rests (``DomainRandomizer.lift``)."""
        adr = int(self.model.joint(joint).qposadr[0])
        self.data.qpos[adr:adr + 3] = position
        self.data.qpos[adr + 2] += self._randomizer.lift(self.model.joint(joint).bodyid[0])
        self.data.qpos[adr + 3:adr + 7] = quat

    @property
    def ee_position(self) -> np.ndarray:
        return self.data.site_xpos[self.ee_site]

    @property
    def finger_opening(self) -> float:
        """Distance between the fingers' inner faces, metres."""
        left, right = self._finger_qpos
        qpos = self.data.qpos
        return float(qpos[left] + qpos[right]) - 0.012

    def proprio(self) -> np.ndarray:
        v = self._gripper_qvel
        proprio = np.empty(PROPRIO_DIM, np.float32)
        proprio[:3] = self.data.site_xpos[self.ee_site]
        proprio[3:6] = self.data.qvel[v:v + 3]
        proprio[6] = self.finger_opening
        proprio[7] = self._gripper_cmd
        return proprio

    def _observe(self, safe: bool = False) -> dict[str, np.ndarray]:
        obs: dict[str, np.ndarray] = {}
        proprio = self.proprio()
        if safe:
            proprio = np.nan_to_num(proprio, nan=0.0, posinf=0.0, neginf=0.0)
        mode = self.config.obs_mode
        if mode != "pixels":
            task_state = self.task.observe(self)
            state = np.concatenate((proprio, task_state.astype(np.float32)))
            if safe:
                state = np.nan_to_num(state, nan=0.0, posinf=0.0, neginf=0.0)
            obs["state"] = state
        if mode != "state":
            obs["pixels"] = self._render_pixels(safe)
            obs["proprio"] = proprio
        obs["instruction"] = self._tokens.copy()
        return obs

    def _render_pixels(self, safe: bool) -> np.ndarray:
        size = int(self.config.image_size)
        if safe:
            return np.zeros((size, size, 3), np.uint8)
        return self._cameras.render(self.data, self._camera_id, size, size,
                                    self.config.render_quality)

    def _info(self, success: bool) -> dict[str, Any]:
        return {"is_success": bool(success), "difficulty": self.difficulty,
                "instruction": self.instruction, "steps": self.steps}

    def _unstable_count(self) -> int:
        number = self.data.warning.number
        return int(number[_BADQPOS]) + int(number[_BADQVEL]) + int(number[_BADQACC])

    def _physics_error(self, warnings_before: int) -> str | None:
        # MuJoCo checks positions, velocities and accelerations on every step; on NaN or a huge
        # value it warns and resets the data.
        if self._unstable_count() == warnings_before:
            return None
        return (f"MuJoCo found the simulation unstable (NaN, inf or huge qpos/qvel/qacc) and "
                f"reset it at t={self.data.time:.3f}s")

    def expert_action(self) -> np.ndarray:
        """The task's scripted expert action for the current state (privileged)."""
        return np.asarray(self.task.expert_action(self), dtype=np.float32)
