"""The main job: demos -> behaviour cloning -> group fine-tuning of the TinyVLA -> evaluation.

With no arguments (``make run``) it fine-tunes the TinyVLA (pixels + instruction) on ``push`` at
full difficulty (goal 6-18 cm away, two distractor cubes, the instruction naming the target):

1. record 200 scripted-expert demonstrations with noise injected into the executed actions
   (once: they are cached under ``<data_dir>/demos``, ``data/demos`` in a checkout);
2. teach the policy's features the simulator state on noisy-expert frames
   (``harness.start_policy.state_pretraining.pretrain_state_features``), then behaviour-clone it on
   the action
   tokens, keeping the epoch with the lowest loss on held-out demos;
3. evaluate the BC policy, greedy and sampled, on the validation seeds (which choose its better
   decoding) and on the held-out test seeds;
4. fine-tune it with GRPO (``harness.algos.group.run``) for ``algo.iterations`` iterations (about
   17 minutes on 2 idle cores for the whole job; ``max_minutes`` is only a guard, and
   ``summary.json`` says whether it cut the run short); the BC weights are also the KL
   reference, and the image encoder stays as BC left it (``algo.freeze_encoder``), which makes
   each update several times cheaper;
5. evaluate the fine-tuned policy on the same test seeds, print the before/after table (greedy
   and sampled for both policies) with the paired gain of the fine-tuned greedy policy over the
   BC policy's greedy decoding and over its better decoding (95% interval, exact McNemar
   p-value), record ``bc_success``, ``final_success``, ``improvement`` and
   ``improvement_vs_best_start`` in the run's ``summary.json`` and draw the learning curve
   (``learning_curve.png``).

This is the training app (``harness-train``, ``conf/train.yaml``) with ``+experiment=main_job``
(``conf/experiment/main_job.yaml``) added to the command line, so ``python scripts/train.py
+experiment=main_job`` runs the same training (steps 1-4 and the final evaluation) without the
table, the curve and the keys added to ``summary.json``; every training-app argument works here:
``python scripts/main.py seed=1 algo.iterations=50``, ``--cfg job``, ``-m seed=0,1``,
``hydra.run.dir=<run dir>`` (default ``outputs/main/<date>_<time>``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import config as harness_config
from harness.apps import conf_file
from harness_common.cli import run_app
from harness_common.files import write_json

harness_config.register_configs()


@hydra.main(version_base="1.3", config_path="pkg://harness.conf", config_name="train")
def main_job(cfg: DictConfig) -> float:
    """Train, then add the before/after figures to ``summary.json``, draw the learning curve
    and print the table; returns the final greedy success (what a sweeper would maximise)."""
    # Here, not at the top: torch, the trainers and matplotlib load only for a run.
    from harness import trainers
    from harness_common.plots import learning_curve

    started = time.perf_counter()
    config = harness_config.load(cfg)
    # Relative to where it runs when it can be (hydra.job.chdir=false), as printed before Hydra.
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if run_dir.is_relative_to(Path.cwd()):
        run_dir = run_dir.relative_to(Path.cwd())
    summary = trainers.train(config, run_dir)

    summary.update({
        "bc_success": summary["start_success_rate"],
        "bc_success_interval": summary["start_success_interval"],
        "final_success": summary["success_rate"],
        "final_success_interval": summary["success_interval"],
        "main_job_wall_clock_s": round(time.perf_counter() - started, 1),
    })
    write_json(run_dir / "summary.json", summary)
    figure = learning_curve(
        run_dir / "metrics.csv", run_dir / "learning_curve.png",
        baseline=summary["bc_success"],
        title=f"{config.algo.name} fine-tuning of the TinyVLA on {config.task.name}",
    )

    print(before_after_table(summary, config, run_dir, figure))
    return summary["final_success"]


def before_after_table(summary: dict[str, Any], config: harness_config.TrainConfig,
                       run_dir: Path, figure: Path) -> str:
    """The table the main job prints: greedy and sampled success of the BC and the fine-tuned
    policy on the test seeds, the paired gain of the fine-tuned greedy policy over the BC
    policy's greedy decoding and over its better decoding (chosen on the validation seeds),
    and where the run is.

    Args:
        summary: The run's summary (``harness.algos.group.summary.paired_gains``'s keys).
        config: The run's ``harness.config.TrainConfig``.
        run_dir: The run directory.
        figure: The learning curve.

    Returns:
        The text, from a blank line on.
    """
    rows = (
        (f"BC ({config.algo.start_policy.bc.demos} demos)", summary["bc_success"],
         summary["bc_success_interval"], summary["start_sampled_success_rate"]),
        (f"BC + {config.algo.name}", summary["final_success"], summary["final_success_interval"],
         summary["sampled_success_rate"]),
    )
    lines = [f"\nheld-out success on {config.task.name} (difficulty {config.task.difficulty}, "
             f"{config.eval.final_episodes} test episodes, the same start states for both)",
             "| policy | greedy success | 95% interval | sampled success |", "|---|---|---|---|"]
    lines += [f"| {name} | {rate:.2f} | {low:.2f}-{high:.2f} | {sampled:.2f} |"
              for name, rate, (low, high), sampled in rows]
    lines.append("")
    decoding = summary.get("best_start_decoding")
    gains = [("gain over BC greedy", "improvement")]
    if decoding is not None:  # chosen on the validation seeds, paired on the test seeds
        chosen = (f"gain over BC {decoding}, its better decoding (greedy "
                  f"{summary['start_validation_success_rate']:.2f}, sampled "
                  f"{summary['start_validation_sampled_success_rate']:.2f} on "
                  f"{config.eval.episodes} validation episodes)")
        gains = ([(chosen, "improvement_vs_best_start")] if decoding == "greedy"
                 else [*gains, (chosen, "improvement_vs_best_start")])
    for label, key in gains:
        low, high = summary[f"{key}_interval"]
        lines.append(f"{label}: {summary[key] * 100:+.0f} points, paired 95% interval "
                     f"[{low * 100:+.0f}, {high * 100:+.0f}], exact McNemar p = "
                     f"{summary[f'{key}_p_value']:.2g}")
    if decoding is None:
        lines.append("gain over BC's better decoding: not measured (the run resumed from a "
                     "checkpoint that did not keep the BC policy's validation figures)")
    cut = " (cut short by max_minutes)" if summary["time_limit_reached"] else ""
    lines.append(f"{summary['iterations']} iterations{cut}; run dir {run_dir}; learning curve "
                 f"{figure}; wall clock {summary['main_job_wall_clock_s']:.0f} s")
    return "\n".join(lines)


def with_main_job(args: list[str]) -> list[str]:
    """``args`` with ``+experiment=main_job`` put before the first override, or first when there
    is none: Hydra's parser takes the overrides as one run of arguments (``-m seed=0,1``)."""
    first = next((i for i, arg in enumerate(args) if "=" in arg and not arg.startswith("-")), 0)
    return [*args[:first], "+experiment=main_job", *args[first:]]


def main(argv: list[str] | None = None) -> int:
    """Run the main job with ``argv`` (default: the command line) after ``+experiment=main_job``;
    returns its exit status (0, or Hydra's after ``--help`` or an error it reported)."""
    args = with_main_job(sys.argv[1:] if argv is None else list(argv))
    try:  # their heads are choices of policy/head
        harness_config.import_plugins(harness_config.plugins_in(args))
    except harness_config.ConfigError as error:
        print(f"main: {error}", file=sys.stderr)
        return 1
    return run_app(main_job, args, moved=harness_config.MOVED, help_file=conf_file("train"))


if __name__ == "__main__":
    sys.exit(main())
