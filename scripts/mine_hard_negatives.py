"""Mine hard negatives for a CNN success detector: ``python scripts/mine_hard_negatives.py --help``.

The app is :mod:`harness.apps.mine_hard_negatives`, with the same arguments as the console script
``harness-mine-hard-negatives`` of an installed package.
"""

import sys

from harness.apps.mine_hard_negatives import main

if __name__ == "__main__":
    sys.exit(main())
