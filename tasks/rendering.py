"""Headless rendering: backend choice and a fast camera renderer.

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
import sys
import warnings


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
