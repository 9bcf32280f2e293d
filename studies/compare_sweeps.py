"""Check that two sweeps hold the same results: ``python studies/compare_sweeps.py A B``.

Matches the jobs of two sweep folders by their folder names and compares every number of their
``summary.json`` and ``metrics.csv``, wall-clock figures and provenance left out (see
``harness.report.compare``); prints the differences, or that there are none, and each job's
wall clock in both. Exit status 0 when they agree, 1 when they differ. See docs/scaling.md.
"""

import argparse
import sys

from harness.report.compare import compare_sweeps, wall_clocks

SHOWN = 40  # differences printed; the rest are counted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", help="a sweep folder (multirun/<date>/<time>)")
    parser.add_argument("second", help="the sweep folder to compare it with")
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="largest absolute difference counted as equal (default: exact)")
    parser.add_argument("--summary-only", action="store_true",
                        help="compare summary.json only, not metrics.csv")
    args = parser.parse_args()
    differences = compare_sweeps(args.first, args.second, args.tolerance,
                                 metrics=not args.summary_only)
    first, second = wall_clocks(args.first), wall_clocks(args.second)
    print(f"| job | wall clock (s), {args.first} | wall clock (s), {args.second} |")
    print("|---|---:|---:|")
    for job in [*first, *(job for job in second if job not in first)]:
        cells = [f"{clocks[job]:.1f}" if job in clocks else "-" for clocks in (first, second)]
        print(f"| {job} | {cells[0]} | {cells[1]} |")
    if not first:
        print(f"no job with a summary.json below {args.first}")
        return 1
    if not differences:
        print(f"same results: {len(first)} jobs, every summary.json"
              f"{'' if args.summary_only else ' and metrics.csv'} number equal")
        return 0
    print(f"{len(differences)} differences:")
    for line in differences[:SHOWN]:
        print(f"  {line}")
    if len(differences) > SHOWN:
        print(f"  ... and {len(differences) - SHOWN} more")
    return 1


if __name__ == "__main__":
    sys.exit(main())
