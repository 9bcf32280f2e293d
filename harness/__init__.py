"""Learning, rollouts, curriculum and runs over the tasks of :mod:`tasks`.

Importing the package registers the Gymnasium ids of the tasks (``harness/Reach-v0``,
``harness/Push-v0``, ...) exactly as ``import tasks`` does, so ``import harness`` is enough before
``gymnasium.make("harness/Push-v0")``.

With ``HARNESS_KERNELS=portable`` in the environment, the first import makes the process use
the same floating-point kernels on any processor type (:mod:`harness_common.kernels`).
"""

from harness_common import kernels as _kernels

_kernels.activate()  # HARNESS_KERNELS=portable: the same kernels on any processor type

import tasks  # noqa: E402,F401  (registers the harness/... Gymnasium ids)
