"""Scenes built in code from small parts with :class:`mujoco.MjSpec`.

Every task scene is a table, a mocap-driven parallel-jaw gripper, the task's objects, two or more
cameras and lights. Parts are plain functions that add to a spec, so a task composes its scene
instead of inheriting one. Coordinates: the table top is the plane ``z = 0``, the front camera looks
along ``+y``, the workspace is about ``[-0.25, 0.25]^2`` on the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

TABLE_HALF = (0.45, 0.45, 0.025)
CUBE_HALF = 0.02
FINGER_OPEN = 0.055  # joint position of a fully open finger (inner face at 0.049 m)
FINGER_CLOSED = 0.004
WRIST_CAMERA_POS = (-0.08, 0.0, 0.09)  # in the gripper's frame, beside the palm's narrow side
WRIST_CAMERA_TARGET = (0.02, 0.0, -0.02)  # just beyond the grasp point, near the table
PARK_Z = -0.25  # height under the table where unused objects wait, held by a weld

COLOURS: dict[str, tuple[float, float, float, float]] = {
    "red": (0.85, 0.15, 0.15, 1.0),
    "green": (0.2, 0.8, 0.25, 1.0),
    "blue": (0.15, 0.3, 0.9, 1.0),
    "yellow": (0.95, 0.85, 0.15, 1.0),
    "purple": (0.6, 0.25, 0.8, 1.0),
    "orange": (0.95, 0.55, 0.1, 1.0),
}


@dataclass(frozen=True)
class SceneOptions:
    """Physics options shared by every scene.

    Attributes:
        timestep: Physics step in seconds.
        substeps: Physics steps per control step (25 Hz control at the defaults).
    """

    timestep: float = 0.002
    substeps: int = 20


# Named physics presets (``tasks.make(..., physics=name)``). Both control at 25 Hz with the same
# integrator, solver, contact model and materials; "fast" takes 8 steps of 5 ms instead of 20 of
# 2 ms. A physics step costs about the same whatever its length, so this is ~2.3x as many push
# steps/s; contacts and welds keep their 0.02 s time constant (>= 2 timesteps, as MuJoCo asks).
# Trajectories differ from "default" (docs/tasks.md has the comparison).
PHYSICS: dict[str, SceneOptions] = {
    "default": SceneOptions(),
    "fast": SceneOptions(timestep=0.005, substeps=8),
}


def lookat_quat(pos: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Quaternion of a camera at ``pos`` looking at ``target`` with world ``+z`` up."""
    forward = np.asarray(target, float) - np.asarray(pos, float)
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    z_axis = -forward
    up = np.cross(z_axis, right)
    mat = np.stack([right, up, z_axis], axis=1)
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, mat.ravel())
    return quat


def new_spec(options: SceneOptions) -> mujoco.MjSpec:
    """An empty spec with our physics and visual defaults."""
    spec = mujoco.MjSpec()
    spec.option.timestep = options.timestep
    # MuJoCo 4.0.0's sparse-Jacobian solver has a bug fixed in 4.0.1; dense is exact and cheap here.
    spec.option.jacobian = mujoco.mjtJacobian.mjJAC_DENSE
    spec.option.cone = mujoco.mjtCone.mjCONE_PYRAMIDAL
    spec.option.impratio = 1.0
    spec.visual.global_.offwidth = 640
    spec.visual.global_.offheight = 480
    spec.visual.quality.shadowsize = 1024
    spec.visual.headlight.ambient = [0.3, 0.3, 0.3]
    spec.visual.headlight.diffuse = [0.4, 0.4, 0.4]
    return spec


def add_table(spec: mujoco.MjSpec) -> None:
    """A table whose top is the plane ``z = 0`` and a floor."""
    world = spec.worldbody
    world.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=TABLE_HALF,
        pos=[0, 0, -TABLE_HALF[2]],
        rgba=[0.62, 0.5, 0.38, 1],
        friction=[1.0, 0.005, 0.0001],
    )
    world.add_geom(
        name="floor",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[2, 2, 0.1],
        pos=[0, 0, -0.75],
        rgba=[0.35, 0.37, 0.4, 1],
        contype=0,
        conaffinity=0,
    )


def add_lights(spec: mujoco.MjSpec) -> None:
    """A key light (casts shadows in high render quality) and a fill light."""
    world = spec.worldbody
    world.add_light(
        name="key", pos=[0.3, -0.5, 1.2], dir=[-0.25, 0.4, -1], diffuse=[0.7, 0.7, 0.7],
        castshadow=True,
    )
    world.add_light(
        name="fill", pos=[-0.5, 0.2, 1.0], dir=[0.4, -0.1, -1], diffuse=[0.3, 0.3, 0.3],
        castshadow=False,
    )


def add_fixed_cameras(spec: mujoco.MjSpec) -> None:
    """Fixed cameras looking at the middle of the workspace.

    ``front`` and ``side`` show the whole scene from about 45 and 30 degrees up; ``overhead``
    looks down from about 70 degrees and frames just the work area, so at 84 x 84 a cube is
    about 9 pixels wide and the gripper hides less of what lies beneath it (the camera for
    learning from pixels).
    """
    world = spec.worldbody
    for name, pos, target, fovy in (
        ("front", [0.0, -0.5, 0.52], [0.0, 0.06, 0.0], 50),
        ("side", [0.62, 0.0, 0.38], [0.0, 0.0, 0.02], 50),
        ("overhead", [0.0, -0.2, 0.62], [0.0, 0.03, 0.0], 42),
    ):
        world.add_camera(name=name, pos=pos, quat=lookat_quat(pos, target), fovy=fovy)


def add_gripper(spec: mujoco.MjSpec, start: tuple[float, float, float] = (0, -0.05, 0.15)) -> None:
    """A free-floating parallel-jaw gripper welded to a mocap target.

    The gripper body's origin is the grasp point between the fingertips (site ``ee``). The
    policy moves the mocap body ``ee_target``; a soft weld pulls the gripper after it, so contacts
    stay physical. Fingers are slide joints along ``y`` driven by position actuators.
    """
    world = spec.worldbody
    target = world.add_body(name="ee_target", mocap=True, pos=start)
    target.add_geom(
        type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[0.005, 0, 0], contype=0, conaffinity=0,
        group=5, rgba=[1, 0, 0, 0.3],
    )
    gripper = world.add_body(name="gripper", pos=start, gravcomp=1.0)
    gripper.add_freejoint(name="gripper_free")
    gripper.add_geom(
        name="palm", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.02, 0.065, 0.008], pos=[0, 0, 0.058],
        rgba=[0.25, 0.25, 0.28, 1], mass=0.3,
    )
    gripper.add_geom(
        name="wrist", type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[0.015, 0.03, 0], pos=[0, 0, 0.095],
        rgba=[0.4, 0.4, 0.45, 1], mass=0.1,
    )
    gripper.add_site(name="ee", size=[0.006, 0, 0], rgba=[1, 0.5, 0, 0.6], group=5)
    # The wrist camera rides on the palm's narrow side, 8 cm out and 9 cm above the grasp
    # point, looking down between the fingers: what the fingers hold or push sits in the middle
    # of its image, and the table a few centimetres around it (the goal, at success) is in view.
    gripper.add_camera(
        name="wrist", pos=WRIST_CAMERA_POS, quat=lookat_quat(WRIST_CAMERA_POS, WRIST_CAMERA_TARGET),
        fovy=80,
    )
    for side, sign in (("left", 1.0), ("right", -1.0)):
        finger = gripper.add_body(name=f"finger_{side}", gravcomp=1.0)
        finger.add_joint(
            name=f"finger_{side}", type=mujoco.mjtJoint.mjJNT_SLIDE, axis=[0, sign, 0],
            range=[FINGER_CLOSED, FINGER_OPEN], damping=3.0, armature=0.001,
        )
        finger.add_geom(
            name=f"finger_{side}", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.012, 0.006, 0.033],
            pos=[0, 0, 0.018], rgba=[0.55, 0.55, 0.6, 1], mass=0.03, friction=[1.5, 0.01, 0.0001],
            condim=4,
        )
        spec.add_actuator(
            name=f"finger_{side}", target=f"finger_{side}",
            trntype=mujoco.mjtTrn.mjTRN_JOINT, ctrlrange=[FINGER_CLOSED, FINGER_OPEN],
            ctrllimited=True, forcerange=[-12, 12], forcelimited=True,
        ).set_to_position(kp=400.0, kv=4.0)
    spec.add_equality(
        name="ee_weld", type=mujoco.mjtEq.mjEQ_WELD, name1="ee_target", name2="gripper",
        objtype=mujoco.mjtObj.mjOBJ_BODY, solref=[0.02, 1.0],
        data=np.array([0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1.0, 0]),
    )


def add_cube(spec: mujoco.MjSpec, name: str, colour: str, parked_x: float,
             parkable: bool = False) -> None:
    """A free cube, created at its parking spot under the table; tasks place it at reset.

    With ``parkable``, a weld named ``park_<name>`` holds it at that spot while active: a task
    that does not use the cube in an episode switches the weld on (``data.eq_active``, which
    snapshots carry) instead of letting it rest on a shelf, because resting contacts cost the
    solver four times the rows of one weld.
    """
    parking = np.array([parked_x, 0.2, PARK_Z + CUBE_HALF])
    body = spec.worldbody.add_body(name=name, pos=parking)
    body.add_freejoint(name=name)
    if parkable:
        relpose = np.zeros(12)
        relpose[3:6] = parking  # the cube's pose in the world frame
        relpose[6] = 1.0
        relpose[10] = 1.0  # torque scale
        spec.add_equality(
            name=f"park_{name}", type=mujoco.mjtEq.mjEQ_WELD, name1="world", name2=name,
            objtype=mujoco.mjtObj.mjOBJ_BODY, data=relpose, active=False,
        )
    body.add_geom(
        name=name, type=mujoco.mjtGeom.mjGEOM_BOX, size=[CUBE_HALF] * 3, rgba=COLOURS[colour],
        mass=0.05, friction=[1.0, 0.01, 0.0001], condim=3,
    )


# Cameras riding on a goal marker, relative to it: (name suffix, position, field of view). Both
# frame about 16 x 16 cm around the goal, so 84 pixels span it at ~2 mm each.
GOAL_CAMERAS = (
    ("", (0.0, -0.12, 0.40), 22),     # 73 degrees up, from the front
    ("_side", (0.20, 0.0, 0.17), 34),  # 40 degrees up, from the right: under the gripper's palm
)


def add_marker(spec: mujoco.MjSpec, name: str, colour: str, radius: float = 0.025) -> None:
    """A visual-only goal marker on a mocap body, so moving it changes no model parameter.

    The body also carries the cameras of ``GOAL_CAMERAS``, named after it (``goal``,
    ``goal_side``): they move with the goal and frame the region around it, as a real reward
    camera is mounted over the place where success happens (success classifiers such as
    HIL-SERL's read a crop around that region). At 84 x 84 they resolve the cube's distance to
    the goal about four times finer than ``front``.
    """
    body = spec.worldbody.add_body(name=name, mocap=True, pos=[0, 0, 0.001])
    rgba = list(COLOURS[colour][:3]) + [0.55]
    body.add_geom(
        name=name, type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[radius, 0, 0], rgba=rgba,
        contype=0, conaffinity=0,
    )
    for suffix, pos, fovy in GOAL_CAMERAS:
        body.add_camera(
            name=name + suffix, pos=list(pos), quat=lookat_quat(pos, [0, 0, 0]), fovy=fovy,
        )


DRAWER_TRAVEL = 0.15
CABINET_POS = (0.0, 0.2, 0.0)


def add_cabinet(spec: mujoco.MjSpec) -> None:
    """A cabinet with one drawer sliding out along ``-y`` (towards the front camera).

    The drawer's joint ``drawer`` reads 0 when closed and ``DRAWER_TRAVEL`` when fully open. The
    handle is a bar on two posts; the gap behind it lets a finger hook it.
    """
    cx, cy, _ = CABINET_POS
    cabinet = spec.worldbody.add_body(name="cabinet", pos=[cx, cy, 0])
    wood = [0.45, 0.33, 0.22, 1]
    for name, size, pos in (
        ("cabinet_top", [0.13, 0.12, 0.01], [0, 0, 0.15]),
        ("cabinet_left", [0.01, 0.12, 0.075], [-0.12, 0, 0.075]),
        ("cabinet_right", [0.01, 0.12, 0.075], [0.12, 0, 0.075]),
        ("cabinet_back", [0.13, 0.01, 0.075], [0, 0.11, 0.075]),
    ):
        cabinet.add_geom(name=name, type=mujoco.mjtGeom.mjGEOM_BOX, size=size, pos=pos, rgba=wood)
    drawer = cabinet.add_body(name="drawer", pos=[0, -0.01, 0.07])
    drawer.add_joint(
        name="drawer", type=mujoco.mjtJoint.mjJNT_SLIDE, axis=[0, -1, 0],
        range=[0, DRAWER_TRAVEL], damping=2.0, frictionloss=0.05, armature=0.01,
    )
    drawer.add_geom(
        name="drawer_box", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.105, 0.1, 0.06],
        rgba=[0.7, 0.55, 0.38, 1], mass=0.5,
    )
    drawer.add_geom(
        name="drawer_front", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.11, 0.008, 0.065],
        pos=[0, -0.108, 0], rgba=[0.55, 0.42, 0.3, 1], mass=0.1,
    )
    for x in (-0.05, 0.05):
        drawer.add_geom(
            type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.006, 0.022, 0.006], pos=[x, -0.136, 0.02],
            rgba=[0.2, 0.2, 0.2, 1], mass=0.01,
        )
    drawer.add_geom(
        name="handle", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.065, 0.006, 0.006],
        pos=[0, -0.162, 0.02], rgba=[0.2, 0.2, 0.2, 1], mass=0.01,
    )
    drawer.add_site(name="handle", pos=[0, -0.162, 0.02], size=[0.005, 0, 0], group=5)
    # The joint keeps the drawer in its cabinet; skipping those contacts saves solver time.
    spec.add_exclude(bodyname1="cabinet", bodyname2="drawer")
