"""The ``task`` group: which task, and the options of ``tasks.make``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import tasks
from harness.config.errors import ConfigError, check

# Which observation keys each ``task.obs_mode`` gives.
OBS_MODE_KEYS: dict[str, tuple[str, ...]] = {
    "state": ("state",),
    "pixels": ("pixels", "proprio"),
    "pixels_state": ("state", "pixels", "proprio"),
}


@dataclass
class TaskOptions:
    """The ``task`` group: which task, and the options of ``tasks.make`` (see ``tasks.TaskConfig``).

    Attributes:
        name: One of ``tasks.TASKS``, or with ``suite`` one of that suite's tasks.
        suite: Empty for our own tasks, or a suite of ``tasks.suites.SUITES``
            (``task=metaworld``: Meta-World v3, in the ``make suites`` environment).
        obs_mode: ``state``, ``pixels`` or ``pixels_state``.
        camera: Camera of pixel observations.
        image_size: Side of the square pixel observation.
        render_quality: ``fast`` or ``high`` for pixel observations.
        physics: Physics preset: ``default`` or ``fast`` (5 ms x 8 physics steps per control step
            instead of 2 ms x 20: faster, other numbers; docs/tasks.md).
        max_episode_steps: Episode length, at most ``tasks.config.MAX_EPISODE_STEPS`` (10^6);
            ``None`` keeps the task's own.
        terminate_on_success: End episodes on success.
        difficulty: Difficulty of resets that get none (evaluation's default).
        reward_weights: Overrides of the task's reward-term weights.
        randomization: Fields of ``tasks.RandomizationConfig``.
        imperfections: Fields of ``tasks.ImperfectionConfig`` (real-world imperfections as
            wrappers; docs/sim_to_real.md).
    """

    name: str = "reach"
    suite: str = ""
    obs_mode: str = "state"
    camera: str = "front"
    image_size: int = 84
    render_quality: str = "fast"
    physics: str = "default"
    max_episode_steps: int | None = None
    terminate_on_success: bool = True
    difficulty: float = 1.0
    reward_weights: dict[str, float] = field(default_factory=dict)
    randomization: dict[str, Any] = field(default_factory=dict)
    imperfections: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.suite:
            from tasks import suites

            try:
                suites.check_task(self.suite, self.name)
                options = self.env_options()
                del options["suite"]
                suites.check_options(self.suite, self.name, options)
                tasks.TaskConfig.from_options(self.name, options)
            except ValueError as error:
                raise ConfigError(f"task: {error}") from None
            return
        check(self.name in tasks.TASKS,
              f"task.name={self.name!r} is unknown; choose one of {sorted(tasks.TASKS)}")
        try:
            tasks.TaskConfig.from_options(self.name, self.env_options())
        except ValueError as error:
            raise ConfigError(f"task: {error}") from None
        terms = tasks.TASKS[self.name].reward_weights
        unknown = sorted(set(self.reward_weights) - set(terms))
        check(not unknown, f"task.reward_weights: {unknown} unknown for task {self.name!r}; "
                           f"its terms are {sorted(terms)}")

    def env_options(self) -> dict[str, Any]:
        """Keyword options for ``tasks.make(self.name, **options)``."""
        options = dataclasses.asdict(self)
        del options["name"]
        if not options["suite"]:  # our own tasks' options stay as they were
            del options["suite"]
        if options["max_episode_steps"] is None:
            del options["max_episode_steps"]
        return options
