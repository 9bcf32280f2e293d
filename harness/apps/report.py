"""Write the experiment report of a sweep: ``harness-report multirun/<date>/<time>``.

Reads every run below the folder and writes ``report.md`` and ``plots/*.png`` (final held-out
success per arm as IQM with 95% bootstrap intervals, learning curves, steps to 50%/80% success,
informative groups, verifier error rates); see ``harness.report`` and docs/report.md.
``python scripts/report.py`` is the same command.
"""

from __future__ import annotations

import argparse
import logging
import sys

from harness.report import DEFAULT_REPS, ReportError, build_report


def main(argv: list[str] | None = None) -> int:
    """Write the report for ``argv`` (default: the command line); returns the exit status (2
    when the runs cannot be reported on)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("multirun_dir", help="a sweep's folder (multirun/<date>/<time>)")
    parser.add_argument("--out", default=None, help="where to write (default: multirun_dir)")
    parser.add_argument("--allow-mixed-tasks", action="store_true",
                        help="pool runs of different tasks (with a warning) instead of failing")
    parser.add_argument("--metric", default="success_rate",
                        help="summary.json key of final held-out performance")
    parser.add_argument("--reference", default=None,
                        help="the arm every other arm is compared with, as the report names it "
                             "(e.g. algo=grpo, the default when the sweep has that arm)")
    parser.add_argument("--reps", type=int, default=DEFAULT_REPS, help="bootstrap replicates")
    parser.add_argument("--ignore", action="append", default=[], metavar="KEY",
                        help="a setting that does not define an arm, e.g. "
                             "algo.start_policy.file when each seed's arm starts from that "
                             "seed's saved start (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        report = build_report(args.multirun_dir, args.out, metric=args.metric,
                              allow_mixed_tasks=args.allow_mixed_tasks, reps=args.reps,
                              reference=args.reference, ignore=tuple(args.ignore))
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
