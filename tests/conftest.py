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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep each file on one worker (its module fixtures are built once), Ray tests together.

    With ``--dist loadgroup`` a worker's test ids end in ``@<group>``, and the controller hands
    out whole groups. pytest-xdist writes that suffix to ``item._nodeid``, which pytest >= 9.2 no
    longer reads (a test's id is ``item._id``, a ``NodeId``); there the suffix is written here,
    else every test was a group of its own: files split across both workers, their module
    fixtures built twice, and Ray tests running side by side. This hook runs last, after
    xdist's and after ``-m`` has deselected what it deselects."""
    loadgroup = bool(getattr(config.option, "loadgroup", False))  # set on xdist's workers
    for item in items:
        name = item.path.name
        ray = name in RAY_FILES or item.get_closest_marker("ray") is not None
        group = "ray" if ray else name
        item.add_marker(pytest.mark.xdist_group(group))
        if loadgroup and not item.nodeid.endswith(f"@{group}"):
            tagged = f"{item.nodeid}@{group}"
            if hasattr(item, "_id"):  # pytest >= 9.2
                item._id = type(item._id).parse(tagged)
            else:
                item._nodeid = tagged
