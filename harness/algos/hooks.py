"""What every trainer's loop shares: step schedules, the time guard, the choice of ``best``,
handing freed memory back to the operating system.

The SB3 trainer calls these from its callbacks (:mod:`harness.algos.sb3.run`), the group trainer
from its loop (:mod:`harness.algos.group.run`), so that periodic evaluation, checkpoints, the
``max_minutes`` guard and the ``best`` checkpoint behave the same for every algorithm, and a
resumed run continues each schedule where the checkpoint left it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
from typing import Any

log = logging.getLogger(__name__)


class Schedule:
    """Fires at the multiples of ``every`` environment steps (``every=0`` never fires).

    Args:
        every: Steps between firings.
        next_step: The first step at which it fires (default ``every``).
    """

    def __init__(self, every: int, next_step: int | None = None) -> None:
        self.every = int(every)
        self.next_step = self.every if next_step is None else int(next_step)

    def due(self, steps: int) -> bool:
        """Whether ``steps`` has reached the next firing."""
        return self.every > 0 and steps >= self.next_step

    def advance(self, steps: int) -> None:
        """Schedule the next firing at the first multiple of ``every`` above ``steps``."""
        self.next_step = (steps // self.every + 1) * self.every

    def state_dict(self) -> dict[str, int]:
        return {"every": self.every, "next_step": self.next_step}

    def load_state_dict(self, state: dict[str, int] | None) -> None:
        """Continue a saved schedule (``None``: keep the fresh one); a changed ``every`` restarts
        it from the saved firing."""
        if state is not None:
            self.next_step = int(state["next_step"])


class TimeGuard:
    """``max_minutes`` of a run's wall clock (all sessions of a resumed run) as a guard.

    Budgets are counted in steps or iterations, so that a result does not depend on the
    machine's load; the guard only stops a run that would otherwise overrun, says so in the
    log, and ``reached`` goes into ``summary.json`` (``time_limit_reached``).

    Args:
        run: The ``harness.runs.Run`` whose ``elapsed()`` is the clock.
        max_minutes: The limit, or ``None`` for none.
    """

    def __init__(self, run, max_minutes: float | None) -> None:
        self.run = run
        self.limit_s = None if max_minutes is None else 60.0 * max_minutes
        self.reached = False

    def expired(self, steps: int) -> bool:
        """Whether the limit has passed (logged once, at ``steps``)."""
        if self.limit_s is None or self.run.elapsed() <= self.limit_s:
            return False
        if not self.reached:
            log.warning("max_minutes=%.4g cut the run short at %d env steps: a time guard, so "
                        "this result depends on the machine", self.limit_s / 60.0, steps)
        self.reached = True
        return True


def better(result, best: dict[str, float] | None) -> bool:
    """Whether an evaluation beats the best so far: higher success rate, then higher return.

    Args:
        result: A ``harness.evaluation.EvaluationResult``.
        best: ``{"success_rate", "mean_return"}`` of the best so far, or ``None``.
    """
    if best is None:
        return True
    return (result.success_rate, result.mean_return) > (best["success_rate"],
                                                        best["mean_return"])


def score(result) -> dict[str, Any]:
    """The part of an evaluation that :func:`better` compares (saved as ``best``)."""
    return {"success_rate": result.success_rate, "mean_return": result.mean_return}


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or ``None`` where there is none (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Hand the free pages of every malloc arena back to the operating system (glibc's
    ``malloc_trim(0)``); a no-op without glibc.

    Each group iteration receives tens of MB of observations and allocates update tensors whose
    size follows the number of kept attempts. glibc serves such blocks from its heap once it has
    raised its mmap threshold (up to 32 MB, as large blocks are freed), and gives memory back
    only from the top of a heap: the pages of the holes between live blocks stay resident. Left
    so, the pixel soak of ``benchmarks/soak_group.py`` grew the trainer process by 13-16 MiB/min;
    trimmed after each iteration, its memory between iterations stays flat (docs/results.md).

    Returns:
        Whether glibc was asked to trim (``False`` where it is absent).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
