"""Headless rendering: backend choice, a fast camera renderer and an environment's cameras.

MuJoCo reads ``MUJOCO_GL`` when it is first imported, so :func:`choose_gl_backend` runs from
``tasks/__init__.py`` before anything imports ``mujoco``. It keeps a value the user set, else picks
EGL when ``libEGL`` is present (Mesa llvmpipe here), else OSMesa.

Learning cameras render without shadows, reflections, skybox or anti-aliasing: on Mesa llvmpipe a
shadow-casting light drops an 84x84 frame from ~2,000 to ~40 frames/s and multisampling halves the
rate again. ``quality="high"`` turns them back on for videos and visual randomisation.
"""

from __future__ import annotations

import atexit
import ctypes.util
import os
import re
import sys
import threading
import warnings
import weakref
from typing import Any

import numpy as np


def choose_gl_backend() -> str:
    """Set ``MUJOCO_GL`` (and ``PYOPENGL_PLATFORM``) if unset; return the backend in use.

    Also ``LP_NUM_THREADS=0`` if unset: Mesa's llvmpipe then rasterises in the calling thread
    instead of handing each frame to a thread per core, which costs more than it saves on
    small frames (an 84 px frame: about 1 ms against 2-2.5 ms with 2 threads; docs/results.md).
    """
    os.environ.setdefault("LP_NUM_THREADS", "0")
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


class _GLContexts(threading.local):
    """One OpenGL context per process and thread, shared by every renderer made there.

    ``mujoco.Renderer`` makes a context per renderer, and 64 environments in a rollout worker
    switched contexts at every frame; with one context the 2-worker pixel rollouts take 14-21%
    less time (docs/results.md, "Rendering"). Each renderer keeps its own MuJoCo context (its
    model's meshes, textures and offscreen buffer) inside the shared OpenGL one, so frames are
    unchanged.
    """

    context: Any = None
    pid: int = 0

    def get(self):
        if self.context is None or self.pid != os.getpid():  # a forked child makes its own
            try:
                from mujoco.rendering.classic import gl_context
            except ImportError:  # MuJoCo 3.3.x, which our range allows (the suites' venv)
                from mujoco import gl_context

            self.context, self.pid = gl_context.GLContext(_GL_SIZE, _GL_SIZE), os.getpid()
            # after the backend's own exit handler (registered with its first context), so
            # that ours runs first: exit handlers run last registered, first run
            atexit.register(_free_renderers)
        return self.context


_GL_SIZE = 64  # the context's own surface, unused: frames render into each renderer's buffer
_GL = _GLContexts()
_LIVE: weakref.WeakSet = weakref.WeakSet()  # freed at exit, before the GL display goes


def _current_context_getter():
    """A function giving the raw context current in this thread (EGL or OSMesa); one giving
    ``None`` (unknown: make the context current every time) for other backends."""
    backend = os.environ.get("MUJOCO_GL")
    try:
        if backend == "egl":
            from mujoco.egl import egl_ext

            return egl_ext.eglGetCurrentContext
        if backend == "osmesa":
            from OpenGL import osmesa

            return osmesa.OSMesaGetCurrentContext
    except Exception:  # an unusual build
        pass
    return lambda: None


_current_context = None  # resolved on first use, after MUJOCO_GL is settled


def _make_current(context) -> None:
    global _current_context
    if _current_context is None:
        _current_context = _current_context_getter()
    raw, current = getattr(context, "_context", None), _current_context()
    if raw and current and getattr(raw, "address", None) == getattr(current, "address", 0):
        return
    context.make_current()


def _scene_size(model) -> int:
    return 500 + 2 * (model.ngeom + model.nsite) + 100 * model.ntendon


def _free_renderers() -> None:
    for renderer in list(_LIVE):
        try:
            renderer.close()
        except Exception:  # a context current in another thread: the process ends anyway
            pass
    # and this thread's GL context, while the backend's display is still up (else MuJoCo
    # 3.3's EGL context, freed at interpreter teardown, prints a TypeError)
    context = _GL.context
    if context is not None and _GL.pid == os.getpid():
        _GL.context = None
        try:
            context.free()
        except Exception:
            pass


class CameraRenderer:
    """Renders RGB frames of a fixed size from named cameras of one model.

    All the renderers of a thread share one OpenGL context; each has its own MuJoCo context
    with an offscreen buffer of the frame's size and, in fast quality, no shadow map: about
    3 MB a renderer against ``mujoco.Renderer``'s 26 (its 640x480 buffer, a 1024 px shadow
    map and room for 10,000 geoms), with the very same pixels.

    Args:
        model: The compiled model.
        height: Frame height in pixels.
        width: Frame width in pixels.
        quality: ``"fast"`` (no shadows, reflections, skybox or anti-aliasing) or ``"high"``.

    Raises:
        ValueError: Unknown quality, or a camera the model does not have (at render).
        RuntimeError: No OpenGL context could be created (names the backend and the fix).
    """

    def __init__(self, model, height: int, width: int, quality: str = "fast") -> None:
        import mujoco

        if quality not in QUALITIES:
            raise ValueError(f"render_quality={quality!r}; expected one of {QUALITIES}")
        self._context, self._pid = None, os.getpid()
        try:
            self._gl = _GL.get()
            _make_current(self._gl)
        except Exception as error:  # the backends raise several unrelated types
            backend = os.environ.get("MUJOCO_GL")
            raise RuntimeError(
                f"could not create an OpenGL context with MUJOCO_GL={backend!r}: {error}. "
                "Install the headless libraries (apt-get install libegl1 libgl1 libosmesa6) "
                "or set MUJOCO_GL=osmesa before importing tasks."
            ) from error
        visual = model.vis
        # read when the MuJoCo context is made: a buffer of the frame's size; in fast quality
        # no multisampling and no shadow map (4 MB that nothing would draw into)
        sizes = {"offwidth": width, "offheight": height}
        quality_sizes = {"offsamples": 0, "shadowsize": 0} if quality == "fast" else {}
        saved = ({k: getattr(visual.global_, k) for k in sizes},
                 {k: getattr(visual.quality, k) for k in quality_sizes})
        try:
            for target, values in ((visual.global_, sizes), (visual.quality, quality_sizes)):
                for key, value in values.items():
                    setattr(target, key, value)
            self._context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_50)
        finally:
            for target, values in zip((visual.global_, visual.quality), saved, strict=True):
                for key, value in values.items():
                    setattr(target, key, value)
        self._model = model
        # room for every geom, site and tendon segment (mujoco.Renderer's 10,000 cost 10 MB a
        # renderer: a gigabyte for the 64 environments of one rollout worker)
        self._scene = mujoco.MjvScene(model, maxgeom=_scene_size(model))
        self._rect = mujoco.MjrRect(0, 0, width, height)
        self._shape = (height, width, 3)
        self._cameras: dict[Any, Any] = {}
        self._scene_option = mujoco.MjvOption()
        self._scene_option.geomgroup[5] = 0  # helper sites and mocap handles stay invisible
        self._scene_option.sitegroup[5] = 0
        flags = self._scene.flags
        high = quality == "high"
        flags[mujoco.mjtRndFlag.mjRND_SHADOW] = high
        flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = high
        flags[mujoco.mjtRndFlag.mjRND_SKYBOX] = high
        _LIVE.add(self)

    def _camera(self, camera: str | int):
        import mujoco

        if camera not in self._cameras:
            index = camera
            if isinstance(camera, str):
                index = mujoco.mj_name2id(self._model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
                if index == -1:
                    raise ValueError(f"camera {camera!r} does not exist in this model")
            if not -1 <= index < self._model.ncam:
                raise ValueError(f"camera id {index} out of range [-1, {self._model.ncam})")
            view = mujoco.MjvCamera()
            if index == -1:  # the free camera, as mujoco.Renderer does
                view.type = mujoco.mjtCamera.mjCAMERA_FREE
                mujoco.mjv_defaultFreeCamera(self._model, view)
            else:
                view.type = mujoco.mjtCamera.mjCAMERA_FIXED
                view.fixedcamid = index
            self._cameras[camera] = view
        return self._cameras[camera]

    def render(self, data, camera: str | int):
        """Render one frame; returns a new ``uint8`` array of shape ``(height, width, 3)``."""
        import mujoco

        if self._context is None:
            raise RuntimeError("render called after close")
        view = self._camera(camera)
        _make_current(self._gl)
        mujoco.mjv_updateScene(self._model, data, self._scene_option, None, view,
                               mujoco.mjtCatBit.mjCAT_ALL, self._scene)
        if self._scene.ngeom >= self._scene.maxgeom:  # mjv_updateScene dropped some
            raise RuntimeError(f"the scene has more than {self._scene.maxgeom} geoms to draw")
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._context)
        mujoco.mjr_render(self._rect, self._scene, self._context)
        frame = np.empty(self._shape, np.uint8)
        mujoco.mjr_readPixels(frame, None, self._rect, self._context)
        return np.ascontiguousarray(frame[::-1])  # OpenGL's rows run bottom to top

    def close(self) -> None:
        if self._context is not None and self._pid == os.getpid():
            _make_current(self._gl)
            self._context.free()
        self._context = None
        _LIVE.discard(self)


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
