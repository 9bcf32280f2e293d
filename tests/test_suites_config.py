"""The suites' tasks (tasks.suites) from the main environment, which has no Meta-World: refused by
name with the command that builds the environment that has it; our own tasks unchanged."""

from __future__ import annotations

import pytest

import tasks
from harness import config as harness_config
from harness.config import ConfigError
from tasks import suites


def test_a_suite_task_names_make_suites_where_the_suite_is_not_installed():
    with pytest.raises(ConfigError, match=r"needs the 'metaworld' package.*make suites"):
        harness_config.compose(["task=metaworld", "task.name=push-v3"])
    with pytest.raises(suites.SuiteError, match=r"make suites.*\.venv-suites/bin/python"):
        tasks.make("metaworld/push-v3")


@pytest.mark.parametrize(("name", "message"), [
    ("robotsuite/Lift", "task suite 'robotsuite' is unknown"),
    ("metaworld/push-v4", "metaworld task 'push-v4' is unknown"),
])
def test_unknown_suites_and_tasks_are_named_before_any_import(name, message):
    with pytest.raises(suites.SuiteError, match=message):
        tasks.make(name)


def test_our_own_tasks_options_and_names_are_unchanged():
    config = harness_config.compose(["task=push"])
    assert config.task.suite == "" and "suite" not in config.task.env_options()
    with pytest.raises(ValueError, match=r"unknown task 'pusj'.*metaworld/push-v3"):
        tasks.make("pusj")
    assert tasks.task_version("push") == tasks.TASKS["push"].version
    assert tasks.task_version("push-v3", "metaworld") == 2  # 2: instructions name every word
