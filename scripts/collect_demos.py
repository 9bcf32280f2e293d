"""Record scripted-expert demonstrations: ``python scripts/collect_demos.py --help``.

The app is :mod:`harness.apps.collect_demos`, with the same arguments as the console script
``harness-collect-demos`` of an installed package.
"""

import sys

from harness.apps.collect_demos import main

if __name__ == "__main__":
    sys.exit(main())
