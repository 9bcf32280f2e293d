"""Train a policy on a task: ``python scripts/train.py --help``.

The app is :mod:`harness.apps.train`, with the same arguments as the console script
``harness-train`` of an installed package.
"""

import sys

from harness.apps.train import main

if __name__ == "__main__":
    sys.exit(main())
