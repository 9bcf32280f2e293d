"""Options of a task environment (:class:`TaskConfig`) and its difficulty.

Difficulty is a float in [0, 1] or a dict of the task's named levels (``{"spawn": 0.2}``), each in
[0, 1]; :func:`resolve_difficulty` turns either into the levels a task's spawn sampler reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from tasks.checks import check_int, check_number
from tasks.randomization import RandomizationConfig
from tasks.rendering import QUALITIES, check_camera_name
from tasks.scene import PHYSICS
from tasks.wrappers import ImperfectionConfig

OBS_MODES = ("state", "pixels", "pixels_state")
MAX_EPISODE_STEPS = 1_000_000  # an episode's control steps: 11 hours at 25 Hz


@dataclass(frozen=True)
class TaskConfig:
    """Options every task accepts (``tasks.make(name, **options)``).

    Attributes:
        obs_mode: ``"state"``, ``"pixels"`` or ``"pixels_state"``.
        camera: Camera for pixel observations: ``"front"``, ``"side"``, ``"overhead"``,
            ``"wrist"``, or ``"goal"`` / ``"goal_side"`` (ride on the goal marker; tasks with
            one only).
        image_size: Side of the square pixel observation.
        render_quality: ``"fast"`` (learning cameras) or ``"high"`` (shadows, anti-aliasing).
        render_size: ``(height, width)`` of ``render()`` frames for videos.
        physics: Physics preset (``tasks.scene.PHYSICS``): ``"default"`` (2 ms x 20, what every
            recorded figure used) or ``"fast"`` (5 ms x 8, ~2.3x the env steps/s, other numbers).
            It fills ``timestep`` and ``substeps`` where they are not given.
        timestep: Physics step in seconds; ``None``: the preset's (0.002 by default).
        substeps: Physics steps per control step; ``None``: the preset's (20 by default: 25 Hz
            control).
        max_episode_steps: Control steps before ``truncated``, at most
            :data:`MAX_EPISODE_STEPS`; counted by the env so that a snapshot carries it
            (Gymnasium's ``TimeLimit`` would restart its count on restore).
        terminate_on_success: End the episode when the success predicate holds.
        difficulty: Difficulty used when ``reset`` is given none.
        reward_weights: Overrides of the task's reward-term weights.
        randomization: Domain randomisation block (off by default).
        imperfections: Real-world imperfections, Gymnasium wrappers around the env (off by
            default; :mod:`tasks.wrappers`).
    """

    obs_mode: str = "state"
    camera: str = "front"
    image_size: int = 84
    render_quality: str = "fast"
    render_size: tuple[int, int] = (240, 320)
    physics: str = "default"
    timestep: float | None = None
    substeps: int | None = None
    max_episode_steps: int | None = None
    terminate_on_success: bool = True
    difficulty: float = 1.0
    reward_weights: dict[str, float] = field(default_factory=dict)
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    imperfections: ImperfectionConfig = field(default_factory=ImperfectionConfig)

    def __post_init__(self) -> None:
        if self.obs_mode not in OBS_MODES:
            raise ValueError(f"obs_mode={self.obs_mode!r}; expected one of {OBS_MODES}")
        if self.render_quality not in QUALITIES:
            raise ValueError(f"render_quality={self.render_quality!r}; expected one of {QUALITIES}")
        check_camera_name(self.camera)
        if not isinstance(self.physics, str) or self.physics not in PHYSICS:
            raise ValueError(f"physics={self.physics!r}; expected one of {sorted(PHYSICS)}")
        preset = PHYSICS[self.physics]
        if self.timestep is None:
            object.__setattr__(self, "timestep", preset.timestep)
        if self.substeps is None:
            object.__setattr__(self, "substeps", preset.substeps)
        check_int("image_size", self.image_size, 8, 480)
        check_int("substeps", self.substeps, 1)
        if self.max_episode_steps is not None:
            check_int("max_episode_steps", self.max_episode_steps, 1, MAX_EPISODE_STEPS)
        if not (check_number("timestep", self.timestep) > 0):
            raise ValueError(f"timestep={self.timestep!r}; expected a positive number of seconds")
        if not isinstance(self.terminate_on_success, (bool, np.bool_)):
            raise ValueError(f"terminate_on_success={self.terminate_on_success!r}; expected true "
                             "or false (a boolean, not a string or number)")
        check_difficulty(self.difficulty)
        for term, weight in dict(self.reward_weights).items():
            check_number(f"reward_weights.{term}", weight)
        for name, block in (("randomization", RandomizationConfig),
                            ("imperfections", ImperfectionConfig)):
            value = getattr(self, name)
            if isinstance(value, dict):
                allowed = [f.name for f in fields(block)]
                unknown = sorted(set(value) - set(allowed))
                if unknown:
                    raise ValueError(f"unknown {name} option(s) {unknown}; allowed: {allowed}")
                object.__setattr__(self, name, block(**value))

    @classmethod
    def from_options(cls, task: str, options: dict[str, Any]) -> TaskConfig:
        """Build from keyword options, naming any unknown key and listing the allowed ones.

        ``suite`` (a suite's task: ``tasks.suites.check_options`` checks its options) is left
        out of the config.
        """
        options = dict(options)
        options.pop("suite", None)
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ValueError(
                f"unknown option(s) {unknown} for task {task!r}; allowed: {sorted(allowed)}"
            )
        return cls(**options)


def check_difficulty(value: Any) -> float:
    """Validate a scalar difficulty: a number in [0, 1] (not a string, not a bool)."""
    d = check_number("difficulty", value)
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"difficulty={value!r}; expected a number in [0, 1]")
    return d


def resolve_difficulty(
    value: Any, default: float, task: str, levels: tuple[str, ...]
) -> tuple[float, dict[str, float]]:
    """The overall difficulty and per-level values of a ``reset`` option.

    Args:
        value: ``None`` (use ``default``), a number in [0, 1], or a dict of named levels (the
            levels it does not name get ``default``).
        default: The configured difficulty.
        task: Task name, for error messages.
        levels: The task's named levels.

    Returns:
        The mean of the levels (the number itself when a number was given) and every level.

    Raises:
        ValueError: A level the task does not have, or a value outside [0, 1].
    """
    if value is None:
        value = default
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(levels))
        if unknown:
            raise ValueError(
                f"unknown difficulty level(s) {unknown} for task {task!r}; "
                f"levels are {list(levels)}"
            )
        resolved = {name: default for name in levels}
        for name, level in value.items():
            resolved[name] = check_difficulty(level)
        return float(np.mean(list(resolved.values()))), resolved
    d = check_difficulty(value)
    return d, {name: d for name in levels}
