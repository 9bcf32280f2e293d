"""Run an exported policy in the simulator: ``python scripts/deploy_policy.py model=policy.onnx
episodes=100``.

A Hydra app over ``conf/deploy_policy.yaml`` (``--help`` lists the keys, ``--cfg job`` prints
them). The model is a file of ``scripts/export_policy.py``; it runs in a single-threaded
onnxruntime session (one core of a robot computer) through :mod:`harness.deploy`, and this
process never imports torch. It plays greedy episodes on the task and options saved at export;
``task_name=`` plays another task (``task=`` would be the training app's ``conf/task/`` group),
and ``task``: task options over the exported ones, spelt as in ``scripts/train.py``, each
replacing its own whole (:func:`harness.evaluation.override_task_options`), e.g.
``+task.max_episode_steps=100`` or ``+task.imperfections.action_latency=2``; the options that fix
what the policy sees (``obs_mode``, ``camera``, ``image_size``) stay the exported ones, and the
observations must keep the shapes the graph takes. By default it plays the training run's
held-out evaluation seeds and difficulties, as ``scripts/evaluate.py`` does on the source
checkpoint. Prints the success rate with its 95% Wilson interval, a per-difficulty table, and the
per-control-step latency (p50, p99, max) of the policy alone and of the full step (policy, then
physics and camera) against the control period. A policy of any action head plays: the graph
gives the greedy actions (a token policy's bin centres, a Gaussian's squashed mean, a flow's
noiseless Euler steps from zero), and the record names the head. Before the first decision the
file must meet :class:`harness.deploy.DeployLimits`: its size and its metadata's, the operators
the exporter emits with sizes from constants and input shapes alone, bounded constants, and a
trial warm-up decision bounded in memory and time in a process of its own (docs/export.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from harness.apps import conf_file
from harness_common.cli import run_app
from harness_common.files import atomic_write_text, to_json

# The key this app once had, and the one that replaces it (refused with the new spelling).
RENAMED = {"task_options": "task"}


@dataclass
class DeployConfig:
    """The primary config of this app (``conf/deploy_policy.yaml``); see the module docstring."""

    model: str = MISSING
    episodes: int = 100
    task_name: str | None = None
    task: dict[str, Any] = field(default_factory=dict)
    difficulties: list[float] | None = None
    seed: int | None = None
    threads: int = 1
    output: str | None = None

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes={self.episodes}; must be >= 1")
        if self.threads < 1:
            raise ValueError(f"threads={self.threads}; must be >= 1")
        if self.difficulties is not None:
            bad = [d for d in self.difficulties if not 0.0 <= d <= 1.0]
            if not self.difficulties or bad:
                raise ValueError(f"difficulties={list(self.difficulties)}; need values in [0, 1]"
                                 " (null: the training run's)")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed={self.seed}; must be >= 0 or null")


ConfigStore.instance().store(name="deploy_policy_schema", node=DeployConfig)


def fail(message: str) -> NoReturn:
    """Print ``message`` as this script's error and exit with status 1."""
    print(f"deploy_policy.py: {message}", file=sys.stderr)
    raise SystemExit(1)


@hydra.main(version_base="1.3", config_path="pkg://harness.conf", config_name="deploy_policy")
def deploy_policy(cfg: DictConfig) -> None:
    """Play ``cfg.episodes`` greedy episodes with ``cfg.model``; print success and latency."""
    # Here, not at the top: onnxruntime and the simulator load only for a run (not for --help).
    from harness.deploy import ExportedPolicy, deploy
    from harness.evaluation import override_task_options

    try:
        args = OmegaConf.to_object(cfg)
    except MissingMandatoryValue:
        fail("model=<file.onnx> is required: a file written by scripts/export_policy.py")
    except (OmegaConfBaseException, ValueError) as error:
        fail(str(error))
    try:
        policy = ExportedPolicy(args.model, threads=args.threads)
        override_task_options(args.task_name or policy.info["task"],
                              policy.info["task_options"], args.task)
        result = deploy(policy, args.episodes, args.task_name, dict(args.task),
                        args.difficulties, args.seed)
    except (FileNotFoundError, ValueError) as error:
        fail(str(error))
    evaluation, summary = result.evaluation, result.summary()
    low, high = evaluation.success_interval
    info = policy.info
    print(f"{Path(args.model).name} ({info['policy']['kind']}, {policy.action_head} head, "
          f"exported {info['exported_at']}) on {result.task}, greedy, onnxruntime with "
          f"{args.threads} thread(s): success {evaluation.success_rate:.3f} [{low:.3f}, "
          f"{high:.3f}] (95% Wilson) over {len(evaluation.episodes)} episodes, mean length "
          f"{evaluation.mean_length:.1f}")
    print(evaluation.table())
    period = summary["control_period_ms"]
    print(f"latency per control step over {len(result.step_s)} steps (control period "
          f"{period:.0f} ms):")
    per = "" if policy.chunk_size == 1 else f" per decision of {policy.execute_steps} steps"
    for label, key in ((f"policy inference{per}", "inference_ms"),
                       ("full step (policy + physics + camera)", "step_ms")):
        ms = summary[key]
        print(f"  {label}: p50 {ms['p50']:.2f} ms, p99 {ms['p99']:.2f} ms, max {ms['max']:.2f} ms"
              f" ({ms['p99'] / period:.0%} of the period at p99)")
    if args.output:
        atomic_write_text(Path(args.output), to_json({"model": args.model, **summary}))
        print(f"results: {args.output}")


def main(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line) and return its exit status: 0, or 1
    after an error (a bad key or value, a key spelt the old way, a missing or foreign model
    file, one over the deploy bounds, a task whose observations the model does not take)."""
    return run_app(deploy_policy, argv, renamed=RENAMED, help_file=conf_file("deploy_policy"))


if __name__ == "__main__":
    sys.exit(main())
