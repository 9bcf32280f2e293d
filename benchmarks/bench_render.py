"""Benchmark the camera renderer against ``mujoco.Renderer``, the reference, in the same run.

A rollout worker steps 64 pixel environments in turn, each rendering its own 84 px frame. Each
measurement runs in a fresh process (so that memory and ``LP_NUM_THREADS`` start clean), in
alternation, ``--repeats`` times:

- ``ours``: :class:`tasks.rendering.CameraRenderer` (one OpenGL context per thread, buffers of
  the frame's size, no shadow map in fast quality);
- ``mujoco``: one ``mujoco.Renderer`` per camera renderer with the same scene flags (what the
  harness used before 2026-12-03), swapped in for the measurement;

each with llvmpipe rasterising in the calling thread (``LP_NUM_THREADS=0``, the harness's
default) and with a thread per core (``LP_NUM_THREADS`` = cores, Mesa's default). Prints env
steps/s (random actions, physics included: the same for every arm), the memory the renderers
added (resident memory), and whether every arm drew the very same pixels; the ratios to read are
against ``mujoco`` at Mesa's default.

usage: python benchmarks/bench_render.py [--envs 64] [--steps 1280] [--size 84] [--repeats 2]
           [--out bench_results/render.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __package__ is None:  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness_common.files import atomic_write_text  # noqa: E402


class _MujocoRenderer:
    """The reference: ``mujoco.Renderer`` with the learning cameras' flags (fast quality)."""

    def __init__(self, model, height: int, width: int, quality: str = "fast") -> None:
        import mujoco

        offsamples = model.vis.quality.offsamples
        model.vis.quality.offsamples = 0
        try:
            self._renderer = mujoco.Renderer(model, height=height, width=width)
        finally:
            model.vis.quality.offsamples = offsamples
        self._option = mujoco.MjvOption()
        self._option.geomgroup[5] = self._option.sitegroup[5] = 0
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION,
                     mujoco.mjtRndFlag.mjRND_SKYBOX):
            self._renderer.scene.flags[flag] = False

    def render(self, data, camera):
        self._renderer.update_scene(data, camera=camera, scene_option=self._option)
        return self._renderer.render()

    def close(self) -> None:
        self._renderer.close()


def _resident_mb() -> float:
    """Resident memory now (not the peak: building a scene's textures may peak higher)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _measure(renderer: str, envs: int, steps: int, size: int) -> dict:
    """One arm, in this (fresh) process."""
    import numpy as np

    import tasks
    from tasks import rendering

    if renderer == "mujoco":
        rendering.CameraRenderer = _MujocoRenderer
    pixel_envs = [tasks.make("push", obs_mode="pixels", image_size=size) for _ in range(envs)]
    rss = _resident_mb()
    digest = hashlib.sha256()
    for seed, env in enumerate(pixel_envs):
        digest.update(env.reset(seed=seed)[0]["pixels"].tobytes())  # makes the renderers
    memory_mb = _resident_mb() - rss
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, *pixel_envs[0].action_space.shape)).astype(np.float32)
    start = time.perf_counter()
    for i in range(steps):
        env = pixel_envs[i % envs]
        obs, _, terminated, truncated, _ = env.step(actions[i])
        if terminated or truncated:
            obs, _ = env.reset(seed=envs + i)
        if i >= steps - envs:
            digest.update(obs["pixels"].tobytes())
    seconds = time.perf_counter() - start
    for env in pixel_envs:
        env.close()
    return {"steps_per_s": steps / seconds, "renderers_mb": memory_mb,
            "pixels_sha256": digest.hexdigest()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=64, help="environments stepped in turn")
    parser.add_argument("--steps", type=int, default=1280, help="env steps timed per arm")
    parser.add_argument("--size", type=int, default=84, help="frame size (px)")
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the arms")
    parser.add_argument("--out", type=Path, default=Path("bench_results/render.json"))
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # internal: one measurement
    args = parser.parse_args(argv)
    if args.envs < 1 or args.steps < args.envs or args.size < 8 or args.repeats < 1:
        raise SystemExit(f"--envs {args.envs}, --steps {args.steps}, --size {args.size}, "
                         f"--repeats {args.repeats}: expected envs >= 1, steps >= envs, "
                         "size >= 8, repeats >= 1")
    if args.arm:
        print(json.dumps(_measure(args.arm, args.envs, args.steps, args.size)))
        return {}

    cores = str(os.cpu_count() or 1)
    arms = [(renderer, threads) for renderer in ("mujoco", "ours") for threads in ("0", cores)]
    runs: dict[str, list[dict]] = {f"{r}_lp{t}": [] for r, t in arms}
    for _ in range(args.repeats):
        for renderer, threads in arms:
            env = {**os.environ, "LP_NUM_THREADS": threads}
            answer = subprocess.run(
                [sys.executable, __file__, "--arm", renderer, "--envs", str(args.envs),
                 "--steps", str(args.steps), "--size", str(args.size)],
                env=env, check=True, capture_output=True, text=True)
            runs[f"{renderer}_lp{threads}"].append(json.loads(answer.stdout.splitlines()[-1]))
    reference = f"mujoco_lp{cores}"
    best = {key: max(run["steps_per_s"] for run in values) for key, values in runs.items()}
    digests = {run["pixels_sha256"] for values in runs.values() for run in values}
    results = {
        "envs": args.envs, "steps": args.steps, "size": args.size, "repeats": args.repeats,
        "runs": runs, "best_steps_per_s": best,
        "ratio_to_reference": {key: rate / best[reference] for key, rate in best.items()},
        "renderer_mb": {key: min(run["renderers_mb"] for run in values) / args.envs
                        for key, values in runs.items()},
        "same_pixels": len(digests) == 1,
    }
    print(f"{args.envs} pixel push envs in turn, {args.size} px, best of {args.repeats}; "
          f"reference: mujoco.Renderer, LP_NUM_THREADS={cores} (Mesa's default)")
    for key in runs:
        print(f"  {key:10s} {best[key]:7.0f} env steps/s  {results['ratio_to_reference'][key]:.2f}x"
              f"  {results['renderer_mb'][key]:5.1f} MB per renderer")
    print(f"  same pixels in every arm: {results['same_pixels']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
