"""Export a trained token policy: ``python scripts/export_policy.py --help``.

The app is :mod:`harness.apps.export_policy`, with the same arguments as the console script
``harness-export-policy`` of an installed package.
"""

import sys

from harness.apps.export_policy import main

if __name__ == "__main__":
    sys.exit(main())
