"""robosuite 1.5 tasks as ours: :class:`RobosuiteBackend` (Lift, Stack, Door with a Panda arm).

Each task is robosuite's own environment (``robosuite.make``), stepped by robosuite's own code:
its controllers, 20 Hz control over 25 MuJoCo steps of 2 ms, its shaped reward
(``reward_shaping=True``) and its ``_check_success()``. What we change:

- **Controller.** The Panda's default composite controller (``BASIC``) with its arm part replaced
  by robosuite's ``OSC_POSITION`` part config: the action is four numbers, ``dx, dy, dz`` in
  [-1, 1] (moving the end-effector goal by up to 5 cm per step from where the end effector is,
  along the robot base's axes, which for these tasks are the world's) and the gripper, of which
  robosuite's ``GRIP`` controller with the Panda gripper reads only the sign: ``+1`` closes and
  ``-1`` opens (as our tasks' gripper command), each finger's command ramping 0.2 per step. The
  hand's orientation is not commanded: at each step robosuite 1.5's position-only OSC takes the
  orientation the hand has as its goal (so contacts may turn the hand, slowly).
- **Randomness.** Every random number of a reset (object placement, the arm's initial joint noise)
  is drawn from our env's generator: robosuite draws them from ``env.rng`` and its placement
  sampler's ``rng``, which the backend points at ours before each reset. The model itself is built
  once with a fixed robosuite seed (Lift draws its cube's size when it builds the model), and
  ``hard_reset=False`` keeps that model for every episode.
- **Difficulty** below 1 shrinks the placement sampler's x, y and rotation ranges around their
  centres and the arm's joint noise by the same factor (1 is robosuite's own distribution). Where
  two objects are placed (Stack), the x and y ranges keep a half-width of at least the sum of the
  objects' radii, so that they still fit apart.
- **Episodes** never end inside robosuite (``ignore_done=True``, a huge horizon): our env counts
  steps (:data:`EPISODE_STEPS`).
- **Observation.** robosuite's own sensors (its "observables"), evaluated after each step (the
  values its ``step`` returns): the robot's proprioception (joint positions, their cosines and
  sines, velocities, accelerations, end-effector position and both quaternions, finger positions
  and velocities: 50 numbers) followed by the task's object state (Lift 10, Stack 23, Door 14
  numbers), in the layout of robosuite's ``robot0_proprio-state`` and ``object-state``
  (:attr:`RobosuiteBackend.layout`). robosuite's observable objects themselves are disabled:
  their per-MuJoCo-step sampling bookkeeping costs time and would be state for snapshots.
- **Rendering.** robosuite doubles each collision geom (group 0) with a visual one and draws only
  the visual ones; the backend moves the collision geoms to a group our cameras hide.
- **Expert.** A scripted controller of our own on privileged state, whose phase is read from that
  state (:meth:`RobosuiteBackend.expert_action`).

Snapshots carry, besides the physics and robosuite's env attributes: the door's placement (Door's
reset writes it into the model's body pose), the arm and gripper controllers' goals and the
episode's initial joint configuration (the arm's nullspace target), the gripper's ramped command,
the robot's recent-value buffers (the last action among them), and our cached observation.

robosuite 1.5 runs on MuJoCo 3.3.x (not 4.0): ``make suites``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, ClassVar

import mujoco
import numpy as np

from tasks.snapshot import plain_copy
from tasks.suites.adapter import SuiteBackend, SuiteError

TASKS: tuple[str, ...] = ("Lift", "Stack", "Door")
# The cameras of the three tasks' scenes.
CAMERAS: tuple[str, ...] = ("frontview", "birdview", "agentview", "sideview", "robot0_robotview",
                            "robot0_eye_in_hand")
# Our episode lengths; robosuite's own horizon (1000 steps = 50 s) is far longer than any of
# these needs. The expert lifts the cube in ~45 steps, stacks in ~85 and opens the door in ~100
# (at 20 Hz): 200 steps (10 s) leave a learner room for a slower, hesitant Lift; Stack adds a
# transport and a careful place, Door a latch to turn and an arc to pull, hence 300 (15 s).
EPISODE_STEPS: dict[str, int] = {"Lift": 200, "Stack": 300, "Door": 300}
# Instructions, in our vocabulary (tasks.language)
INSTRUCTIONS: dict[str, str] = {"Lift": "pick up the red cube",
                                "Stack": "place the red cube on the green cube",
                                "Door": "open the door"}
ROBOT = "Panda"
ARM = "right"  # the Panda's one arm, as robosuite's controllers name it
# robosuite's seed when it builds the model (Lift draws its cube's size from it) and places the
# objects once; not a small number, so that a fresh env's placement is not the one an episode
# from reset(seed=0) starts from, which would hide state a restore fails to carry (check_exact)
BUILD_SEED = 12345
COLLISION_GROUP, HIDDEN_GROUP = 0, 3  # geom groups: robosuite's collision geoms; one not drawn
# MuJoCo's warnings of a simulation that blew up (it resets the data itself when they fire)
PHYSICS_WARNINGS = (mujoco.mjtWarning.mjWARN_BADQACC, mujoco.mjtWarning.mjWARN_BADQPOS,
                    mujoco.mjtWarning.mjWARN_BADQVEL)
_LOGGER = "robosuite_logs"  # robosuite's logger (robosuite.utils.log_utils)

# Per-episode state robosuite keeps in Python objects outside the env object, by object: the
# controllers' goals and the episode's initial joint configuration (the arm's nullspace target),
# whether they must re-read the simulator, and the robot's recent-value buffers.
ARM_FIELDS = ("goal_pos", "goal_ori", "initial_joint", "initial_ref_pos", "initial_ref_ori_mat",
              "torques", "new_update")
GRIPPER_FIELDS = ("goal_qvel", "initial_joint", "torques", "new_update")
DELTA_BUFFER_FIELDS = ("current", "last")
RING_BUFFER_FIELDS = ("buf", "ptr", "_size")

# The scripted expert (metres, radians).
EXPERT_GAIN = 10.0  # action per metre of error: full speed from 10 cm away
APPROACH_HEIGHT = 0.06  # approach an object from this high above it
ALIGNED = 0.01  # horizontal error within which it descends
OPENING_MARGIN = 0.02  # open this much wider than the object before descending onto it
GRASP_HEIGHT_TOLERANCE = 0.01  # close once the grip site is this close to the object's height
MISSED_OPENING = 0.01  # fingers closer than this hold nothing
HOLD_DISTANCE = 0.03  # an object held is this close to the grip site
LIFT_HEIGHT = 0.2  # Lift: hold the cube this high over the table
CARRY_CLEARANCE = 0.04  # Stack: carry A this much higher than it rests on B
PLACED_DISTANCE = 0.015  # Stack: A this close (horizontally) over B ...
RELEASE_HEIGHT = 0.012  # ... and at most this high over its resting height is let go
# Door: the Panda's hand reaches 10 cm to either side of the grip site along the fingers' axis
# (world y, towards the door) and the handle stands 8 cm off the door, so the hand cannot come
# down round the handle without hitting the door. The expert presses the handle's end down with
# the open gripper's fingertip nearer the door until the latch frees the door, then pulls the
# door round its hinge by that fingertip's friction, still pressing.
FINGER_REACH = 0.043  # the open gripper's fingertip nearer the door, from the grip site (-y)
LEVER_RADIUS = 0.14  # press the handle this far from its axis (its end is at 0.15)
LEVER_CLEARANCE = 0.032  # the fingertip's centre above the handle's centre line on touching it
PRESS_TURN = 0.3  # press towards the handle's point this much further round its axis
LATCH_PRESSED = 0.05  # the handle turned this far is being pressed
LATCH_OPEN = 1.3  # ... and this far (of its 1.57) frees the door (measured)
DOOR_MOVING = 0.02  # the door opened this far is being pulled
PULL_TURN = 0.2  # pull towards the handle's place this much further round the hinge
PULL_PRESS = 0.05  # ... still pressing this far along the handle's turn


@contextlib.contextmanager
def _quiet_robosuite() -> Iterator[None]:
    """Silence robosuite's INFO and WARNING log lines (missing private macros, optional robot
    packages, which controller file it loaded) while it is imported and builds a task."""
    logger = logging.getLogger(_LOGGER)

    def errors_only(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR

    logger.addFilter(errors_only)
    try:
        yield
    finally:
        logger.removeFilter(errors_only)


def controller_config() -> dict[str, Any]:
    """The Panda's default composite controller config with ``OSC_POSITION`` for its arm."""
    from robosuite.controllers import (
        load_composite_controller_config,
        load_part_controller_config,
    )

    config = load_composite_controller_config(robot=ROBOT)
    arm = load_part_controller_config(default_controller="OSC_POSITION")
    arm["gripper"] = {"type": "GRIP"}
    config["body_parts"][ARM] = arm
    return config


def _fields(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """``obj``'s attributes ``names`` (arrays copied, NumPy scalars as Python numbers)."""
    values = {}
    for name in names:
        value = getattr(obj, name)
        values[name] = value.item() if isinstance(value, np.generic) else plain_copy(value)
    return values


def _set_fields(obj: Any, values: dict[str, Any]) -> None:
    for name, value in values.items():
        setattr(obj, name, plain_copy(value))


def _rotate(vector: np.ndarray, axis: np.ndarray, angle: float) -> np.ndarray:
    """``vector`` turned by ``angle`` about the unit ``axis`` (Rodrigues)."""
    return (vector * np.cos(angle) + np.cross(axis, vector) * np.sin(angle)
            + axis * np.dot(axis, vector) * (1 - np.cos(angle)))


class RobosuiteBackend(SuiteBackend):
    """One robosuite task (:data:`TASKS`) with a Panda arm under position-only OSC.

    Args:
        name: The task, e.g. ``"Lift"``.

    Raises:
        SuiteError: An unknown task name.
    """

    suite: ClassVar[str] = "robosuite"
    default_camera: ClassVar[str] = "agentview"  # robosuite's camera of image observations
    # Door's reset places the door by writing its root body's pose into the model.
    model_fields: ClassVar[tuple[str, ...]] = ("body_pos", "body_quat")
    # configuration of the env object, set when it is built (or by our reset), not state
    static_attributes: ClassVar[frozenset[str]] = frozenset({
        "has_renderer", "has_offscreen_renderer", "render_camera", "render_collision_mesh",
        "render_visual_mesh", "render_gpu_device_id", "control_freq", "lite_physics", "horizon",
        "ignore_done", "hard_reset", "model_timestep", "control_timestep",
        "deterministic_reset", "renderer", "renderer_config", "seed", "viewer", "viewer_get_obs",
        "use_camera_obs", "use_object_obs", "camera_names", "camera_heights", "camera_widths",
        "camera_depths", "camera_segmentations", "num_cameras", "num_robots", "robot_names",
        "env_configuration", "reward_scale", "reward_shaping", "table_full_size",
        "table_friction", "table_offset", "use_latch", "_action_dim", "cube_body_id",
        "cubeA_body_id", "cubeB_body_id", "object_body_ids", "door_handle_site_id",
        "hinge_qpos_addr", "handle_qpos_addr",
    })

    def __init__(self, name: str) -> None:
        if name not in TASKS:
            raise SuiteError(f"robosuite task {name!r} is unknown; choose one of {list(TASKS)}")
        with _quiet_robosuite():
            import robosuite

            raw = robosuite.make(
                name, robots=ROBOT, controller_configs=controller_config(),
                has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False,
                use_object_obs=True, reward_shaping=True, horizon=10**9, ignore_done=True,
                hard_reset=False, seed=BUILD_SEED)
        self.name = name
        self.max_episode_steps = EPISODE_STEPS[name]
        self.raw = raw
        self.model: mujoco.MjModel = raw.sim.model._model
        self.data: mujoco.MjData = raw.sim.data._data
        self.robot = raw.robots[0]
        # Hide robosuite's visualisation sites as its reset does (it sets their alpha in the
        # model), so that a fresh env renders as one that has been reset.
        raw.visualize(vis_settings={setting: False for setting in raw._visualizations})
        # Our cameras would draw robosuite's collision geoms over their visual twins: hide them
        # (a geom's group changes nothing in the physics).
        self.model.geom_group[self.model.geom_group == COLLISION_GROUP] = HIDDEN_GROUP
        # We evaluate robosuite's sensors ourselves, once a step.
        for observable in raw._observables.values():
            observable.set_enabled(False)
        sensors = self._sensors()
        names = ([n for n, o in raw._observables.items() if o.modality.endswith("proprio")]
                 + [n for n, o in raw._observables.items() if o.modality == "object"])
        # where each of robosuite's sensors lies in observe()'s vector
        self.layout: dict[str, slice] = {}
        start = 0
        for sensor in names:
            self.layout[sensor] = slice(start, start + sensors[sensor].size)
            start += sensors[sensor].size
        sampler = raw.placement_initializer
        self._ranges = (tuple(sampler.x_range), tuple(sampler.y_range), sampler.rotation)
        radii = [float(obj.horizontal_radius) for obj in sampler.mujoco_objects]
        self._min_half_width = sum(radii) if len(radii) > 1 else 0.0
        self._noise = dict(self.robot.initialization_noise)
        self._eef_site = int(self.robot.eef_site_id[ARM])
        self._door_joints: list[int] = []  # Door: its latch and hinge joints
        if name == "Door":
            self._door_joints = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, joint)
                                 for joint in (raw.door.joints[1], raw.door.hinge_joint)]
        self._widen_gripper_command()
        self._read()

    def instruction_text(self) -> str:
        return INSTRUCTIONS[self.name]

    # ------------------------------------------------------------------------------- episode
    def reset(self, rng: np.random.Generator, difficulty: float) -> None:
        raw, sampler = self.raw, self.raw.placement_initializer
        # robosuite draws the arm's joint noise from env.rng and the placements from the
        # sampler's rng: both ours, whose state snapshots carry.
        raw.rng = sampler.rng = rng
        x_range, y_range, rotation = self._ranges
        if difficulty < 1.0:
            sampler.x_range = _shrink(x_range, difficulty, self._min_half_width)
            sampler.y_range = _shrink(y_range, difficulty, self._min_half_width)
            if not isinstance(rotation, (int, float)):  # a range (None: all angles)
                sampler.rotation = _shrink((0.0, 2 * np.pi) if rotation is None else rotation,
                                           difficulty, 0.0)
            self.robot.initialization_noise = {
                **self._noise, "magnitude": self._noise["magnitude"] * difficulty}
        try:
            raw.reset()
        finally:
            sampler.x_range, sampler.y_range, sampler.rotation = x_range, y_range, rotation
            self.robot.initialization_noise = dict(self._noise)
        self._widen_gripper_command()
        self._read()

    def step(self, action: np.ndarray) -> tuple[float, bool, str | None]:
        warnings = self.data.warning
        before = [int(warnings[w].number) for w in PHYSICS_WARNINGS]
        _, reward, _, _ = self.raw.step(np.asarray(action, np.float64))
        if [int(warnings[w].number) for w in PHYSICS_WARNINGS] != before or not (
                np.isfinite(self.data.qpos).all() and np.isfinite(self.data.qvel).all()):
            return 0.0, False, ("the simulation became unstable while robosuite stepped the "
                                "task (MuJoCo reset it)")
        self._read()
        return float(reward), self._success, None

    def is_success(self) -> bool:
        return self._success

    def observe(self) -> np.ndarray:
        return self._obs

    def proprio(self, gripper_cmd: float) -> np.ndarray:
        """Grip site position (3) and linear velocity (3), the fingers' joint separation (m; 0
        closed, 0.08 open) and ``gripper_cmd``."""
        return np.concatenate((self._proprio, [gripper_cmd]))

    def _widen_gripper_command(self) -> None:
        """robosuite resets the gripper's ramped command to one number, which the first step
        broadcasts to one per finger: start with one per finger (the same values), so that its
        shape, which restores check, never changes within an episode."""
        gripper = self.robot.gripper[ARM]
        fingers = len(self.robot._ref_joint_gripper_actuator_indexes[ARM])
        gripper.current_action = np.broadcast_to(gripper.current_action, (fingers,)).astype(
            np.float64)

    def _sensors(self) -> dict[str, np.ndarray]:
        """robosuite's sensors in the current simulator state, by observable name."""
        cache: dict[str, np.ndarray] = {}
        for name, observable in self.raw._observables.items():  # in order: they use the cache
            cache[name] = np.array(observable._sensor(cache), dtype=np.float64)
        return cache

    def _read(self) -> None:
        """Cache what the simulator state says after a reset or step: the observation, our
        proprio (end-effector position and velocity, finger opening), robosuite's success and,
        for the expert, the door's joint axes (anchor and direction of the latch, anchor of the
        hinge). Snapshots carry the cache: after a step the simulator's derived quantities
        (positions of bodies, contacts) lag its state by one MuJoCo step, which a restore
        recomputes, so they cannot be read again after one."""
        sensors = self._sensors()
        self._obs = np.concatenate([sensors[name].ravel() for name in self.layout])
        velocity = np.zeros(6)
        mujoco.mj_objectVelocity(self.model, self.data, mujoco.mjtObj.mjOBJ_SITE, self._eef_site,
                                 velocity, 0)
        fingers = sensors["robot0_gripper_qpos"]
        self._proprio = np.concatenate((sensors["robot0_eef_pos"], velocity[3:],
                                        [fingers[0] - fingers[1]]))
        self._success = bool(self.raw._check_success())
        self._axes = np.zeros(0)
        if self._door_joints:
            latch, hinge = self._door_joints
            data = self.data
            self._axes = np.concatenate((data.xanchor[latch], data.xaxis[latch],
                                         data.xanchor[hinge]))

    # -------------------------------------------------------------------------------- expert
    def expert_action(self) -> np.ndarray:
        """A scripted expert on privileged state. Its phase is read from the state each step
        (where the objects are, the fingers' opening, the gripper command of the last action),
        so it needs no memory of its own and carries on from whatever actions came before.

        - Lift: over the cube, down, close, up (and open and retry after a missed grasp).
        - Stack: pick the red cube (A) as in Lift, carry it up and over the green cube (B),
          lower it onto B, open and back up.
        - Door: with the gripper open, over the handle's end, press it down and round until the
          latch frees the door, then pull the door round its hinge, still pressing.
        """
        return {"Lift": self._lift, "Stack": self._stack, "Door": self._door}[self.name]()

    def _get(self, sensor: str) -> np.ndarray:
        return self._obs[self.layout[sensor]]

    def _towards(self, target: np.ndarray, grip: float) -> np.ndarray:
        """Move the end effector towards ``target``."""
        move = np.clip(EXPERT_GAIN * (target - self._get("robot0_eef_pos")), -1.0, 1.0)
        return np.append(move, grip)

    def _closing(self) -> bool:
        """The last action closed the gripper (robosuite keeps it in ``robot.recent_actions``)."""
        return float(self.robot.recent_actions.current[-1]) > 0

    def _holding(self, obj: np.ndarray) -> bool:
        """Closing, its ramped command saturated, the fingers stopped on something at the grip
        site."""
        ramped = float(self.robot.gripper[ARM].current_action[-1])  # +1: closed
        return (self._closing() and ramped >= 1.0 and self._proprio[6] > MISSED_OPENING
                and float(np.linalg.norm(obj - self._get("robot0_eef_pos"))) < HOLD_DISTANCE)

    def _pick(self, obj: np.ndarray, width: float) -> np.ndarray:
        """Towards grasping the object at ``obj`` (``width`` across) from where the gripper is:
        approach, descent, closing, and a retry after a missed grasp."""
        eef = self._get("robot0_eef_pos")
        offset = obj - eef
        if self._closing():
            if self._proprio[6] < MISSED_OPENING:  # closed on nothing: open, back up
                return self._towards(eef + [0.0, 0.0, APPROACH_HEIGHT], -1.0)
            if np.linalg.norm(offset) < HOLD_DISTANCE:  # close on it, where it is
                return self._towards(eef, 1.0)
            return self._towards(obj + [0.0, 0.0, APPROACH_HEIGHT], -1.0)
        if np.linalg.norm(offset[:2]) > ALIGNED:  # over it, at the approach height
            return self._towards(obj + [0.0, 0.0, APPROACH_HEIGHT], -1.0)
        if self._proprio[6] < width + OPENING_MARGIN:  # wait for the fingers to open
            return self._towards(eef, -1.0)
        if offset[2] < -GRASP_HEIGHT_TOLERANCE:  # down to it
            return self._towards(obj, -1.0)
        return self._towards(obj, 1.0)  # close

    def _lift(self) -> np.ndarray:
        cube = self._get("cube_pos")
        if self._holding(cube):
            eef = self._get("robot0_eef_pos")
            table = float(self.raw.table_offset[2])
            return self._towards(np.array([eef[0], eef[1], table + LIFT_HEIGHT]), 1.0)
        return self._pick(cube, 2 * float(max(self.raw.cube.size[:2])))

    def _stack(self) -> np.ndarray:
        eef, a, b = self._get("robot0_eef_pos"), self._get("cubeA_pos"), self._get("cubeB_pos")
        resting = float(self.raw.cubeA.size[2] + self.raw.cubeB.size[2])  # A's centre over B's
        apart, above = float(np.linalg.norm(a[:2] - b[:2])), float(a[2] - b[2])
        if apart < PLACED_DISTANCE and resting - 0.01 < above < resting + RELEASE_HEIGHT:
            return self._towards(a + [0.0, 0.0, APPROACH_HEIGHT], -1.0)  # let go, back up
        if not self._holding(a):
            return self._pick(a, 2 * float(max(self.raw.cubeA.size[:2])))
        carry = resting + CARRY_CLEARANCE
        if apart > ALIGNED:  # up first, then over B
            goal = np.array([b[0], b[1], b[2] + carry]) if above > carry - 0.02 \
                else np.array([a[0], a[1], b[2] + carry])
        else:  # down onto B
            goal = np.array([b[0], b[1], b[2] + resting])
        return self._towards(eef + goal - a, 1.0)

    def _door(self) -> np.ndarray:
        handle = self._get("handle_pos")
        hinge, latch = float(self._get("hinge_qpos")[0]), float(self._get("handle_qpos")[0])
        latch_anchor, latch_axis, hinge_anchor = self._axes[0:3], self._axes[3:6], self._axes[6:9]
        finger = np.array([0.0, -FINGER_REACH, 0.0])  # the fingertip from the grip site
        # the handle's centre line: from its root on the latch axis, along `lever`
        relative = handle - latch_anchor
        root = latch_anchor + latch_axis * np.dot(latch_axis, relative)
        lever = (handle - root) / np.linalg.norm(handle - root)
        turning = np.cross(latch_axis, lever)  # how the handle's end moves as the latch turns
        if latch >= LATCH_OPEN or hinge >= DOOR_MOVING:  # pull round the hinge, pressing
            radius = handle - hinge_anchor
            radius[2] = 0.0
            goal = hinge_anchor + _rotate(radius, np.array([0.0, 0.0, 1.0]), PULL_TURN)
            goal[2] = handle[2]
            return self._towards(goal + PULL_PRESS * turning - finger, -1.0)
        touch = root + LEVER_RADIUS * lever - LEVER_CLEARANCE * turning
        tip = self._get("robot0_eef_pos") + finger
        if latch >= LATCH_PRESSED or np.linalg.norm((tip - touch)[:2]) <= ALIGNED:  # press
            goal = root + LEVER_RADIUS * _rotate(lever, latch_axis, PRESS_TURN)
            return self._towards(goal - finger, -1.0)
        above = touch + [0.0, 0.0, APPROACH_HEIGHT]
        if tip[2] < above[2] - 0.02:  # up first, then over the handle's end
            above[:2] = tip[:2]
        return self._towards(above - finger, -1.0)

    # ------------------------------------------------------------------ state of the raw env
    def _objects(self) -> dict[str, tuple[Any, tuple[str, ...]]]:
        """robosuite's Python objects that keep per-episode state, and which of their fields."""
        robot = self.robot
        controllers = robot.composite_controller.part_controllers
        objects = {"arm": (controllers[ARM], ARM_FIELDS),
                   "gripper_controller": (controllers[f"{ARM}_gripper"], GRIPPER_FIELDS),
                   # the ramped finger command (GripperModel.format_action)
                   "gripper": (robot.gripper[ARM], ("current_action",)),
                   "robot": (robot, ("base_pos", "base_ori"))}
        # (recent_torques only ever holds None: robosuite's robot never sets its torques)
        for key in ("recent_qpos", "recent_actions"):
            objects[key] = (getattr(robot, key), DELTA_BUFFER_FIELDS)
        for key in ("recent_ee_forcetorques", "recent_ee_pose", "recent_ee_vel",
                    "recent_ee_acc"):
            objects[key] = (getattr(robot, key)[ARM], DELTA_BUFFER_FIELDS)
        objects["recent_ee_vel_buffer"] = (robot.recent_ee_vel_buffer[ARM], RING_BUFFER_FIELDS)
        return objects

    def attributes(self) -> dict[str, Any]:
        values = super().attributes()
        values["robosuite"] = {key: _fields(obj, names)
                               for key, (obj, names) in self._objects().items()}
        values["adapter_obs"], values["adapter_proprio"] = self._obs.copy(), self._proprio.copy()
        values["adapter_axes"], values["adapter_success"] = self._axes.copy(), self._success
        return values

    def set_attributes(self, values: dict[str, Any]) -> None:
        values = dict(values)
        objects = self._objects()  # (robosuite makes new controllers at each reset)
        for key, fields in values.pop("robosuite").items():
            _set_fields(objects[key][0], fields)
        self._obs = np.array(values.pop("adapter_obs"))
        self._proprio = np.array(values.pop("adapter_proprio"))
        self._axes = np.array(values.pop("adapter_axes"))
        self._success = bool(values.pop("adapter_success"))
        super().set_attributes(values)


def _shrink(bounds: Any, difficulty: float, min_half: float) -> tuple[float, float]:
    """``bounds`` scaled by ``difficulty`` around their centre, to a half-width of at least
    ``min_half`` (or their own, if smaller)."""
    low, high = float(min(bounds)), float(max(bounds))
    centre, half = (low + high) / 2, (high - low) / 2
    half = max(half * difficulty, min(min_half, half))
    return (centre - half, centre + half)
