"""Train a CNN success detector: ``python scripts/train_detector.py --help``.

The app is :mod:`harness.apps.train_detector`, with the same arguments as the console script
``harness-train-detector`` of an installed package.
"""

import sys

from harness.apps.train_detector import main

if __name__ == "__main__":
    sys.exit(main())
