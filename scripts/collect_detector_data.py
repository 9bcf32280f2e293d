"""Collect frames for a learned detector: ``python scripts/collect_detector_data.py --help``.

The app is :mod:`harness.apps.collect_detector_data`, with the same arguments as the console
script ``harness-collect-detector-data`` of an installed package.
"""

import sys

from harness.apps.collect_detector_data import main

if __name__ == "__main__":
    sys.exit(main())
