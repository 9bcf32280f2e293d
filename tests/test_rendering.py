"""The camera renderer: the very pixels of ``mujoco.Renderer``, with one OpenGL context per
process and thread and buffers of the frame's size (tasks/rendering.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import mujoco
import numpy as np
import pytest

import tasks
from tasks import rendering

RANDOMISED = dict(enabled=True, object_size=(0.8, 1.2), fovy=(0.8, 1.2), camera_rotation=0.05,
                  light_direction=0.3, light_count=(1, 5), table_colour=0.2,
                  background_colour=0.2, textures=True)


def _reference(model, data, camera: str, size: int, quality: str) -> np.ndarray:
    """The frame mujoco.Renderer draws with the learning cameras' settings."""
    offsamples = model.vis.quality.offsamples
    if quality == "fast":
        model.vis.quality.offsamples = 0
    with mujoco.Renderer(model, height=size, width=size) as renderer:
        model.vis.quality.offsamples = offsamples
        option = mujoco.MjvOption()
        option.geomgroup[5] = option.sitegroup[5] = 0
        high = quality == "high"
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION,
                     mujoco.mjtRndFlag.mjRND_SKYBOX):
            renderer.scene.flags[flag] = high
        renderer.update_scene(data, camera=camera, scene_option=option)
        return renderer.render()


@pytest.mark.parametrize("quality", ["fast", "high"])
@pytest.mark.parametrize("task,randomization", [("push", None), ("pick_place", RANDOMISED),
                                                ("drawer_open", None)])
def test_frames_equal_mujoco_renderer(task, randomization, quality):
    env = tasks.make(task, obs_mode="pixels", render_quality=quality, difficulty=1.0,
                     **({"randomization": randomization} if randomization else {}))
    model, data = env.unwrapped.model, env.unwrapped.data
    try:
        for seed in range(2):
            obs, _ = env.reset(seed=seed)
            obs, *_ = env.step(np.full(env.action_space.shape, 0.3, np.float32))
            frames = 0
            for camera in env.unwrapped.camera_names:
                for size in (48, 84):
                    ours = env.unwrapped.render_camera(camera, size)
                    assert ours.shape == (size, size, 3) and ours.dtype == np.uint8
                    np.testing.assert_array_equal(
                        ours, _reference(model, data, camera, size, quality), err_msg=camera)
                    frames += 1
            assert frames >= 4
            assert obs["pixels"].std() > 5  # a real picture, not a cleared buffer
    finally:
        env.close()


def test_one_gl_context_per_thread_and_small_renderers():
    envs = [tasks.make("push", obs_mode="pixels") for _ in range(4)]
    for seed, env in enumerate(envs):
        env.reset(seed=seed)
    contexts = {id(r._gl) for env in envs for r in env.unwrapped._cameras._renderers.values()}
    assert contexts == {id(rendering._GL.get())}

    other = {}

    def render_in_a_thread():
        env = tasks.make("push", obs_mode="pixels")
        other["obs"] = env.reset(seed=0)[0]["pixels"]
        other["context"] = id(rendering._GL.get())
        env.close()

    thread = threading.Thread(target=render_in_a_thread)
    thread.start()
    thread.join()
    assert other["context"] != id(rendering._GL.get())  # its own context, the same picture
    np.testing.assert_array_equal(other["obs"], envs[0].reset(seed=0)[0]["pixels"])

    for env in envs:
        env.close()


def test_renderers_take_a_fraction_of_mujoco_renderers_memory():
    """In fresh processes: 16 renderers of ours against 16
    ``mujoco.Renderer`` (benchmarks/bench_render.py's arms), with the same pixels."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_render.py"
    answers = {}
    for arm in ("ours", "mujoco"):
        run = subprocess.run([sys.executable, str(script), "--arm", arm, "--envs", "16",
                              "--steps", "16"], check=True, capture_output=True, text=True)
        answers[arm] = json.loads(run.stdout.splitlines()[-1])
    ours, theirs = (answers[arm]["renderers_mb"] / 16 for arm in ("ours", "mujoco"))
    # per renderer, the process's first OpenGL context included (about 60 MB, paid once)
    assert ours < 10 and theirs > 3 * ours, (ours, theirs)
    assert answers["ours"]["pixels_sha256"] == answers["mujoco"]["pixels_sha256"]


def test_closed_renderer_refuses_to_render():
    env = tasks.make("push", obs_mode="pixels")
    env.reset(seed=0)
    renderer = next(iter(env.unwrapped._cameras._renderers.values()))
    renderer.close()
    renderer.close()  # twice is harmless
    with pytest.raises(RuntimeError, match="after close"):
        renderer.render(env.unwrapped.data, "front")
    with pytest.raises(ValueError, match="'nowhere' does not exist"):
        rendering.CameraRenderer(env.unwrapped.model, 32, 32).render(env.unwrapped.data,
                                                                      "nowhere")
    env.close()
