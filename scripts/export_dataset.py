"""Export recorded demonstrations as a LeRobot dataset: ``python scripts/export_dataset.py --help``.

The app is :mod:`harness.apps.export_dataset`, with the same arguments as the console script
``harness-export-dataset`` of an installed package.
"""

import sys

from harness.apps.export_dataset import main

if __name__ == "__main__":
    sys.exit(main())
