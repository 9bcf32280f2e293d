"""The main job: demos -> behaviour cloning -> group fine-tuning of the TinyVLA -> evaluation.

With no arguments (``make run``) it fine-tunes the TinyVLA (pixels + instruction) on ``push``:

1. record scripted-expert demonstrations (once; few, so behaviour cloning stays mediocre);
2. teach the policy's features the simulator state on noisy-expert frames
   (``harness.bc.pretrain_state_features``), then behaviour-clone it on the action tokens;
3. evaluate the BC policy on held-out seeds;
4. fine-tune it with GRPO (``harness.algos.group``) for ``algo.iterations`` iterations (about
   20 minutes on 2 idle cores; ``max_minutes`` is only a guard, and ``summary.json`` says
   whether it cut the run short); the BC weights are also the KL reference, and the image
   encoder stays as BC left it (``algo.freeze_encoder``), which makes each update several
   times cheaper;
5. evaluate the fine-tuned policy on the same held-out seeds, print the before/after table with
   the paired difference (95% interval, exact McNemar p-value), record ``bc_success``,
   ``final_success`` and ``improvement`` in the run's ``summary.json`` and draw the learning
   curve (``learning_curve.png``).

Steps 1-4 run inside the training app (``algo.bc_demos``), so the same pipeline is
``python scripts/train.py algo=grpo algo.bc_demos=20 ...``. Any training-app override is accepted,
e.g. ``python scripts/main.py algo=dr_grpo algo.iterations=50``.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from pathlib import Path

import tasks  # noqa: F401  (headless GL backend before MuJoCo loads)
from harness import config as harness_config
from harness import runs
from harness.plots import learning_curve

DEFAULT_OVERRIDES = [
    "task=push", "task.obs_mode=pixels", "task.difficulty=0.0", "task.max_episode_steps=30",
    "policy=tiny_vla", "algo=grpo", "algo.bc_demos=20", "algo.bc_epochs=60",
    "algo.state_pretrain_episodes=200", "algo.state_pretrain_epochs=20",
    "algo.num_start_states=16", "algo.group_size=8", "algo.workers=2",
    "algo.learning_rate=1e-3", "algo.num_iterations=2", "algo.minibatch_size=32",
    "algo.zero_signal=drop", "algo.freeze_encoder=true", "algo.iterations=360",
    "torch_threads=2",
    "curriculum=fixed", "max_minutes=40", "total_timesteps=100000000",
    "eval.every_steps=100000", "eval.episodes=50", "eval.final_episodes=100",
]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="run directory (default outputs/main/<date_time>)")
    parser.add_argument("overrides", nargs="*", help="training-app overrides (key=value)")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    run_dir = args.out or Path("outputs/main") / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    config = harness_config.compose([*DEFAULT_OVERRIDES, *args.overrides])
    summary = runs.train(config, run_dir)

    summary.update({
        "bc_success": summary["start_success_rate"],
        "bc_success_interval": summary["start_success_interval"],
        "final_success": summary["success_rate"],
        "final_success_interval": summary["success_interval"],
        "main_job_wall_clock_s": round(time.perf_counter() - started, 1),
    })
    runs.atomic_write_text(Path(run_dir) / "summary.json", runs.to_json(summary))
    figure = learning_curve(
        Path(run_dir) / "metrics.csv", Path(run_dir) / "learning_curve.png",
        baseline=summary["bc_success"],
        title=f"{config.algo.name} fine-tuning of the TinyVLA on {config.task.name}",
    )

    rows = (
        (f"BC ({config.algo.bc_demos} demos)", summary["bc_success"],
         summary["bc_success_interval"], summary["start_sampled_success_rate"]),
        (f"BC + {config.algo.name}", summary["final_success"], summary["final_success_interval"],
         summary["sampled_success_rate"]),
    )
    episodes = config.eval.final_episodes
    print(f"\nheld-out success on {config.task.name} (difficulty {config.task.difficulty}, "
          f"{episodes} test episodes, the same start states for both)")
    print("| policy | greedy success | 95% interval | sampled success |\n|---|---|---|---|")
    for name, rate, (low, high), sampled in rows:
        print(f"| {name} | {rate:.2f} | {low:.2f}-{high:.2f} | {sampled:.2f} |")
    low, high = summary["improvement_interval"]
    cut = " (cut short by max_minutes)" if summary["time_limit_reached"] else ""
    print(f"\nchange: {summary['improvement'] * 100:+.0f} points, paired 95% interval "
          f"[{low * 100:+.0f}, {high * 100:+.0f}], exact McNemar p = "
          f"{summary['improvement_p_value']:.2g}; {summary['iterations']} iterations{cut}; "
          f"run dir {run_dir}; learning curve {figure}; "
          f"wall clock {summary['main_job_wall_clock_s']:.0f} s")
    return summary


if __name__ == "__main__":
    main()
