"""Upper bounds of the config's sizes, counts, rates and seeds, and the checks that apply them.

A value past these limits cannot be meant: it would fail or misbehave only after the run folder
exists (an allocation of 10^9 attempts, 10^5 worker processes, a learning rate of -1). The
limits are generous, finite, and checked at config load with the key in the message.
"""

from __future__ import annotations

import os

from harness.config.errors import check

MAX_COUNT = 1_000_000  # attempts, start states, epochs, iterations, episodes, buffers ...
MAX_TIMESTEPS = 10**12  # environment steps of a budget or between saves
MAX_SEED = 2**32 - 1  # numpy's legacy seeding and most simulators take 32-bit seeds
MAX_TEMPERATURE = 100.0  # far past any useful flattening of the token distribution
MAX_CLIP_HIGH = 10.0  # DAPO's clip-higher exceeds clip_low; not 1 + 10 in a ratio
PROCESSES_PER_CPU = 8  # worker processes, environments or threads per CPU of this machine
MAX_CPUS_PER_WORKER = 1024  # more than one node of any cluster
MAX_GPUS_PER_WORKER = 64


def max_processes() -> int:
    """The most worker processes (or threads) one run may start on this machine:
    :data:`PROCESSES_PER_CPU` times its CPUs."""
    return PROCESSES_PER_CPU * (os.cpu_count() or 1)


def check_count(key: str, value: int, low: int = 1, high: int = MAX_COUNT) -> None:
    """Raise :class:`ConfigError` naming ``key`` unless ``low <= value <= high``.

    Args:
        key: The dotted config key, e.g. ``algo.group_size``.
        value: Its value.
        low: The least allowed.
        high: The most allowed.

    Raises:
        ConfigError: Naming ``key``, its value and the range.
    """
    check(low <= value <= high, f"{key}={value}; must be >= {low} and <= {high}")


def check_rate(key: str, value: float) -> None:
    """Raise :class:`ConfigError` naming ``key`` unless ``value`` is a step size in (0, 1].

    Args:
        key: The dotted config key, e.g. ``algo.learning_rate``.
        value: Its value.

    Raises:
        ConfigError: Naming ``key`` and its value.
    """
    check(0 < value <= 1, f"{key}={value}; must be > 0 and <= 1 (a learning rate)")
