"""Evaluate a trained CNN detector on data files: ``python scripts/evaluate_detector.py --help``.

The app is :mod:`harness.apps.evaluate_detector`, with the same arguments as the console script
``harness-evaluate-detector`` of an installed package.
"""

import sys

from harness.apps.evaluate_detector import main

if __name__ == "__main__":
    sys.exit(main())
