"""Evaluate a trained CNN detector on data files, e.g. a visual domain held out of training.

usage: python scripts/evaluate_detector.py checkpoint=outputs/detectors/push_front+wrist.pt \
           "data=[data/detectors/push_front+wrist_84.h5,data/detectors/push_front+wrist_84_held_out.h5]"

Reads each file's ``split`` (``test`` by default) at the checkpoint's threshold and prints
accuracy, precision, recall, ROC-AUC and false-positive rate, and each file's drop from the first
(the reference: the held-out episodes of the training collection). Writes every file's metrics to
``out`` (default ``<checkpoint stem>_evaluation.json`` beside the checkpoint). A held-out visual
domain is collected with ``scripts/collect_detector_data.py ... visual_domain=held_out``. A file
whose recorded camera mounts differ from the checkpoint's is refused (where either records none,
they are not compared).

``choose_threshold={target_precision: 0.98, conservative: false}`` first chooses the threshold
again on the first file's ``val`` split (the rule of training, without training again) and reads
every file at that one; ``threshold=0.7`` reads them at a given one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from harness.apps import conf_file
from harness_common.cli import run_app
from harness_common.files import write_json


@hydra.main(config_path="pkg://harness.conf", config_name="evaluate_detector", version_base="1.3")
def app(cfg: DictConfig) -> None:
    # Here, not at the top: torch and the detectors load only for a run (not for --help).
    from success_detectors import load_detector
    from success_detectors.evaluation import (
        DROP_KEYS,
        evaluate_on_file,
        metric_drops,
        threshold_on_file,
    )

    if not cfg.data:
        raise ValueError("data=[...] is empty; give at least one detector data file")
    detector = load_detector(cfg.checkpoint, threshold=cfg.threshold)
    chosen = None
    if cfg.choose_threshold is not None:
        if cfg.threshold is not None:
            raise ValueError(f"threshold={cfg.threshold} and choose_threshold="
                             f"{dict(cfg.choose_threshold)}: give one of them")
        unknown = sorted(set(cfg.choose_threshold) - {"target_precision", "conservative"})
        if unknown:
            raise ValueError(f"choose_threshold: unknown key(s) {unknown}; expected "
                             "target_precision, conservative")
        chosen = threshold_on_file(detector, cfg.data[0], "val", **cfg.choose_threshold)
        detector = load_detector(cfg.checkpoint, threshold=chosen.threshold)
        print(f"threshold {chosen.threshold:.4f} chosen on {cfg.data[0]} (val): precision "
              f"{chosen.precision:.4f}, recall {chosen.recall:.4f}, target "
              f"{'reached' if chosen.reached else 'not reached'}")
    results = [evaluate_on_file(detector, path, cfg.split, cfg.hard_margin) for path in cfg.data]
    for result in results[1:]:
        result["drop"] = metric_drops(results[0], result)

    table = Table(title=f"{detector.task} detector ({detector.camera}), {cfg.split} split, "
                        f"threshold {detector.threshold:.3f}")
    for column in ("data", "frames", "accuracy", "precision", "recall", "roc_auc", "fpr",
                   "accuracy drop", "precision drop"):
        table.add_column(column, justify="right")
    for result in results:
        drop = result.get("drop", {})
        table.add_row(Path(result["data"]).name, str(result["frames"]),
                      *(f"{result[k]:.4f}" for k in (*DROP_KEYS, "false_positive_rate")),
                      *(f"{drop[k]:+.4f}" if drop else "" for k in ("accuracy", "precision")))
    Console(width=200).print(table)  # file names are long; never truncate a figure
    checkpoint = Path(cfg.checkpoint)
    out = Path(cfg.out) if cfg.out else checkpoint.with_name(f"{checkpoint.stem}_evaluation.json")
    write_json(out, {"checkpoint": str(checkpoint), "threshold": detector.threshold,
                     "threshold_chosen": None if chosen is None else {
                         "on": f"{cfg.data[0]} (val)", **dict(cfg.choose_threshold),
                         "val_precision": chosen.precision, "val_recall": chosen.recall,
                         "reached": chosen.reached},
                     "results": results})
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line) and return its exit status."""
    return run_app(app, argv, help_file=conf_file("evaluate_detector"))


if __name__ == "__main__":
    sys.exit(main())
