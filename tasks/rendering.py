"""Headless rendering: backend choice, a fast camera renderer and an environment's cameras.

MuJoCo reads ``MUJOCO_GL`` when it is first imported, so :func:`choose_gl_backend` runs from
``tasks/__init__.py`` before anything imports ``mujoco``. It keeps a value the user set, else picks
EGL when ``libEGL`` is present (Mesa llvmpipe here), else OSMesa.

Learning cameras render without shadows, reflections, skybox or anti-aliasing: on Mesa llvmpipe a
shadow-casting light drops an 84x84 frame from ~2,000 to ~40 frames/s and multisampling halves the
rate again. ``quality="high"`` turns them back on for videos and visual randomisation.
"""

from __future__ import annotations

import ctypes.util
import os
import re
import sys
import warnings
from typing import Any

import numpy as np


def choose_gl_backend() -> str:
    """Set ``MUJOCO_GL`` (and ``PYOPENGL_PLATFORM``) if unset; return the backend in use."""
    backend = os.environ.get("MUJOCO_GL")
    if not backend and "mujoco" in sys.modules:
        warnings.warn(
            "mujoco was imported before tasks with MUJOCO_GL unset, so it chose a windowed GL "
            "backend and headless rendering will fail; import tasks first or set MUJOCO_GL=egl",
            stacklevel=3,
        )
    if not backend:
        if ctypes.util.find_library("EGL"):
            backend = "egl"
        elif ctypes.util.find_library("OSMesa"):
            backend = "osmesa"
        else:
            backend = "egl"  # fails later with MuJoCo's own message if no library is there
        os.environ["MUJOCO_GL"] = backend
    os.environ.setdefault("PYOPENGL_PLATFORM", backend if backend in ("egl", "osmesa") else "")
    if not os.environ["PYOPENGL_PLATFORM"]:
        del os.environ["PYOPENGL_PLATFORM"]
    return backend


QUALITIES = ("fast", "high")


class CameraRenderer:
    """Renders RGB frames of a fixed size from named cameras of one model.

    Args:
        model: The compiled model.
        height: Frame height in pixels.
        width: Frame width in pixels.
        quality: ``"fast"`` (no shadows, reflections, skybox or anti-aliasing) or ``"high"``.

    Raises:
        ValueError: Unknown quality, or a size larger than the model's offscreen buffer.
        RuntimeError: No OpenGL context could be created (names the backend and the fix).
    """

    def __init__(self, model, height: int, width: int, quality: str = "fast") -> None:
        import mujoco

        if quality not in QUALITIES:
            raise ValueError(f"render_quality={quality!r}; expected one of {QUALITIES}")
        offsamples = model.vis.quality.offsamples
        if quality == "fast":
            model.vis.quality.offsamples = 0  # read when the GL context is made
        try:
            self._renderer = mujoco.Renderer(model, height=height, width=width)
        except Exception as error:  # the backends raise several unrelated types
            backend = os.environ.get("MUJOCO_GL")
            raise RuntimeError(
                f"could not create an OpenGL context with MUJOCO_GL={backend!r}: {error}. "
                "Install the headless libraries (apt-get install libegl1 libgl1 libosmesa6) "
                "or set MUJOCO_GL=osmesa before importing tasks."
            ) from error
        finally:
            model.vis.quality.offsamples = offsamples
        self._quality = quality
        self._scene_option = mujoco.MjvOption()
        self._scene_option.geomgroup[5] = 0  # helper sites and mocap handles stay invisible
        self._scene_option.sitegroup[5] = 0
        flags = self._renderer.scene.flags
        high = quality == "high"
        flags[mujoco.mjtRndFlag.mjRND_SHADOW] = high
        flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = high
        flags[mujoco.mjtRndFlag.mjRND_SKYBOX] = high

    def render(self, data, camera: str | int):
        """Render one frame; returns a new ``uint8`` array of shape ``(height, width, 3)``."""
        self._renderer.update_scene(data, camera=camera, scene_option=self._scene_option)
        return self._renderer.render()

    def close(self) -> None:
        self._renderer.close()


CAMERA_NAME = re.compile(r"[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*")


def check_camera_name(camera: Any) -> str:
    """A camera name is ``view[+view...]`` of plain names (letters, digits, ``_``): it ends up
    in file names (``<task>_<camera>.pt``), so ``x/../..`` never gets through.

    Raises:
        ValueError: Naming the value.
    """
    if not isinstance(camera, str) or not CAMERA_NAME.fullmatch(camera):
        raise ValueError(f"camera={camera!r} is not a camera name: expected names of letters, "
                         "digits and '_', joined by '+' (e.g. front, goal+goal_side)")
    return camera


def camera_views(camera: str) -> tuple[str, ...]:
    """The cameras a camera name stands for: ``"front+side"`` -> ``("front", "side")``.

    Several cameras joined by ``+`` are rendered side by side (:meth:`Cameras.render_views`) for
    multi-view success detectors.
    """
    return tuple(camera.split("+"))


class Cameras:
    """The named cameras of one model, with a renderer per frame size and quality made on first
    use and kept until :meth:`close`.

    Args:
        model: The compiled model.
    """

    def __init__(self, model) -> None:
        import mujoco

        self.model = model
        self.names = tuple(
            mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)
        )
        self._renderers: dict[tuple[int, int, str], CameraRenderer] = {}
        # Each camera's mount as built, before any randomisation moves it: the body it rides
        # on, its pose in that body's frame (metres, unit quaternion wxyz) and its vertical field
        # of view (degrees). Rounded so that the same code gives equal records on any machine.
        self._mounts = {
            name: {
                "body": mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY,
                                          int(model.cam_bodyid[i])) or "world",
                "pos": [round(float(v), 6) for v in model.cam_pos[i]],
                # q and -q are one orientation: record the one with w >= 0
                "quat": [round(float(v), 6) + 0.0 for v in
                         np.copysign(1.0, model.cam_quat[i][0]) * model.cam_quat[i]],
                "fovy": round(float(model.cam_fovy[i]), 4),
            }
            for i, name in enumerate(self.names)
        }

    def mounts(self, camera: str) -> list[dict]:
        """Where each view of ``camera`` (``"front+wrist"``) is mounted, as built: one
        ``{"camera", "body", "pos", "quat", "fovy"}`` per view, left to right.

        Detector data and checkpoints record it, so that a detector trained on frames of a
        camera mounted elsewhere (an older scene, another cell) is refused rather than misread.

        Raises:
            ValueError: A name that is not one of the model's cameras.
        """
        views = camera_views(camera)
        unknown = [view for view in views if view not in self.names]
        if unknown:
            raise ValueError(f"camera={camera!r}: {unknown} not among {self.names}")
        return [{"camera": view, **self._mounts[view]} for view in views]

    def render(self, data, camera: str | int, height: int, width: int, quality: str) -> np.ndarray:
        """One ``uint8 (height, width, 3)`` frame from one camera (name or id)."""
        key = (height, width, quality)
        if key not in self._renderers:
            self._renderers[key] = CameraRenderer(self.model, height, width, quality)
        return self._renderers[key].render(data, camera)

    def render_views(self, data, camera: str, size: int, quality: str) -> np.ndarray:
        """Square frames of the cameras ``camera`` names (``"front+overhead"``), rendered at the
        same instant and returned side by side, left to right: ``(size, n * size, 3)``.

        Raises:
            ValueError: A name that is not one of the model's cameras.
        """
        views = camera_views(camera)
        unknown = [view for view in views if view not in self.names]
        if unknown:
            raise ValueError(f"camera={camera!r}: {unknown} not among {self.names} "
                             "(join several with '+', e.g. 'front+overhead')")
        if len(views) > 1:
            return np.concatenate(
                [self.render(data, view, size, size, quality) for view in views], axis=1
            )
        return self.render(data, camera, size, size, quality)

    def close(self) -> None:
        """Free every renderer; later calls make new ones."""
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers = {}
