"""Shared test settings: one torch thread, headless rendering chosen by ``tasks``, and the groups
by which ``make test`` spreads the suite over two processes (pytest-xdist, ``--dist loadgroup``).
"""

import pytest
import torch

import tasks  # noqa: F401  (sets MUJOCO_GL before anything imports mujoco)

torch.set_num_threads(1)

# Tests that start local Ray clusters (a file of them, or a test marked ``ray``): one worker runs
# them all, one after the other, so that two clusters never start side by side (a second
# ``ray.init`` may join the first, which the first test then shuts down under it).
RAY_FILES = {"test_rollout_backends.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep each file on one worker (its module fixtures are built once), Ray tests together."""
    for item in items:
        name = item.path.name
        ray = name in RAY_FILES or item.get_closest_marker("ray") is not None
        item.add_marker(pytest.mark.xdist_group("ray" if ray else name))
