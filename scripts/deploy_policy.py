"""Run an exported policy: ``python scripts/deploy_policy.py --help``.

The app is :mod:`harness.apps.deploy_policy`, with the same arguments as the console script
``harness-deploy-policy`` of an installed package.
"""

import sys

from harness.apps.deploy_policy import main

if __name__ == "__main__":
    sys.exit(main())
