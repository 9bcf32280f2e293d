"""Domain randomisation: its options (:class:`RandomizationConfig`) and the sampler that draws
and applies them to one compiled model (:class:`DomainRandomizer`).

Everything is drawn from the environment's ``np_random`` at reset, and the drawn values travel in
snapshots, so a restored episode sees the very same model. The parameters added for sim-to-real
work (object size, field of view, camera rotation, light direction and count, table and
background colours, procedural textures) are off by default even with the block enabled, and
draw nothing from the RNG while off, so enabling the block randomises what it always did.
Procedural textures and extra lights are scene parts built with the model
(:mod:`tasks.textures`); the rest changes model arrays in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

# Scale ranges [low, high] (multiplicative, 1 = nominal): what a reset's ``randomization``
# option, and so automatic domain randomisation, may set.
RANGE_KEYS = ("friction", "mass", "damping", "light", "object_size", "fovy")
# Largest scale of each range (object_size: a cube 1.5 times larger still rests with its centre
# below push's 3 cm "on the table" height; fovy: the widest camera, 75 degrees, stays < 180).
RANGE_MAX = {"object_size": 1.5, "fovy": 2.0}
MAX_LIGHTS = 8
# Model arrays the block has always changed; the others enter the signature only when changed,
# so snapshots written before they existed still restore.
_LEGACY_ARRAYS = ("geom_friction", "body_mass", "dof_damping", "light_diffuse", "geom_rgba",
                  "cam_pos")
_RGB = int(mujoco.mjtTextureRole.mjTEXROLE_RGB)
# What a value of each parameter may be (DomainRandomizer.check): the nominal ones scaled by a
# positive factor unless named here.
_SCALED = "the nominal values' signs, scaled by a positive factor"
_RULES = {"geom_rgba": "colours in [0, 1]", "light_active": "0 or 1 per light",
          "mat_texid": "texture ids in [-1, ntex)", "cam_quat": "quaternions",
          "light_dir": "directions", "cam_pos": "positions", "mat_texrepeat": "tiling scales >= 0",
          "geom_size": f"{_SCALED}, at most {RANGE_MAX['object_size']} times",
          "cam_fovy": f"{_SCALED}, at most {RANGE_MAX['fovy']} times, under 180 degrees"}
_MAX_SCALE = {"geom_size": RANGE_MAX["object_size"], "geom_rbound": RANGE_MAX["object_size"],
              "geom_aabb": RANGE_MAX["object_size"], "cam_fovy": RANGE_MAX["fovy"]}


@dataclass(frozen=True)
class RandomizationConfig:
    """Domain randomisation, off by default. Each range is a multiplicative scale ``[lo, hi]``
    around the nominal value; the other fields give their unit.

    Attributes:
        enabled: Master switch; nothing is randomised when False.
        friction: Scale of every geom's sliding friction.
        mass: Scale of the object bodies' masses.
        damping: Scale of joint damping (fingers, drawer).
        light: Scale of the lights' diffuse intensity.
        colour_jitter: Uniform noise added to object colours (RGB units).
        camera_jitter: Uniform noise added to the positions of the cameras not on the gripper
            (metres, per axis).
        object_size: Scale of each free object's size (one draw per object; at most 1.5). Mass
            is unchanged (``mass`` scales it); a resting object is raised or lowered so that it
            still rests where the nominal one would (:meth:`DomainRandomizer.lift`). Off: (1, 1).
        fovy: Scale of every camera's vertical field of view (intrinsics; at most 2). Off: (1, 1).
        camera_rotation: The cameras not on the gripper turn by a rotation vector uniform in
            ``[-a, a]`` per axis (radians); with ``camera_jitter`` this is the pose jitter. Off: 0.
        light_direction: Each light's direction turns likewise (radians). Off: 0.
        light_count: ``(low, high)``: a number of lights uniform in that range is switched on,
            chosen at random among the scene's two and the extra ones built up to ``high``
            (at most 8); ``None`` (off) keeps the two.
        table_colour: Uniform noise added to the table's RGB (RGB units). Off: 0.
        background_colour: Uniform noise added to the floor's RGB, what is seen around the
            table (RGB units). Off: 0.
        textures: Procedural textures on the table and the floor: one of the textures built
            with the model (:mod:`tasks.textures`) and a tiling scale in [1, 4] per reset.
        texture_set: Which set of textures is built (an integer >= 0; each set is drawn from
            its own seed). Train on set 0 and test on set 1 for textures never seen in training.
    """

    enabled: bool = False
    friction: tuple[float, float] = (0.7, 1.3)
    mass: tuple[float, float] = (0.7, 1.5)
    damping: tuple[float, float] = (0.7, 1.3)
    light: tuple[float, float] = (0.6, 1.4)
    colour_jitter: float = 0.08
    camera_jitter: float = 0.01
    object_size: tuple[float, float] = (1.0, 1.0)
    fovy: tuple[float, float] = (1.0, 1.0)
    camera_rotation: float = 0.0
    light_direction: float = 0.0
    light_count: tuple[int, int] | None = None
    table_colour: float = 0.0
    background_colour: float = 0.0
    textures: bool = False
    texture_set: int = 0

    def __post_init__(self) -> None:
        for name in RANGE_KEYS:
            object.__setattr__(self, name, check_range(name, getattr(self, name)))
        for name in ("colour_jitter", "camera_jitter", "table_colour", "background_colour",
                     "camera_rotation", "light_direction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 <= value < math.inf:
                raise ValueError(f"randomization.{name}={value!r}; expected a number >= 0")
        for name in ("camera_rotation", "light_direction"):
            if getattr(self, name) > math.pi:
                raise ValueError(f"randomization.{name}={getattr(self, name)!r} radians; "
                                 "expected at most pi")
        if self.light_count is not None:
            count = tuple(self.light_count)
            if len(count) != 2 or not all(isinstance(n, int) and not isinstance(n, bool)
                                          for n in count) \
                    or not 0 <= count[0] <= count[1] <= MAX_LIGHTS:
                raise ValueError(f"randomization.light_count={self.light_count!r}; expected "
                                 f"two integers 0 <= low <= high <= {MAX_LIGHTS}, or null")
            object.__setattr__(self, "light_count", count)
        if isinstance(self.texture_set, bool) or not isinstance(self.texture_set, int) \
                or self.texture_set < 0:
            raise ValueError(f"randomization.texture_set={self.texture_set!r}; expected an "
                             "integer >= 0")
        for name in ("enabled", "textures"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"randomization.{name}={getattr(self, name)!r}; expected true "
                                 "or false")

    def with_ranges(self, ranges: dict[str, Any] | None) -> RandomizationConfig:
        """The block of one episode whose ``ranges`` (keys of :data:`RANGE_KEYS`, e.g. chosen by
        automatic domain randomisation) replace the configured ones.

        The block is switched on; when it was off, every other parameter stays nominal.

        Raises:
            ValueError: A key that is not a range key, or a malformed range (both named).
        """
        if not ranges:
            return self
        unknown = sorted(set(ranges) - set(RANGE_KEYS))
        if unknown:
            raise ValueError(f"randomization ranges {unknown} are not randomisation ranges; "
                             f"ranges are {list(RANGE_KEYS)}")
        base = self if self.enabled else NOMINAL
        return dataclasses.replace(base, enabled=True, **dict(ranges))


def check_range(name: str, value: Any) -> tuple[float, float]:
    """A scale range ``(low, high)`` with ``0 < low <= high`` (and ``high <= RANGE_MAX``).

    Raises:
        ValueError: Naming the key and the value.
    """
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"randomization.{name}={value!r}; expected a range [low, high] of "
                         "two numbers") from None
    if not 0 < low <= high < math.inf:
        raise ValueError(f"randomization.{name}={(low, high)}; expected 0 < low <= high")
    if high > RANGE_MAX.get(name, math.inf):
        raise ValueError(f"randomization.{name}={(low, high)}; high may be at most "
                         f"{RANGE_MAX[name]}")
    return low, high


NOMINAL = RandomizationConfig(enabled=True, friction=(1.0, 1.0), mass=(1.0, 1.0),
                              damping=(1.0, 1.0), light=(1.0, 1.0), colour_jitter=0.0,
                              camera_jitter=0.0)


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
        free = int(mujoco.mjtJoint.mjJNT_FREE)
        self._free_bodies = np.array([b for b in self._object_bodies
                                      if m.jnt_type[m.body_jntadr[b]] == free], dtype=int)
        self._free_geoms = np.flatnonzero(np.isin(m.geom_bodyid, self._free_bodies))
        # Cameras that do not ride on the robot: on the world body or on a goal's mocap body.
        self._fixed_cameras = np.flatnonzero(
            (m.cam_bodyid == 0) | (m.body_mocapid[m.cam_bodyid] >= 0)
        )
        self._surfaces = {name: mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, name)
                          for name in ("table", "floor")}
        # Scene parts of tasks.textures: materials and textures named random_*.
        self._materials = [i for i in range(m.nmat) if _name(m, mujoco.mjtObj.mjOBJ_MATERIAL, i)
                           .startswith("random_")]
        self._textures = [i for i in range(m.ntex) if _name(m, mujoco.mjtObj.mjOBJ_TEXTURE, i)
                          .startswith("random_")]
        self.nominal = self._arrays()
        self.values: dict[str, Any] = {}  # the values applied now; empty: nominal
        self._signature: str | None = None  # of the arrays as apply() left them
        self._limits = self._limits_of()
        self._bounds: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}  # by keys

    def _arrays(self) -> dict[str, np.ndarray]:
        m = self.model
        return {
            "geom_friction": m.geom_friction.copy(),
            "body_mass": m.body_mass.copy(),
            "dof_damping": m.dof_damping.copy(),
            "light_diffuse": m.light_diffuse.copy(),
            "geom_rgba": m.geom_rgba.copy(),
            "cam_pos": m.cam_pos.copy(),
            "geom_size": m.geom_size.copy(),
            "geom_rbound": m.geom_rbound.copy(),  # the broad phase's bounds grow with the size
            "geom_aabb": m.geom_aabb.copy(),
            "cam_fovy": m.cam_fovy.copy(),
            "cam_quat": m.cam_quat.copy(),
            "light_dir": m.light_dir.copy(),
            "light_active": m.light_active.copy(),
            "mat_texid": m.mat_texid.copy(),
            "mat_texrepeat": m.mat_texrepeat.copy(),
        }

    def signature(self) -> str:
        """Hash of the model parameters that domain randomisation changes (the arrays added
        for sim-to-real work count only when they differ from nominal). Computed once per
        :meth:`apply`, the only writer of those arrays: every restore compares it."""
        if self._signature is None:
            self._signature = self._digest()
        return self._signature

    def _digest(self) -> str:
        digest = hashlib.sha1()
        for key, nominal in self.nominal.items():
            array = getattr(self.model, key)
            # An array apply() did not write is nominal (it wrote it back), so is not compared.
            if key not in _LEGACY_ARRAYS and (key not in self.values
                                              or np.array_equal(array, nominal)):
                continue
            digest.update(key.encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()[:12]

    def ranges(self) -> tuple[str, ...]:
        """The keys of :data:`RANGE_KEYS` that change something in this model (``mass`` and
        ``object_size`` need objects, ``damping`` damped joints...)."""
        m = self.model
        present = {"friction": m.ngeom > 0, "mass": len(self._object_bodies) > 0,
                   "damping": bool(np.any(m.dof_damping > 0)), "light": m.nlight > 0,
                   "object_size": len(self._free_bodies) > 0, "fovy": m.ncam > 0}
        return tuple(key for key in RANGE_KEYS if present[key])

    def lift(self, body: int) -> float:
        """Metres to raise free ``body`` (negative: to lower it) so that, resized by
        ``object_size``, it rests where its nominal size would (0 when its size is nominal)."""
        geoms = self.model.geom_bodyid == body
        if "geom_aabb" not in self.values or not geoms.any():
            return 0.0
        return float(np.max(self.values["geom_aabb"][geoms, 5]
                            - self.nominal["geom_aabb"][geoms, 5]))

    def sample(self, r: RandomizationConfig, rng: np.random.Generator) -> dict[str, Any]:
        """Draw a full set of parameter values around the nominal ones: the arrays the block has
        always changed, and the others only when their option is on."""
        values = {key: self.nominal[key].copy() for key in _LEGACY_ARRAYS}
        values["geom_friction"][:, 0] *= rng.uniform(*r.friction)
        values["body_mass"][self._object_bodies] *= rng.uniform(*r.mass, len(self._object_bodies))
        values["dof_damping"] *= rng.uniform(*r.damping)
        values["light_diffuse"] *= rng.uniform(*r.light, (self.model.nlight, 1))
        rgb = values["geom_rgba"][self._object_geoms, :3]
        noise = rng.uniform(-r.colour_jitter, r.colour_jitter, rgb.shape)
        values["geom_rgba"][self._object_geoms, :3] = np.clip(rgb + noise, 0, 1)
        cams = self._fixed_cameras
        values["cam_pos"][cams] += rng.uniform(-r.camera_jitter, r.camera_jitter, (len(cams), 3))
        self._sample_scene(r, rng, values)
        return values

    def _sample_scene(self, r: RandomizationConfig, rng: np.random.Generator,
                      values: dict[str, Any]) -> None:
        """The parameters added for sim-to-real work, each drawn only when its option is on."""
        m, nominal = self.model, self.nominal
        if r.object_size != (1.0, 1.0):
            scale = rng.uniform(*r.object_size, m.nbody)[m.geom_bodyid[self._free_geoms]]
            for key, columns in (("geom_size", 3), ("geom_rbound", None), ("geom_aabb", 6)):
                values[key] = nominal[key].copy()
                factor = scale if columns is None else scale[:, None]
                values[key][self._free_geoms] *= factor
        if r.fovy != (1.0, 1.0):
            values["cam_fovy"] = nominal["cam_fovy"] * rng.uniform(*r.fovy, m.ncam)
        if r.camera_rotation > 0:
            cams = self._fixed_cameras
            values["cam_quat"] = nominal["cam_quat"].copy()
            for cam, turn in zip(cams, rng.uniform(-r.camera_rotation, r.camera_rotation,
                                                   (len(cams), 3)), strict=True):
                values["cam_quat"][cam] = _turned(nominal["cam_quat"][cam], turn)
        if r.light_direction > 0:
            turns = rng.uniform(-r.light_direction, r.light_direction, (m.nlight, 3))
            values["light_dir"] = np.array([_rotate(d, t) for d, t in
                                            zip(nominal["light_dir"], turns, strict=True)])
        if r.light_count is not None:
            count = int(rng.integers(r.light_count[0], r.light_count[1] + 1))
            values["light_active"] = np.zeros_like(nominal["light_active"])
            values["light_active"][rng.permutation(m.nlight)[:count]] = True
        for name, jitter in (("table", r.table_colour), ("floor", r.background_colour)):
            geom = self._surfaces[name]
            if jitter > 0 and geom >= 0:
                noise = rng.uniform(-jitter, jitter, 3)
                values["geom_rgba"][geom, :3] = np.clip(values["geom_rgba"][geom, :3] + noise,
                                                        0, 1)
        if r.textures and self._materials and self._textures:
            values["mat_texid"] = nominal["mat_texid"].copy()
            values["mat_texrepeat"] = nominal["mat_texrepeat"].copy()
            for mat in self._materials:
                values["mat_texid"][mat, _RGB] = self._textures[rng.integers(len(self._textures))]
                values["mat_texrepeat"][mat] = rng.uniform(1.0, 4.0, 2)

    def apply(self, values: dict[str, Any]) -> None:
        """Write ``values`` into the model; parameters they omit (all, for ``{}``) go nominal.
        Values from outside (a snapshot) go through :meth:`check` first.

        The very dict applied last (a group's attempts all restore one snapshot) is in the
        model already, and is not written again."""
        if values is self.values:
            return
        for key, nominal in self.nominal.items():
            getattr(self.model, key)[:] = values.get(key, nominal)
        self.values = values
        self._signature = None

    def check(self, values: Any) -> None:
        """Refuse parameter values that could not come from :meth:`sample` for this model,
        before any is written: whatever a file's digest says, a forged snapshot must not put
        NaN masses or a texture id past the model's textures into the simulator. One
        comparison against bounds made once per set of keys keeps a restore fast.

        Raises:
            ValueError: Naming the parameter, its shape and the rule it breaks.
        """
        if not isinstance(values, dict):
            raise ValueError(f"snapshot.randomization is a {type(values).__name__}; expected a "
                             "dict of model arrays")
        keys = tuple(values)
        if not keys:
            return  # every parameter nominal
        for key in keys:
            value, nominal = values[key], self.nominal.get(key)
            if nominal is None or not isinstance(value, np.ndarray) \
                    or value.shape != nominal.shape or value.dtype.kind not in "biuf":
                self._refuse(key, value)
        if keys not in self._bounds:
            self._bounds[keys] = tuple(np.concatenate([bound[key].ravel() for key in keys])
                                       for bound in self._limits)
        low, high = self._bounds[keys]
        flat = np.concatenate([values[key].ravel() for key in keys])
        inside = (flat >= low) & (flat <= high)  # NaN is in no range
        if not inside.all():
            edges = np.cumsum([values[key].size for key in keys])
            self._refuse(keys[int(np.searchsorted(edges, np.argmin(inside), "right"))], None)
        for key in ("mat_texid", "light_active"):
            if key in values and values[key].dtype.kind == "f" \
                    and not np.array_equal(values[key], np.round(values[key])):
                self._refuse(key, values[key])

    def _refuse(self, key: str, value: Any) -> None:
        nominal = self.nominal.get(key)
        if nominal is None:
            raise ValueError(f"snapshot.randomization[{key!r}] is not a randomised parameter; "
                             f"expected keys of {sorted(self.nominal)}")
        found = "values out of range" if value is None else (
            f"shape {np.shape(value)}, dtype {getattr(value, 'dtype', type(value).__name__)}")
        raise ValueError(f"snapshot.randomization[{key!r}] has {found}; expected a finite array "
                         f"of shape {nominal.shape} with {_RULES.get(key, _SCALED)}")

    def _limits_of(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Elementwise ``(low, high)`` of what :meth:`sample` can draw (``_RULES``)."""
        big, tiny = np.finfo(np.float64).max, np.finfo(np.float64).tiny
        fixed = {"geom_rgba": (0, 1), "light_active": (0, 1), "cam_pos": (-big, big),
                 "mat_texid": (-1, self.model.ntex - 1), "cam_quat": (-big, big),
                 "light_dir": (-big, big), "mat_texrepeat": (0, big)}
        low, high = {}, {}
        for key, nominal in self.nominal.items():
            if key in fixed:
                low[key], high[key] = (np.full(nominal.shape, bound, np.float64)
                                       for bound in fixed[key])
                continue
            top = _MAX_SCALE[key] * np.abs(nominal) * (1 + 1e-9) if key in _MAX_SCALE else big
            if key == "cam_fovy":
                top = np.minimum(top, np.nextafter(180.0, 0.0))
            low[key] = np.where(nominal > 0, tiny, np.where(nominal < 0, -top, 0.0))
            high[key] = np.where(nominal > 0, top, np.where(nominal < 0, -tiny, 0.0))
        return low, high


def _name(model: mujoco.MjModel, kind: mujoco.mjtObj, index: int) -> str:
    return mujoco.mj_id2name(model, kind, index) or ""


def _turned(quat: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """``quat`` turned by the rotation vector ``rotation`` (radians), in its own frame."""
    turned = quat.copy()
    mujoco.mju_quatIntegrate(turned, np.asarray(rotation, float), 1.0)
    return turned


def _rotate(vector: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """``vector`` turned by the rotation vector ``rotation`` (radians)."""
    quat, out = _turned(np.array([1.0, 0.0, 0.0, 0.0]), rotation), np.zeros(3)
    mujoco.mju_rotVecQuat(out, np.asarray(vector, float), quat)
    return out
