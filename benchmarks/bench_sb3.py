"""SB3 PPO throughput on ``push`` (state observations, one env), optionally against the peer.

The measurement mirrors ``../shared/bench/fetch_rate.py ppo`` exactly on our task: SB3 PPO with its
default hyper-parameters and ``n_steps=2048``, ``MlpPolicy`` on the flattened ``Dict``
observation, ``n_envs=1``, one torch thread, ``learn(timesteps)`` timed end to end.

    python benchmarks/bench_sb3.py                    # ours only
    python benchmarks/bench_sb3.py --peer --repeats 3 # alternate ours / FetchPush-v4, median ratio

``--peer`` takes the peer venv's python, or builds it with ``../shared/bench/peer_venv.sh``.
Each measurement runs in a fresh process, ours and theirs alternating, so that drifts in the
machine's load hit both sides alike; the JSON holds every figure and the median ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness_common.files import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
SHARED_BENCH = ROOT.parent / "shared" / "bench"


def measure_ours(timesteps: int) -> float:
    """SB3 PPO steps/s on ``harness/Push-v0`` in this process."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO

    import tasks  # noqa: F401 - registers harness/Push-v0

    torch.set_num_threads(1)
    env = gym.wrappers.FlattenObservation(gym.make(tasks.GYM_IDS["push"], obs_mode="state"))
    model = PPO("MlpPolicy", env, n_steps=2048, seed=0, verbose=0)
    start = time.perf_counter()
    model.learn(timesteps)
    return timesteps / (time.perf_counter() - start)


def run_once(command: list[str], env: dict[str, str]) -> float:
    """Run a measuring process; its last stdout line is the rate."""
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    return float(result.stdout.strip().splitlines()[-1])


def peer_python(value: str) -> str:
    """The peer venv's python: given, or built by ``peer_venv.sh`` (prints its path)."""
    if value != "build":
        return value
    script = SHARED_BENCH / "peer_venv.sh"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True)
    return result.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timesteps", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each side")
    parser.add_argument("--peer", nargs="?", const="build", default=None,
                        help="peer venv python (default: build it with peer_venv.sh)")
    parser.add_argument("--output", default="bench_results/bench_sb3.json",
                        help="JSON results file")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.once:
        print(measure_ours(args.timesteps))
        return

    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    ours_cmd = [sys.executable, __file__, "--once", "--timesteps", str(args.timesteps)]
    theirs_cmd = None
    if args.peer is not None:
        theirs_cmd = [peer_python(args.peer), str(SHARED_BENCH / "fetch_rate.py"), "ppo",
                      str(args.timesteps)]
    ours, theirs = [], []
    load_before = os.getloadavg()
    for i in range(args.repeats):
        ours.append(run_once(ours_cmd, env))
        line = f"[{i + 1}/{args.repeats}] ours {ours[-1]:.0f} steps/s"
        if theirs_cmd is not None:
            theirs.append(run_once(theirs_cmd, env))
            line += f", peer {theirs[-1]:.0f} steps/s, ratio {ours[-1] / theirs[-1]:.2f}"
        print(line, flush=True)

    results = {
        "benchmark": "SB3 PPO, MlpPolicy on flattened state obs, n_envs=1, n_steps=2048",
        "timesteps": args.timesteps,
        "ours_task": "harness/Push-v0",
        "ours_steps_per_s": ours,
        "ours_median": statistics.median(ours),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    if theirs:
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        results.update({
            "peer_task": "Gymnasium-Robotics FetchPush-v4",
            "peer_steps_per_s": theirs,
            "peer_median": statistics.median(theirs),
            "ratios": ratios,
            "median_ratio": statistics.median(ratios),
        })
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.output), json.dumps(results, indent=2) + "\n")
    summary = f"ours median {results['ours_median']:.0f} steps/s"
    if theirs:
        summary += (f", peer median {results['peer_median']:.0f} steps/s, "
                    f"median ratio {results['median_ratio']:.2f}")
    print(f"{summary} -> {args.output}")


if __name__ == "__main__":
    main()
