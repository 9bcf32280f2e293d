"""Domain randomisation: its options (:class:`RandomizationConfig`) and the sampler that draws
and applies them to one compiled model (:class:`DomainRandomizer`).

Everything is drawn from the environment's ``np_random`` at reset, and the drawn values travel in
snapshots, so a restored episode sees the very same model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np


@dataclass(frozen=True)
class RandomizationConfig:
    """Domain randomisation, off by default. Each range is a multiplicative scale ``[lo, hi]``
    around the nominal value except ``camera_jitter`` (metres) and ``colour_jitter`` (RGB units).

    Attributes:
        enabled: Master switch; nothing is randomised when False.
        friction: Scale of every geom's sliding friction.
        mass: Scale of the object bodies' masses.
        damping: Scale of joint damping (fingers, drawer).
        light: Scale of the lights' diffuse intensity.
        colour_jitter: Uniform noise added to object colours.
        camera_jitter: Uniform noise added to the positions of the cameras not on the gripper.
    """

    enabled: bool = False
    friction: tuple[float, float] = (0.7, 1.3)
    mass: tuple[float, float] = (0.7, 1.5)
    damping: tuple[float, float] = (0.7, 1.3)
    light: tuple[float, float] = (0.6, 1.4)
    colour_jitter: float = 0.08
    camera_jitter: float = 0.01

    def __post_init__(self) -> None:
        for name in ("friction", "mass", "damping", "light"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"randomization.{name}={(lo, hi)}; expected 0 < low <= high")
        for name in ("colour_jitter", "camera_jitter"):
            if getattr(self, name) < 0:
                raise ValueError(f"randomization.{name}={getattr(self, name)}; expected >= 0")


class DomainRandomizer:
    """Draws and applies randomised model parameters, keeping the nominal values to return to.

    Args:
        model: The compiled model; its arrays are changed in place.
        gripper_body: Body id of the gripper: it and its fingers are not objects.
    """

    def __init__(self, model: mujoco.MjModel, gripper_body: int) -> None:
        m = self.model = model
        self._object_bodies = np.array(
            [b for b in range(m.nbody) if m.body_jntnum[b] > 0 and b != gripper_body
             and m.body_parentid[b] != gripper_body], dtype=int,
        )
        self._object_geoms = np.flatnonzero(np.isin(m.geom_bodyid, self._object_bodies))
        # Cameras that do not ride on the robot: on the world body or on a goal's mocap body.
        self._fixed_cameras = np.flatnonzero(
            (m.cam_bodyid == 0) | (m.body_mocapid[m.cam_bodyid] >= 0)
        )
        self.nominal = self._arrays()
        self.values: dict[str, Any] = {}  # the values applied now; empty: nominal

    def _arrays(self) -> dict[str, np.ndarray]:
        m = self.model
        return {
            "geom_friction": m.geom_friction.copy(),
            "body_mass": m.body_mass.copy(),
            "dof_damping": m.dof_damping.copy(),
            "light_diffuse": m.light_diffuse.copy(),
            "geom_rgba": m.geom_rgba.copy(),
            "cam_pos": m.cam_pos.copy(),
        }

    def signature(self) -> str:
        """Hash of the model parameters that domain randomisation changes."""
        digest = hashlib.sha1()
        for key, array in self._arrays().items():
            digest.update(key.encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()[:12]

    def sample(self, r: RandomizationConfig, rng: np.random.Generator) -> dict[str, Any]:
        """Draw a full set of parameter values around the nominal ones."""
        values = {key: array.copy() for key, array in self.nominal.items()}
        values["geom_friction"][:, 0] *= rng.uniform(*r.friction)
        values["body_mass"][self._object_bodies] *= rng.uniform(*r.mass, len(self._object_bodies))
        values["dof_damping"] *= rng.uniform(*r.damping)
        values["light_diffuse"] *= rng.uniform(*r.light, (self.model.nlight, 1))
        rgb = values["geom_rgba"][self._object_geoms, :3]
        noise = rng.uniform(-r.colour_jitter, r.colour_jitter, rgb.shape)
        values["geom_rgba"][self._object_geoms, :3] = np.clip(rgb + noise, 0, 1)
        cams = self._fixed_cameras
        values["cam_pos"][cams] += rng.uniform(-r.camera_jitter, r.camera_jitter, (len(cams), 3))
        return values

    def apply(self, values: dict[str, Any]) -> None:
        """Write ``values`` into the model; parameters they omit (all, for ``{}``) go nominal."""
        for key, nominal in self.nominal.items():
            getattr(self.model, key)[:] = values.get(key, nominal)
        self.values = values
