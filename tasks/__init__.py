"""MuJoCo manipulation tasks behind the Gymnasium API.

``tasks.make("push", obs_mode="pixels")`` builds an environment; the same tasks are registered
with Gymnasium as ``harness/Reach-v0``, ``harness/Push-v0``, ``harness/PickPlace-v0`` and
``harness/DrawerOpen-v0``. See :class:`tasks.base.ManipulationEnv` for the env contract and
:class:`tasks.task.Task` for what every task answers (success, success margin, goal region).
"""

from __future__ import annotations

from tasks.rendering import choose_gl_backend

choose_gl_backend()  # MuJoCo reads MUJOCO_GL at import: choose before anything imports it

import logging  # noqa: E402

# PyOpenGL, which mujoco imports, logs at INFO that its optional accelerator is missing: noise in
# the log of an app that imports the tasks after logging is set up (a Hydra task function).
logging.getLogger("OpenGL.acceleratesupport").setLevel(logging.WARNING)

import gymnasium as gym  # noqa: E402
import mujoco  # noqa: E402

from tasks.base import ManipulationEnv  # noqa: E402
from tasks.config import TaskConfig  # noqa: E402
from tasks.drawer import DrawerOpen  # noqa: E402
from tasks.experts import ScriptedExpert  # noqa: E402
from tasks.pick_place import PickPlace  # noqa: E402
from tasks.push import Push  # noqa: E402
from tasks.randomization import RandomizationConfig  # noqa: E402
from tasks.reach import Reach  # noqa: E402
from tasks.snapshot import (  # noqa: E402
    Snapshot,
    load_snapshot,
    save_snapshot,
    snapshot_from_bytes,
    snapshot_to_bytes,
)
from tasks.task import Task  # noqa: E402
from tasks.wrappers import ImperfectionConfig, wrap  # noqa: E402

TASKS: dict[str, type[Task]] = {
    "reach": Reach,
    "push": Push,
    "pick_place": PickPlace,
    "drawer_open": DrawerOpen,
}
GYM_IDS: dict[str, str] = {
    "reach": "harness/Reach-v0",
    "push": "harness/Push-v0",
    "pick_place": "harness/PickPlace-v0",
    "drawer_open": "harness/DrawerOpen-v0",
}


def make(name: str, render_mode: str | None = None, **options) -> ManipulationEnv:
    """Build a task environment by name: the :class:`ManipulationEnv` itself, or, with
    ``imperfections`` on, that env inside the wrappers of :mod:`tasks.wrappers` (which read
    every other attribute through to it and keep ``snapshot``/``restore`` exact).

    Args:
        name: One of :data:`TASKS`, or a suite's task as ``"<suite>/<task>"``
            (:mod:`tasks.suites`, e.g. ``"metaworld/push-v3"``).
        render_mode: ``None`` or ``"rgb_array"``.
        **options: Fields of :class:`tasks.base.TaskConfig`; ``suite="metaworld"`` makes
            ``name`` that suite's task.

    Raises:
        ValueError: Unknown task name or option, or an invalid option value.
    """
    suite = options.pop("suite", "") or ""
    if suite or "/" in name:  # another suite's task: tasks.suites
        from tasks import suites

        if not suite:
            suite, name = suites.split_name(name)
        return suites.make(suite, name, render_mode=render_mode, **options)
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)} (or a suite's "
                         "task, e.g. 'metaworld/push-v3')")
    config = TaskConfig.from_options(name, options)
    return wrap(ManipulationEnv(TASKS[name](), config, render_mode=render_mode),
                config.imperfections)


def task_version(name: str, suite: str = "") -> int:
    """The task's :attr:`tasks.task.Task.version` (a suite's task:
    :data:`tasks.suites.adapter.SUITE_TASK_VERSION`)."""
    if suite or "/" in name:
        from tasks.suites.adapter import SUITE_TASK_VERSION

        return SUITE_TASK_VERSION
    return TASKS[name].version


def _log_mujoco_warning(message: str) -> None:
    # MuJoCo's default handler appends to MUJOCO_LOG.TXT in the working directory; the env
    # already reports instabilities in info["physics_error"], so a log line is enough here.
    logging.getLogger("mujoco").warning(message)


def _register() -> None:
    for name, env_id in GYM_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="tasks:make", kwargs={"name": name})


_register()
mujoco.set_mju_user_warning(_log_mujoco_warning)

__all__ = [
    "GYM_IDS", "TASKS", "ImperfectionConfig", "ManipulationEnv", "RandomizationConfig",
    "ScriptedExpert", "Snapshot",
    "load_snapshot", "save_snapshot", "snapshot_from_bytes", "snapshot_to_bytes",
    "Task", "TaskConfig", "make", "task_version",
]
