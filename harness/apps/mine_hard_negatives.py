"""Mine hard negatives for a CNN success detector from fresh rollouts (HIL-SERL style).

usage: python scripts/mine_hard_negatives.py checkpoint=outputs/detectors/push_front+wrist.pt \
           "data=data/detectors/push_front+wrist_84.h5" [episodes=200] [workers=2] \
           [policy_run=outputs/<run>]

Rolls out ``episodes`` fresh episodes (episode policies at the weights of
``conf/mine_hard_negatives.yaml``, or a trained policy's run), renders the detector's camera at
every step, and keeps the frames the detector calls success while the scripted predicate says
failure, labelled failure. Writes ``data`` with those frames appended to its train split (val and
test unchanged) to ``out``; retrain on it with ``scripts/train_detector.py``. See
``success_detectors.mining`` for the bookkeeping.
"""

from __future__ import annotations

import sys
import time

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from harness import config as harness_config
from harness.apps import conf_file
from harness_common.cli import run_app


def load_run_policy(policy_run: str):
    """``(task, task options, greedy policy function)`` of a trained run's checkpoint."""
    from harness.checkpoints import load_policy
    from harness.runs import resolve_checkpoint

    path, metadata = resolve_checkpoint(policy_run)
    return metadata["task"], metadata["task_options"], load_policy(path, metadata)


# --help lists the ConfigStore's groups: the training app's schema/ groups stay among them,
# as when the trainers were imported here (harness.config, unlike them, loads no torch).
harness_config.register_configs()


@hydra.main(config_path="pkg://harness.conf", config_name="mine_hard_negatives", version_base="1.3")
def app(cfg: DictConfig) -> None:
    # Here, not at the top: torch, the detectors and the trainers load only for a run.
    from success_detectors.mining import COUNTS, MineConfig, mine_round

    config = MineConfig(**OmegaConf.to_container(cfg, resolve=True))
    start = time.perf_counter()
    result, out = mine_round(config, policy_loader=load_run_policy)

    table = Table(title=f"{config.checkpoint} on {config.episodes} fresh rollouts, every "
                        f"{config.frame_stride} step(s)")
    table.add_column("count or rate")
    table.add_column("value", justify="right")
    for key in COUNTS:
        table.add_row(key, str(result.counts[key]))
    for key, rate in result.rates().items():
        table.add_row(key, f"{rate:.4f}")
    Console().print(table)
    print(f"retrain: python scripts/train_detector.py \"data={out}\" out_dir=<a new folder> "
          f"({time.perf_counter() - start:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line) and return its exit status."""
    return run_app(app, argv, help_file=conf_file("mine_hard_negatives"))


if __name__ == "__main__":
    sys.exit(main())
