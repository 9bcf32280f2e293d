"""Evaluate a saved checkpoint: ``python scripts/evaluate.py --help``.

The app is :mod:`harness.apps.evaluate`, with the same arguments as the console script
``harness-evaluate`` of an installed package.
"""

import sys

from harness.apps.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
