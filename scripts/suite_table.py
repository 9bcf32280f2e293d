"""Check every task of a suite through our adapter and print the markdown table of docs/tasks.md.

For each task: the env contract and Gymnasium's ``check_env``, exact snapshots (replay after a
restore in the same env and in a fresh one, state and pixels: ``tasks.suites.check_exact``), and
the suite's scripted expert through the adapter from ``--seeds`` held-out starts (success rate,
mean steps of the successes).

    .venv-suites/bin/python scripts/suite_table.py [--suite metaworld] [--seeds 20]
        [--first-seed 1000] [--out bench_results/suite_table.md]
"""

# ruff: noqa: I001  (tasks must be imported before mujoco)
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import tasks  # first: it picks the headless GL backend before MuJoCo is imported
from gymnasium.utils.env_checker import check_env
from harness_common.files import atomic_write_text
from tasks import suites


# check_env's notes on unbounded Box observations (ours are by design), once per task
warnings.filterwarnings("ignore", message=".*Box observation space (minimum|maximum) value")


def check_task(suite: str, name: str, seeds: range) -> dict:
    row = {"task": name}
    try:
        checked = tasks.make(f"{suite}/{name}", obs_mode="pixels_state")  # replays inside
        check_env(checked, skip_render_check=True)
        checked.close()
        row["checks"] = "pass"
    except Exception as error:  # reported in the table, the other tasks go on
        row["checks"] = f"FAIL: {type(error).__name__}: {error}"
        return row
    env = tasks.make(f"{suite}/{name}", verify=False)
    lengths = []
    for seed in seeds:
        env.reset(seed=seed)
        info = {"is_success": False}
        for _ in range(env.max_episode_steps):
            _, _, terminated, truncated, info = env.step(env.expert_action())
            if terminated or truncated:
                break
        if info["is_success"]:
            lengths.append(env.steps)
    env.close()
    row["expert"] = f"{len(lengths)}/{len(seeds)}"
    row["steps"] = f"{statistics.mean(lengths):.0f}" if lengths else "-"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="metaworld", choices=sorted(suites.SUITES))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--out", default="bench_results/suite_table.md")
    args = parser.parse_args()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    lines = ["| task | contract, check_env, exact snapshots (state + pixels) | "
             f"scripted expert ({args.seeds} starts) | mean steps to success |",
             "|---|---|---|---|"]
    failed = 0
    for name in suites.SUITES[args.suite]:
        start = time.perf_counter()
        row = check_task(args.suite, name, seeds)
        failed += row["checks"] != "pass"
        lines.append(f"| {name} | {row['checks']} | {row.get('expert', '-')} | "
                     f"{row.get('steps', '-')} |")
        print(f"{lines[-1]}  ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), text)
    print(text)
    print(f"{failed} of {len(suites.SUITES[args.suite])} tasks failed a check -> {args.out}",
          file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
