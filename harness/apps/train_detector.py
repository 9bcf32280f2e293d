"""Train a CNN success detector and evaluate it on held-out test episodes.

usage: python scripts/train_detector.py data=data/detectors/push_front_84.h5
       python scripts/train_detector.py image_dir=photos/ task=push task.camera=real_front

Writes ``<out_dir>/<task>_<camera>.pt`` (the checkpoint, with the threshold chosen on the
validation split for ``train.target_precision``), ``<task>_<camera>_metrics.json`` (test-split
accuracy, precision, recall, f1, roc_auc, ece, threshold, confusion matrix) and
``<task>_<camera>_worst_errors.png`` (the most confident false positives and negatives). The
checkpoint keeps the data file's camera mounts; a file whose mounts differ from where this code
mounts the cameras is refused (re-collect it), and one that records none trains with a warning.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from harness.apps import conf_file
from harness_common.cli import run_app


@hydra.main(config_path="pkg://harness.conf", config_name="train_detector", version_base="1.3")
def app(cfg: DictConfig) -> None:
    # Here, not at the top: torch and the detectors load only for a run (not for --help).
    from success_detectors.training import TrainDetectorConfig, train_detector

    options = OmegaConf.to_container(cfg, resolve=True)
    task = options.pop("task", None)
    if task is not None:  # the task group says what the frames show
        options.update(task=task["name"], camera=task["camera"], image_size=task["image_size"])
    config = TrainDetectorConfig(**options)
    result = train_detector(config)
    m = result.metrics

    table = Table(title=f"{m['task']} detector ({m['camera']}, {m['image_size']}px), test split")
    for column in ("frames", "accuracy", "precision", "recall", "f1", "roc_auc", "ece",
                   "threshold"):
        table.add_column(column, justify="right")
    table.add_row(str(m["frames"]), *(f"{m[k]:.4f}" for k in (
        "accuracy", "precision", "recall", "f1", "roc_auc", "ece", "threshold")))
    console = Console(width=120)  # a log file is not a terminal: never truncate a figure
    console.print(table)
    (tn, fp), (fn, tp) = m["confusion_matrix"]
    console.print(f"confusion: tn={tn} fp={fp} fn={fn} tp={tp}; "
                  f"near-miss false-positive rate {m.get('near_miss_false_positive_rate', 'n/a')}")
    if m.get("errors_by_margin"):
        bins = Table(title="test errors by distance to the success boundary")
        for column in ("|margin| (cm)", "frames", "errors", "false pos.", "false neg."):
            bins.add_column(column, justify="right")
        for row in m["errors_by_margin"]:
            upper = "" if row["to_cm"] is None else f"{row['to_cm']:g}"
            bins.add_row(f"{row['from_cm']:g}-{upper}", *(str(row[k]) for k in (
                "frames", "errors", "false_positives", "false_negatives")))
        console.print(bins)
    if not m["training"]["val_reached_target"]:
        target = m["training"]["target_precision"]
        console.print(f"[bold red]no threshold reached precision {target} on the validation "
                      "split; the most precise one was kept[/]")
    console.print(f"trained {m['training']['epochs']} epochs in {m['training']['seconds']} s "
                  f"(best {m['training']['best_epoch']}, stopped by {m['training']['stopped']})")
    print(f"wrote {result.checkpoint}, {result.metrics_path} and {result.figure}")


def main(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line) and return its exit status."""
    return run_app(app, argv, help_file=conf_file("train_detector"))


if __name__ == "__main__":
    sys.exit(main())
