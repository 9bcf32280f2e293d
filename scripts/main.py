"""The main job: ``python scripts/main.py --help``.

The app is :mod:`harness.apps.main`, with the same arguments as the console script
``harness-main-job`` of an installed package.
"""

import sys

from harness.apps.main import main

if __name__ == "__main__":
    sys.exit(main())
