"""Write the experiment report of a sweep: ``python scripts/report.py --help``.

The app is :mod:`harness.apps.report`, with the same arguments as the console script
``harness-report`` of an installed package.
"""

import sys

from harness.apps.report import main

if __name__ == "__main__":
    sys.exit(main())
