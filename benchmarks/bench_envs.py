"""Benchmark the task environments on one core and write JSON.

Prints, measured in one run on the same models and substeps:
- env steps/s per task and obs mode (random actions, resets included), and for ``push`` also
  under the ``fast`` physics preset (``physics`` column);
- raw ``mj_step`` throughput on the very states the env visited, and the share of env step time
  spent in physics (target >= 85% with state observations);
- snapshot and restore microseconds (target: restore <= 50 us);
- camera frames/s at 64, 84 and 128 px (learning-camera quality), and pixel-observation env
  steps/s at 84x84 (target >= 800).
With ``--peer PYTHON`` it also runs ``../shared/bench/fetch_rate.py`` (Gymnasium-Robotics
FetchPush-v4, in its own venv) alternately with ours and prints the median ratios, for our default
and fast physics (``state_fast``, ``pixels_fast``) against the same FetchPush measurement.

usage: python benchmarks/bench_envs.py [--seconds 3] [--out bench_results/envs.json] [--peer PY]
"""

# ruff: noqa: I001  (tasks must be imported before mujoco)
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import tasks  # first: it picks the headless GL backend before MuJoCo is imported
import mujoco
import numpy as np
from tasks.base import OBS_MODES
from tasks.snapshot import STATE_SPEC
from harness_common.files import atomic_write_text

TARGETS = {"physics_share_state": 0.85, "restore_us": 50.0, "pixels84_steps_per_s": 800.0}


def env_rate(name: str, obs_mode: str, seconds: float, physics: str = "default",
             share: bool = True) -> dict:
    """Random-action env steps/s; then (``share``) the physics share, timed on the states that
    run visited.

    The timed loop does nothing but step (and reset); the same seeded run is then replayed to
    collect every 8th physics state, and ``mj_step`` alone is timed from each of them.
    """
    env = tasks.make(name, obs_mode=obs_mode, physics=physics)
    actions = np.random.default_rng(0).uniform(-1, 1, (4096, 4)).astype(np.float32)

    def play(steps: int | None, visit=None) -> int:
        env.reset(seed=0)
        done_steps, start = 0, time.perf_counter()
        while (steps is None and time.perf_counter() - start < seconds) or \
                (steps is not None and done_steps < steps):
            if visit is not None:
                visit(done_steps)
            _, _, terminated, truncated, _ = env.step(actions[done_steps % 4096])
            done_steps += 1
            if terminated or truncated:
                env.reset()
        return done_steps

    play(50)  # renderer and caches warm
    start = time.perf_counter()
    steps = play(None)
    rate = steps / (time.perf_counter() - start)
    row = {"task": name, "obs_mode": obs_mode, "physics": physics, "env_steps_per_s": rate}
    if not share:
        env.close()
        return row
    states: list[bytes] = []
    play(min(steps, 16_000), lambda i: states.append(env.snapshot().physics) if i % 8 == 0
         else None)
    model, data = env.model, mujoco.MjData(env.model)
    physics = 0.0
    for state in states:
        mujoco.mj_setState(model, data, np.frombuffer(state, np.float64), STATE_SPEC)
        t0 = time.perf_counter()
        mujoco.mj_step(model, data, env.config.substeps)
        physics += time.perf_counter() - t0
    physics_per_step = physics / len(states)
    env.close()
    return {**row, "mj_step_control_steps_per_s": 1.0 / physics_per_step,
            "physics_share": physics_per_step * rate}


def snapshot_timing(name: str, repeats: int = 2000) -> dict:
    env = tasks.make(name)
    env.reset(seed=0)
    for _ in range(5):
        env.step(env.action_space.sample())
    t0 = time.perf_counter()
    for _ in range(repeats):
        snapshot = env.snapshot()
    t1 = time.perf_counter()
    for _ in range(repeats):
        env.restore(snapshot)
    t2 = time.perf_counter()
    return {"task": name, "snapshot_us": (t1 - t0) / repeats * 1e6,
            "restore_us": (t2 - t1) / repeats * 1e6}


def frame_rate(size: int, seconds: float) -> float:
    env = tasks.make("push", obs_mode="pixels", image_size=size)
    env.reset(seed=0)
    env._render_pixels(False)
    frames, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env._render_pixels(False)
        frames += 1
    rate = frames / (time.perf_counter() - start)
    env.close()
    return rate


def peer_rate(python: str, mode: str, seconds: float) -> float:
    script = Path(__file__).resolve().parents[2] / "shared" / "bench" / "fetch_rate.py"
    if not script.exists():
        script = Path("../shared/bench/fetch_rate.py").resolve()
    env = dict(os.environ, MUJOCO_GL="egl")
    out = subprocess.run([python, str(script), "env", mode, str(seconds)], env=env, check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=Path("bench_results/envs.json"))
    parser.add_argument("--peer", help="python of the peer venv (../shared/bench/peer_venv.sh)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations with the peer")
    args = parser.parse_args(argv)
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the targets say
    except (AttributeError, OSError):
        pass

    results: dict = {"machine": platform.platform(), "mujoco": mujoco.__version__,
                     "MUJOCO_GL": os.environ.get("MUJOCO_GL"), "targets": TARGETS}
    print(f"MuJoCo {mujoco.__version__}, MUJOCO_GL={os.environ.get('MUJOCO_GL')}, one core\n")
    print(f"{'task':>12} {'obs_mode':>13} {'physics':>8} {'env steps/s':>12} {'mj_step/s':>10} "
          f"{'share':>6}")
    runs = [(name, obs_mode, "default") for name in tasks.TASKS for obs_mode in OBS_MODES]
    runs += [("push", obs_mode, "fast") for obs_mode in OBS_MODES]
    rows = []
    for name, obs_mode, physics in runs:
        row = env_rate(name, obs_mode, args.seconds, physics)
        rows.append(row)
        print(f"{name:>12} {obs_mode:>13} {physics:>8} {row['env_steps_per_s']:12.0f} "
              f"{row['mj_step_control_steps_per_s']:10.0f} {row['physics_share']:6.1%}")
    results["env"] = rows
    snaps = [snapshot_timing(name) for name in tasks.TASKS]
    results["snapshot"] = snaps
    print("\nsnapshot / restore (us): " + ", ".join(
        f"{s['task']} {s['snapshot_us']:.1f} / {s['restore_us']:.1f}" for s in snaps))
    frames = {size: frame_rate(size, args.seconds / 2) for size in (64, 84, 128)}
    results["frames_per_s"] = frames
    print("camera frames/s: " + ", ".join(f"{s}px {r:.0f}" for s, r in frames.items()))

    # The targets are about the default physics: under "fast" physics is a smaller share.
    default_rows = [r for r in rows if r["physics"] == "default"]
    state_share = min(r["physics_share"] for r in default_rows if r["obs_mode"] == "state")
    pixels84 = min(r["env_steps_per_s"] for r in default_rows if r["obs_mode"] == "pixels")
    restore = max(s["restore_us"] for s in snaps)
    checks = {
        "physics_share_state": (state_share, state_share >= TARGETS["physics_share_state"]),
        "restore_us": (restore, restore <= TARGETS["restore_us"]),
        "pixels84_steps_per_s": (pixels84, pixels84 >= TARGETS["pixels84_steps_per_s"]),
    }
    results["checks"] = {k: {"value": v, "met": met} for k, (v, met) in checks.items()}
    print("\ntargets (worst task):")
    for key, (value, met) in checks.items():
        print(f"  {key:>22}: {value:10.2f}  target {TARGETS[key]:g}  {'met' if met else 'NOT MET'}")

    if args.peer:
        ratios: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for mode in ("state", "pixels"):
                theirs = peer_rate(args.peer, mode, args.seconds)
                for physics in ("default", "fast"):
                    ours = env_rate("push", mode, args.seconds, physics,
                                    share=False)["env_steps_per_s"]
                    key = mode if physics == "default" else f"{mode}_fast"
                    ratios.setdefault(key, []).append(ours / theirs)
                    print(f"  push {key}: ours {ours:.0f}/s, FetchPush {theirs:.0f}/s, "
                          f"ratio {ours / theirs:.2f}")
        results["peer_ratio_median"] = {m: statistics.median(r) for m, r in ratios.items()}
        print("median ratio vs FetchPush-v4: " + ", ".join(
            f"{m} {r:.2f}x" for m, r in results["peer_ratio_median"].items()))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    return results


if __name__ == "__main__":
    main()
