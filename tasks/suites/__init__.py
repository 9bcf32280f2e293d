"""Tasks of the suites people report on, as ours: Meta-World v3 and robosuite (Lift, Stack, Door).

``tasks.make("metaworld/push-v3", obs_mode="pixels")`` (or ``tasks.make("push-v3",
suite="metaworld")``, what the Hydra group ``task=metaworld task.name=push-v3`` calls) builds a
:class:`tasks.suites.adapter.SuiteEnv`: the suite's own simulation, success and expert behind our
observation, reset options and exact snapshots.

The suites pin MuJoCo 3.3.x (Meta-World 3.1.1 and robosuite 1.5.2 fail on MuJoCo 4.0), so they
live in a second environment, ``.venv-suites/``, built by ``make suites``; a suite that is not
installed in the running Python is refused by name with that command.

Every task is checked for exact snapshots (:func:`tasks.suites.adapter.check_exact`) the first
time it is built in a process, per observation mode; one that fails is refused.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

from tasks.suites import metaworld
from tasks.suites import robosuite as robosuite_tasks
from tasks.suites.adapter import SuiteBackend, SuiteEnv, SuiteError, check_exact

SUITES: dict[str, tuple[str, ...]] = {"metaworld": metaworld.TASKS,
                                      "robosuite": robosuite_tasks.TASKS}
CAMERAS: dict[str, tuple[str, ...]] = {"metaworld": metaworld.CAMERAS,
                                       "robosuite": robosuite_tasks.CAMERAS}
PACKAGES = {"metaworld": "metaworld", "robosuite": "robosuite"}
SUITE_OPTIONS = ("obs_mode", "camera", "image_size", "render_quality", "max_episode_steps",
                 "terminate_on_success", "difficulty")
# Options of our own tasks that a suite task cannot honour: refused unless at their defaults.
OUR_DEFAULTS: dict[str, Any] = {"physics": "default", "reward_weights": {}, "randomization": {},
                                "imperfections": {}}
INSTALL_HINT = ("run `make suites` (it builds .venv-suites/ with MuJoCo 3.3.x and the suites) "
                "and use .venv-suites/bin/python")
_CHECKED: set[tuple[str, str, str]] = set()


def split_name(name: str) -> tuple[str, str] | None:
    """``"metaworld/push-v3"`` -> ``("metaworld", "push-v3")``; ``None`` for our own names."""
    if "/" not in name:
        return None
    suite, task = name.split("/", 1)
    return suite, task


def check_task(suite: str, name: str) -> None:
    """Refuse an unknown suite or task, or a suite not installed here, by name.

    Raises:
        SuiteError: Naming the value and the choices (or the install command).
    """
    if suite not in SUITES:
        raise SuiteError(f"task suite {suite!r} is unknown; choose one of {sorted(SUITES)}")
    if name not in SUITES[suite]:
        raise SuiteError(f"{suite} task {name!r} is unknown; choose one of {list(SUITES[suite])}")
    if importlib.util.find_spec(PACKAGES[suite]) is None:
        raise SuiteError(f"task {suite}/{name} needs the {PACKAGES[suite]!r} package, which this "
                         f"Python does not have: {INSTALL_HINT}")


def check_options(suite: str, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options of :class:`SuiteEnv` among ``options`` (those of ``tasks.make``).

    Raises:
        SuiteError: An option a suite task cannot honour (ours only), named.
    """
    options = dict(options)
    for key, default in OUR_DEFAULTS.items():
        value = options.pop(key, default)
        if value != default and not (default == {} and not value):
            raise SuiteError(f"{key}={value!r} is an option of our own tasks; {suite}/{name} "
                             f"takes only {list(SUITE_OPTIONS)}")
    unknown = sorted(set(options) - set(SUITE_OPTIONS))
    if unknown:
        raise SuiteError(f"unknown option(s) {unknown} for {suite}/{name}; "
                         f"expected some of {list(SUITE_OPTIONS)}")
    camera = options.get("camera")
    if camera is not None and suite in CAMERAS:
        views = str(camera).split("+")
        if not all(view in CAMERAS[suite] for view in views):
            raise SuiteError(f"camera={camera!r}: {suite}'s cameras are {list(CAMERAS[suite])} "
                             "(join several with '+')")
    return options


def _backend(suite: str, name: str) -> SuiteBackend:
    with warnings.catch_warnings():
        # Meta-World warns about its own scripted policies' gains at import
        warnings.simplefilter("ignore", UserWarning)
        if suite == "metaworld":
            return metaworld.MetaWorldBackend(name)
        if suite == "robosuite":
            return robosuite_tasks.RobosuiteBackend(name)
    raise SuiteError(f"task suite {suite!r} is unknown; choose one of {sorted(SUITES)}")


def make(suite: str, name: str, render_mode: str | None = None, verify: bool = True,
         **options: Any) -> SuiteEnv:
    """Build one suite task as our env.

    Args:
        suite: One of :data:`SUITES`.
        name: One of the suite's tasks.
        render_mode: ``None`` or ``"rgb_array"``.
        verify: Check exact snapshots once per task and observation mode in this process.
        **options: Options of ``tasks.make``; those of :data:`SUITE_OPTIONS` are used, ours
            (physics, randomisation, imperfections, reward weights) must stay at their defaults.

    Raises:
        SuiteError: An unknown or missing suite or task, an option it cannot honour, or a task
            whose snapshots are not exact.
    """
    check_task(suite, name)
    options = check_options(suite, name, options)

    def build() -> SuiteEnv:
        return SuiteEnv(_backend(suite, name), render_mode=render_mode, **options)

    key = (suite, name, str(options.get("obs_mode", "state")))
    if verify and key not in _CHECKED:
        check_exact(build)
        _CHECKED.add(key)
    return build()


__all__ = ["SUITES", "SuiteEnv", "SuiteError", "check_exact", "check_options", "check_task",
           "make", "split_name"]
