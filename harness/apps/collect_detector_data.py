"""Collect labelled frames for a learned success detector and write them to HDF5.

usage: python scripts/collect_detector_data.py task=push episodes=400 [task.image_size=84]
                                               [task.camera=front] [workers=2]
                                               [+task.randomization.enabled=true]

Rolls out experts, noisy experts, near-miss and random policies over a range of difficulties
(``conf/collect_detector_data.yaml``), labels each kept frame with the scripted predicate, splits
by episode and balances classes; see ``success_detectors.data`` for the details and file layout.
The envs' randomisation block is the task group's ``task.randomization``, as in
``scripts/train.py`` (``visual_domain=`` sets it).
"""

from __future__ import annotations

import sys
import time

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from harness.apps import conf_file
from harness_common.cli import run_app

# The key this app once had, and the one that replaces it (refused with the new spelling).
RENAMED = {"randomization": "task.randomization"}


@hydra.main(version_base="1.3", config_path="pkg://harness.conf",
             config_name="collect_detector_data")
def app(cfg: DictConfig) -> None:
    # Here, not at the top: torch and the detectors load only for a run (not for --help).
    from success_detectors import data

    options = OmegaConf.to_container(cfg, resolve=True)
    out, task = options.pop("out"), options.pop("task")
    config = data.CollectConfig(task=task["name"], camera=task["camera"],
                                image_size=task["image_size"],
                                randomization=task["randomization"], **options)

    start = time.perf_counter()
    splits = data.build_dataset(config)
    path = data.write_dataset(out, splits, task=config.task, camera=config.camera,
                              config=data.config_dict(config),
                              camera_mounts=data.camera_mounts(config.task, config.camera))
    summary = data.dataset_summary(splits, config.hard_margin)

    table = Table(title=f"{config.task} detector frames ({config.camera}, {config.image_size}px)")
    for column in ("split", "episodes", "frames", "positives", "negatives", "near-miss neg."):
        table.add_column(column, justify="right")
    for name, row in summary.items():
        table.add_row(name, str(row["episodes"]), str(row["frames"]), str(row["positives"]),
                      str(row["negatives"]), str(row["near_miss_negatives"]))
    Console().print(table)
    print(f"wrote {path} in {time.perf_counter() - start:.0f} s")


def main(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line) and return its exit status."""
    return run_app(app, argv, renamed=RENAMED, help_file=conf_file("collect_detector_data"))


if __name__ == "__main__":
    sys.exit(main())
