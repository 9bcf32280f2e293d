"""Roll out every task's scripted expert, print a success table and write a PNG strip of frames.

usage: python studies/rollout_experts.py [--episodes 20] [--difficulty 1.0] [--noise 0.0]
                                         [--out outputs/experts] [--camera front]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

import tasks
from harness_common.files import atomic_write_text
from harness_common.stats import wilson_interval


def rollout(name: str, episodes: int, difficulty: float, noise: float, seed: int) -> dict:
    """Run ``episodes`` expert episodes of one task; return success, lengths and timing."""
    env = tasks.make(name)
    expert = tasks.ScriptedExpert(env, noise=noise, seed=seed)
    successes, lengths = [], []
    start = time.perf_counter()
    for episode in tqdm(range(episodes), desc=f"{name:>12}", leave=False):
        env.reset(seed=seed + episode, options={"difficulty": difficulty})
        done, info = False, {}
        while not done:
            _, _, terminated, truncated, info = env.step(expert())
            done = terminated or truncated
        successes.append(bool(info["is_success"]))
        lengths.append(info["steps"])
    elapsed = time.perf_counter() - start
    env.close()
    low, high = wilson_interval(sum(successes), episodes)
    return {
        "task": name, "episodes": episodes, "success_rate": float(np.mean(successes)),
        "ci95": [low, high], "mean_length": float(np.mean(lengths)),
        "steps_per_second": float(np.sum(lengths) / elapsed),
    }


def frame_strip(name: str, difficulty: float, seed: int, frames: int, camera: str) -> np.ndarray:
    """Frames of one expert episode (front or wrist camera), evenly spaced, side by side."""
    env = tasks.make(name, camera=camera, render_mode="rgb_array", render_size=(180, 240))
    expert = tasks.ScriptedExpert(env)
    env.reset(seed=seed, options={"difficulty": difficulty})
    images, done = [env.render()], False
    while not done:
        _, _, terminated, truncated, _ = env.step(expert())
        images.append(env.render())
        done = terminated or truncated
    env.close()
    picks = np.linspace(0, len(images) - 1, frames).round().astype(int)
    return np.concatenate([images[i] for i in picks], axis=1)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--difficulty", type=float, default=1.0)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--camera", default="front")
    parser.add_argument("--out", type=Path, default=Path("outputs/experts"))
    args = parser.parse_args(argv)

    results = [
        rollout(name, args.episodes, args.difficulty, args.noise, args.seed) for name in tasks.TASKS
    ]
    table = Table(title=f"Scripted experts, difficulty {args.difficulty}, noise {args.noise}")
    for column in ("task", "success", "95% CI", "mean length", "env steps/s"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r["task"], f"{r['success_rate']:.0%}", f"{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}",
            f"{r['mean_length']:.1f}", f"{r['steps_per_second']:.0f}",
        )
    Console().print(table)

    import imageio.v3 as iio

    args.out.mkdir(parents=True, exist_ok=True)
    strips = [frame_strip(n, args.difficulty, args.seed, 6, args.camera) for n in tasks.TASKS]
    strip_path = args.out / "expert_frames.png"
    iio.imwrite(strip_path, np.concatenate(strips, axis=0))
    atomic_write_text(args.out / "experts.json", json.dumps(results, indent=2))
    print(f"wrote {strip_path} and {args.out / 'experts.json'}")
    return results


if __name__ == "__main__":
    main()
