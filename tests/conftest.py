"""Shared test settings: one torch thread, idle OpenMP threads that sleep, headless rendering
chosen by ``tasks``, the groups by which ``make test`` spreads the suite over two processes
(pytest-xdist, ``--dist loadgroup``), and ``built_once`` for an artefact that both processes read.
"""

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

# Inherited by every process a test starts: an OpenMP thread waiting for work sleeps instead of
# spinning. A run with torch_threads=2 beside the other test process otherwise burnt three times
# the CPU it needs (both cores, taken from the other process). Results do not change.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch
from filelock import FileLock

import tasks  # noqa: F401  (sets MUJOCO_GL before anything imports mujoco)

torch.set_num_threads(1)

# tests/suites/ needs the suites' own environment (MuJoCo 3.3.x, Meta-World, robosuite): `make test`
# runs it with .venv-suites/bin/python after this suite; elsewhere it is left out, and said so.
SUITES_HERE = importlib.util.find_spec("metaworld") is not None
collect_ignore = [] if SUITES_HERE else ["suites"]


def pytest_report_header(config: pytest.Config) -> str | None:
    if SUITES_HERE:
        return None
    return ("tests/suites/: not collected (this Python has no metaworld); `make test` runs it "
            "with .venv-suites/bin/python (make suites)")

# Tests that start local Ray clusters, or that reach for one, are marked ``ray``: one worker runs
# them all, one after the other, so that two clusters never start side by side (a second
# ``ray.init`` may join the first, which the first test then shuts down under it). The other
# tests of their files balance across the workers as every file does.


def uses_local_ray(item: pytest.Item | None) -> bool:
    return "local_ray" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep each file on one worker (its module fixtures are built once), Ray tests together,
    and the tests that share ``local_ray`` one after the other, last.

    With ``--dist loadgroup`` a worker's test ids end in ``@<group>``, and the controller hands
    out whole groups. pytest-xdist writes that suffix to ``item._nodeid``, which pytest >= 9.2 no
    longer reads (a test's id is ``item._id``, a ``NodeId``); there the suffix is written here,
    else every test was a group of its own: files split across both workers, their module
    fixtures built twice, and Ray tests running side by side. This hook runs last, after
    xdist's and after ``-m`` has deselected what it deselects."""
    items.sort(key=uses_local_ray)  # a stable sort: the other tests keep their order
    loadgroup = bool(getattr(config.option, "loadgroup", False))  # set on xdist's workers
    for item in items:
        ray = item.get_closest_marker("ray") is not None or uses_local_ray(item)
        group = "ray" if ray else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))
        if loadgroup and not item.nodeid.endswith(f"@{group}"):
            tagged = f"{item.nodeid}@{group}"
            if hasattr(item, "_id"):  # pytest >= 9.2
                item._id = type(item._id).parse(tagged)
            else:
                item._nodeid = tagged


@pytest.fixture
def local_ray():
    """A local Ray instance of two CPUs, for a test whose run puts its workers in it (``ray``
    marked, so on the Ray group's worker). A start costs seconds, so the tests that ask for it
    run one after the other (last, see above) and share one instance; it is shut down after
    the last of them (``pytest_runtest_teardown``), so every other test finds no Ray running
    (some check the instance that they start themselves)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20,
                 log_to_driver=False)
    return ray


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Shut ``local_ray`` down after the last consecutive test that uses it."""
    ray = sys.modules.get("ray")
    if uses_local_ray(item) and not uses_local_ray(nextitem) and ray and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``built_once(name, build)``: the folder ``name``, which ``build(folder)`` fills once per
    test run, shared by both xdist workers: the first to ask builds it under a lock, the other
    waits for it and reads it.

    For an expensive artefact that tests of two groups read (a sweep that the Ray group and the
    rest of its file both compare against); tests copy it before they change it. Without xdist,
    or where a build failed half-way (no ``.built`` mark), it is built afresh."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built_once"
    root.mkdir(exist_ok=True)

    def build_or_reuse(name: str, build: Callable[[Path], None]) -> Path:
        folder, done = root / name, root / f"{name}.built"
        with FileLock(str(root / f"{name}.lock")):
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                build(folder)
                done.touch()
        return folder

    return build_or_reuse
