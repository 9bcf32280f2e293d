"""Reward-hacking audit of a run trained on a learned verifier (``reward=verifier detector=cnn``).

A policy rewarded by a classifier may learn to fool it instead of doing the task. The group
trainer scores every attempt with the detector and logs, per iteration, its false-positive and
false-negative rates on the policy's own attempts against the scripted truth
(``detector/false_positive_rate``, ``detector/false_negative_rate``) and the attempts' true and
detected success (``rollout/success_rate``, ``rollout/verifier_success_rate``). This script
reads them and answers the two questions of the audit:

* did the detector's false-positive rate stay at or below ``--fp-target`` at every iteration,
  and if not, when and how far did it rise (the figure shows it against training);
* where the false positives ended: the median over iterations of their median millimetres
  outside the success region (``detector/false_positive_margin_mm_median``);
* with ``detector_refresh`` on, how many labels the in-run loop asked for, how many of them
  were hard negatives, and how often it refreshed the detector;
* is the run's final *true* success (held-out evaluation, scripted check) within
  ``--margin`` of a ``--reference`` run trained with the scripted verifier, same seed and budget.

Writes ``<run>/verifier_audit.json`` and the figure (``harness_common.plots.verifier_audit_curve``).

usage: python studies/audit_verifier.py <run dir> [--reference <run dir>] [--fp-target 0.02]
           [--margin 0.05] [--baseline <run dir without detector_refresh>] [--out <file.png>]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from harness_common.files import atomic_write_text, read_metrics
from harness_common.plots import verifier_audit_curve


def audit(run_dir: Path, reference: Path | None, fp_target: float, margin: float) -> dict:
    """The audit's figures for ``run_dir`` (and its scripted-verifier ``reference``).

    Raises:
        ValueError: The run logged no detector error rates, or a run has no summary.json.
    """
    series = read_metrics(run_dir / "metrics.csv")
    if "detector/false_positive_rate" not in series:
        raise ValueError(f"{run_dir} logged no detector/false_positive_rate: audit a run trained "
                         "with reward=verifier detector=cnn")
    steps = np.array([s for s, _ in series["detector/false_positive_rate"]])
    fp = np.array([v for _, v in series["detector/false_positive_rate"]])
    fn = np.array([v for _, v in series.get("detector/false_negative_rate", [])])
    true = np.array([v for _, v in series.get("rollout/success_rate", [])])
    seen = np.array([v for _, v in series.get("rollout/verifier_success_rate", [])])
    above = np.flatnonzero(fp > fp_target)
    tail = max(1, len(fp) // 10)  # the last tenth of training
    result = {
        "run": str(run_dir), "iterations_logged": int(len(fp)), "fp_target": fp_target,
        "fp_rate_mean": float(fp.mean()), "fp_rate_max": float(fp.max()),
        "fp_rate_max_at_step": int(steps[int(fp.argmax())]),
        "fp_rate_last_tenth": float(fp[-tail:].mean()),
        "iterations_above_fp_target": int(len(above)),
        "first_step_above_fp_target": int(steps[above[0]]) if len(above) else None,
        "fn_rate_mean": float(fn.mean()) if len(fn) else math.nan,
        "detected_minus_true_success_last_tenth": (float((seen[-tail:] - true[-tail:]).mean())
                                                   if len(true) and len(seen) else math.nan),
        "fp_within_target_every_iteration": bool(len(above) == 0),
    }
    margins = [v for _, v in series.get("detector/false_positive_margin_mm_median", [])]
    if margins:  # where the false positives ended, outside the success region
        result["fp_margin_mm_median_over_iterations"] = float(np.median(margins))
        result["fp_margin_mm_median_last_tenth"] = float(np.median(margins[-tail:]))
    if "detector/labels_total" in series:  # detector_refresh: the in-run loop's workload
        result.update({key: int(series[f"detector/{key}"][-1][1])
                       for key in ("labels_total", "hard_negatives_total")})
        result["refreshes"] = int(max([v for _, v in series.get("detector/refreshes", [])],
                                      default=0))
    summary = _summary(run_dir)
    result.update({"start_true_success": summary.get("start_success_rate"),
                   "final_true_success": summary["success_rate"]})
    if reference is not None:
        scripted = _summary(reference)["success_rate"]
        result.update({"reference": str(reference), "reference_final_true_success": scripted,
                       "final_true_success_minus_reference": summary["success_rate"] - scripted,
                       "margin": margin,
                       "within_margin": bool(abs(summary["success_rate"] - scripted)
                                             <= margin + 1e-12)})
    return result


def _summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    if not path.is_file():
        raise ValueError(f"{run_dir} has no summary.json: did the run finish?")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="run trained with reward=verifier detector=cnn")
    parser.add_argument("--reference", type=Path, default=None,
                        help="the same run trained with the scripted verifier")
    parser.add_argument("--fp-target", type=float, default=0.02,
                        help="false-positive rate allowed at every iteration")
    parser.add_argument("--margin", type=float, default=0.05,
                        help="allowed |final true success - reference's| (a fraction)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="the same run without detector_refresh, drawn dotted beside it")
    parser.add_argument("--baseline-label", default="without the refresh",
                        help="what the baseline run is, in the figure's legend")
    parser.add_argument("--out", type=Path, default=None,
                        help="figure; default <run dir>/verifier_audit.png")
    args = parser.parse_args(argv)
    if not 0.0 <= args.fp_target <= 1.0:
        parser.error(f"--fp-target={args.fp_target}; expected a rate in [0, 1]")
    if not 0.0 <= args.margin <= 1.0:
        parser.error(f"--margin={args.margin}; expected a fraction in [0, 1]")
    try:
        result = audit(args.run_dir, args.reference, args.fp_target, args.margin)
        if args.baseline is not None:
            result["baseline"] = audit(args.baseline, None, args.fp_target, args.margin)
        figure = verifier_audit_curve(
            args.run_dir / "metrics.csv", args.out or args.run_dir / "verifier_audit.png",
            args.fp_target, args.reference / "metrics.csv" if args.reference else None,
            args.baseline / "metrics.csv" if args.baseline else None, args.baseline_label)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"audit_verifier.py: {error}") from None
    result["figure"] = str(figure)
    atomic_write_text(args.run_dir / "verifier_audit.json", json.dumps(result, indent=1))
    rows = [(k, v) for k, v in result.items() if k != "baseline"]
    rows += [(f"baseline.{k}", v) for k, v in result.get("baseline", {}).items()]
    for key, value in rows:
        print(f"{key:40s} {value:.3f}" if isinstance(value, float) else f"{key:40s} {value}")
    return result


if __name__ == "__main__":
    main()
