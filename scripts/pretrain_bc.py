"""Behaviour-clone a token policy on demonstrations: ``python scripts/pretrain_bc.py --help``.

The app is :mod:`harness.apps.pretrain_bc`, with the same arguments as the console script
``harness-pretrain-bc`` of an installed package.
"""

import sys

from harness.apps.pretrain_bc import main

if __name__ == "__main__":
    sys.exit(main())
