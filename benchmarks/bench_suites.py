"""Benchmark the suite adapter (tasks.suites) against the suite's own env, in one run, one core.

For each task (Meta-World's MT10, or robosuite's three, by default), the same seeded random
actions are stepped through the suite's raw env (``env.backend.raw.step``, as the adapter
configured it) and through our :class:`tasks.suites.SuiteEnv`
(state observations, then pixels at 84 px), alternating the two in rounds so that load hits both
alike; it prints env steps/s of each, the adapter's overhead (target <= 10% with state
observations: 1 - ours / raw) and the cost of ``snapshot()`` and ``restore()``.

Runs in the suites' environment:

    .venv-suites/bin/python benchmarks/bench_suites.py [--suite metaworld|robosuite]
        [--tasks reach-v3 push-v3] [--steps 2000]
        [--rounds 3] [--out bench_results/suites.json]
"""

# ruff: noqa: I001  (tasks must be imported before mujoco)
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import tasks  # first: it picks the headless GL backend before MuJoCo is imported
import mujoco
import numpy as np
from harness_common.files import atomic_write_text
from tasks import suites
from tasks.suites import metaworld

OVERHEAD_TARGET = 0.10


def _actions(steps: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (steps, 4)).astype(np.float32)


def raw_rate(env, actions: np.ndarray, episode: int) -> float:
    """The suite's own env: ``reset()`` and ``step()`` only, the same actions."""
    raw = env.backend.raw
    start = time.perf_counter()
    for t, action in enumerate(actions):
        if t % episode == 0:
            raw.reset()
        raw.step(action)
    return len(actions) / (time.perf_counter() - start)


def ours_rate(env, actions: np.ndarray, episode: int) -> float:
    start = time.perf_counter()
    for t, action in enumerate(actions):
        if t % episode == 0:
            env.reset(seed=t)
        env.step(action)
    return len(actions) / (time.perf_counter() - start)


def snapshot_costs(env, repeats: int = 200) -> tuple[float, float]:
    """Microseconds per ``snapshot()`` and per ``restore()`` mid-episode."""
    env.reset(seed=0)
    for action in _actions(30):
        env.step(action)
    start = time.perf_counter()
    for _ in range(repeats):
        snapshot = env.snapshot()
    taken = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeats):
        env.restore(snapshot)
    restored = time.perf_counter() - start
    return 1e6 * taken / repeats, 1e6 * restored / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="metaworld", choices=sorted(suites.SUITES))
    parser.add_argument("--tasks", nargs="+", default=None,
                        help="default: Meta-World's MT10, or every task of another suite")
    parser.add_argument("--steps", type=int, default=2000, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    parser.add_argument("--episode", type=int, default=200, help="steps between resets")
    parser.add_argument("--out", default="bench_results/suites.json")
    args = parser.parse_args()

    actions = _actions(args.steps)
    names = args.tasks or list(metaworld.MT10 if args.suite == "metaworld"
                               else suites.SUITES[args.suite])
    rows = []
    for name in names:
        state = tasks.make(f"{args.suite}/{name}", obs_mode="state")
        pixels = tasks.make(f"{args.suite}/{name}", obs_mode="pixels", verify=False)
        rates: dict[str, list[float]] = {"raw": [], "state": [], "pixels": []}
        for _ in range(args.rounds):
            rates["raw"].append(raw_rate(state, actions, args.episode))
            rates["state"].append(ours_rate(state, actions, args.episode))
            rates["pixels"].append(ours_rate(pixels, actions[: args.steps // 4], args.episode))
        median = {key: statistics.median(values) for key, values in rates.items()}
        snap_us, restore_us = snapshot_costs(state)
        row = {"task": name, "raw_steps_per_s": round(median["raw"]),
               "state_steps_per_s": round(median["state"]),
               "pixels84_steps_per_s": round(median["pixels"]),
               "overhead_state": round(1 - median["state"] / median["raw"], 4),
               "snapshot_us": round(snap_us, 1), "restore_us": round(restore_us, 1)}
        rows.append(row)
        print(f"{name:26s} raw {row['raw_steps_per_s']:6d}/s  ours {row['state_steps_per_s']:6d}/s"
              f"  overhead {100 * row['overhead_state']:5.1f}%  pixels84 "
              f"{row['pixels84_steps_per_s']:5d}/s  snapshot {snap_us:6.1f} us  restore "
              f"{restore_us:6.1f} us", flush=True)
        state.close()
        pixels.close()
    overhead = statistics.median(row["overhead_state"] for row in rows)
    verdict = "met" if overhead <= OVERHEAD_TARGET else "NOT met"
    print(f"median adapter overhead (state): {100 * overhead:.1f}% "
          f"(target <= {100 * OVERHEAD_TARGET:.0f}%: {verdict})")
    result = {"suite": args.suite, "tasks": rows, "median_overhead_state": overhead,
              "target": OVERHEAD_TARGET,
              "mujoco": mujoco.__version__, "processor": platform.processor() or platform.machine(),
              "date": time.strftime("%Y-%m-%d")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps(result, indent=2))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
