"""Train a policy on a task: ``harness-train task=reach algo=ppo`` (or ``python scripts/train.py``).

Hydra composes ``conf/train.yaml``; the run directory is Hydra's output dir. ``resume=true`` with
``hydra.run.dir=<run dir>`` continues a killed run from its latest checkpoint. One process trains
into a run directory at a time (:class:`harness.runs.RunLock`): a second run into a named
``hydra.run.dir`` that another holds is refused before Hydra writes its ``.hydra/`` there. See
docs/training.md.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import config as harness_config
from harness.apps import conf_file
from harness_common.cli import UNGUARDED_FLAGS, override_value, run_app

harness_config.register_configs()


@hydra.main(version_base="1.3", config_path="pkg://harness.conf", config_name="train")
def app(cfg: DictConfig) -> float:
    # Here, not at the top: torch and the trainers load only for a run (not for --help, --cfg).
    from harness import trainers

    config = harness_config.load(cfg)
    summary = trainers.train(config, HydraConfig.get().runtime.output_dir)
    return summary["success_rate"]


def main(argv: list[str] | None = None) -> int:
    """Run the training app on ``argv`` (default: the command line); returns its exit status.
    The ``plugins=[...]`` it names are imported first, so that their heads are choices of
    ``policy/head``."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        harness_config.import_plugins(harness_config.plugins_in(args))
    except harness_config.ConfigError as error:
        print(f"train: {error}", file=sys.stderr)
        return 1
    run_dir = override_value(args, "hydra.run.dir")
    if run_dir is not None and not any(flag in args for flag in UNGUARDED_FLAGS):
        from harness.runs import RunInUseError, RunLock

        try:  # trainers.train takes the lock; this spares a running run Hydra's .hydra/ files
            RunLock(run_dir).refuse_if_held()
        except RunInUseError as error:
            print(f"train: {error}", file=sys.stderr)
            return 1
    return run_app(app, args, moved=harness_config.MOVED, help_file=conf_file("train"))


if __name__ == "__main__":
    sys.exit(main())
