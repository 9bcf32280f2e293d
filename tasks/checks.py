"""Checks of the values that reach a task from outside: options, actions.

Each raises ``ValueError`` naming the value (and the option), before anything is simulated.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def check_number(name: str, value: Any) -> float:
    """A finite real number (not a bool, not a string), as a float.

    Raises:
        ValueError: Naming ``name`` and the value.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise ValueError(f"{name}={value!r}; expected a finite number")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name}={value!r}; expected a finite number")
    return float(value)


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """An integer (not a bool, not 1.5) in [low, high].

    Raises:
        ValueError: Naming ``name``, the value and the range.
    """
    bound = f"{low}..{high}" if high is not None else f">= {low}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}={value!r}; expected an integer {bound}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name}={value!r}; expected an integer {bound}")
    return int(value)


def check_action(action: Any) -> np.ndarray:
    """Real, finite numbers of shape (4,), as float64 clipped to [-1, 1] (a huge finite value
    is clipped like any other); anything else raises before the simulator moves.

    Raises:
        ValueError: Naming the action and what is wrong with it.
    """
    array = np.asarray(action)
    if array.dtype.kind not in "iuf":
        raise ValueError(f"action {action!r} has dtype {array.dtype}; expected real numbers "
                         "(dx, dy, dz, gripper) in [-1, 1]")
    if array.shape != (4,):
        raise ValueError(f"action has shape {array.shape}; expected (4,) = dx, dy, dz, gripper")
    array = array.astype(np.float64)
    if not np.isfinite(array).all():
        raise ValueError(f"action {array.tolist()} is not finite; expected values in [-1, 1]")
    return np.minimum(np.maximum(array, -1.0), 1.0)
