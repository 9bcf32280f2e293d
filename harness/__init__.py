"""Learning, rollouts, curriculum and runs over the tasks of :mod:`tasks`.

Importing the package registers the Gymnasium ids of the tasks (``harness/Reach-v0``,
``harness/Push-v0``, ...) exactly as ``import tasks`` does, so ``import harness`` is enough before
``gymnasium.make("harness/Push-v0")``.
"""

import tasks  # noqa: F401  (registers the harness/... Gymnasium ids)
