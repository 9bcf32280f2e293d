"""The scripted detector: the task's own success predicate on the simulator state.

It calls ``env.unwrapped.task.is_success(env.unwrapped)``, the very function the environment uses
for ``info["is_success"]``, so the two can never disagree: there is one source of truth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from success_detectors.base import SuccessDetector


class ScriptedDetector(SuccessDetector):
    """Ground-truth detector reading the simulator state; serves every task.

    The batch key ``env`` holds one task environment or a sequence of them (one per row). The
    probabilities are exactly 0 or 1.
    """

    requires: ClassVar[tuple[str, ...]] = ("env",)

    def __init__(self, threshold: float = 0.5) -> None:
        super().__init__(threshold=threshold)

    def predict_proba(self, batch: Mapping[str, Any]) -> np.ndarray:
        self._require(batch)
        envs = batch["env"]
        if not isinstance(envs, Sequence):
            envs = [envs]
        verdicts = []
        for index, env in enumerate(envs):
            base = getattr(env, "unwrapped", env)
            task = getattr(base, "task", None)
            if task is None or not hasattr(task, "is_success"):
                raise ValueError(
                    f"batch['env'][{index}] is a {type(env).__name__} with no task; expected an "
                    "environment from tasks.make(...)"
                )
            verdicts.append(task.is_success(base))
        return np.asarray(verdicts, dtype=np.float64)
