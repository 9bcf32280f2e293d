"""Real-world imperfections as Gymnasium wrappers: action noise, action latency, control-rate
jitter, observation noise and dropped frames (:class:`ImperfectionConfig`, all off by default).

``tasks.make(name, imperfections={...})`` stacks the ones that are on around the task's
:class:`~tasks.base.ManipulationEnv` (:func:`wrap`); each is also usable alone.

**Randomness and snapshots.** Each wrapper draws from its own generator, restarted at every
reset from a digest of the start state (the base env's snapshot: physics, task state, RNG
state) and the reset option ``noise_key`` (an integer, default 0). So the noise of an episode
is a function of where it starts and of its key: a reset and a restore of that reset's snapshot
(``reset(options={"snapshot": s})`` or :meth:`ImperfectionWrapper.restore`) with the same key
play identically, and attempts restored from one snapshot with different keys (the group
trainer passes each attempt's index) draw independent noise. A snapshot
(:meth:`ImperfectionWrapper.snapshot`) holds the base env's state only: restoring it restarts
the wrappers' state (latency queue, last frame, noise streams) as a reset from that state
would, which is exact for snapshots taken at a reset, as every group start state is.
Restore through the wrapped env, not through ``env.unwrapped``, or the wrappers keep the state
of the episode before.

**Scales (automatic domain randomisation).** The reset option ``imperfections`` (``{name:
(low, high)}``, names from :data:`SCALABLE`) scales the configured level of a continuous
imperfection for one episode: its wrapper draws a scale uniformly in ``[low, high]`` and plays
``scale * level`` (a scale of 0 turns the noise off); without the option the scale is 1, the
configured level. The draw comes from a generator of the start snapshot alone, apart from the
noise streams and independent of ``noise_key``, so the attempts restored from one snapshot play
the same scale (:func:`imperfection_scales` draws the same numbers outside the wrappers). A
snapshot does not hold the ranges: a restore plays them when given them
(:meth:`ImperfectionWrapper.restore`), as a reset would.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from tasks.checks import check_action, check_int, check_number
from tasks.snapshot import Snapshot

MAX_LATENCY = 50  # control steps (two seconds at 25 Hz)
# The imperfections whose level the reset option ``imperfections`` scales: the continuous ones
# (latency and dropped frames are discrete).
SCALABLE = ("action_noise", "control_jitter", "observation_noise")
SCALE_STREAM = 100  # a wrapper's scale draws from stream SCALE_STREAM + its noise stream


@dataclass(frozen=True)
class ImperfectionConfig:
    """Imperfections of a real robot, each off (0) by default.

    Attributes:
        action_noise: Standard deviation of Gaussian noise added to every action dimension,
            in action units (1 = 2 cm of end-effector motion per step; the gripper's -1..1).
        action_latency: Control steps between a command and its execution (a FIFO of actions;
            the first ``k`` steps of an episode execute "hold": no motion, gripper as it was).
        control_jitter: Relative jitter of the control period: each step simulates
            ``substeps * (1 + u)`` physics steps (rounded, at least 1), ``u`` uniform in
            ``[-jitter, jitter]``; a fraction in [0, 1).
        observation_noise: Standard deviation of Gaussian noise added to the ``state`` and
            ``proprio`` observations, in their units (metres, metres per second, quaternion
            components).
        dropped_frames: Probability that a step's ``pixels`` repeat the previous image (the
            first image of an episode is always fresh); no effect without pixels.
    """

    action_noise: float = 0.0
    action_latency: int = 0
    control_jitter: float = 0.0
    observation_noise: float = 0.0
    dropped_frames: float = 0.0

    def __post_init__(self) -> None:
        for name in ("action_noise", "observation_noise"):
            if check_number(f"imperfections.{name}", getattr(self, name)) < 0:
                raise ValueError(f"imperfections.{name}={getattr(self, name)!r}; expected a "
                                 "standard deviation >= 0")
        check_int("imperfections.action_latency", self.action_latency, 0, MAX_LATENCY)
        if not 0 <= check_number("imperfections.control_jitter", self.control_jitter) < 1:
            raise ValueError(f"imperfections.control_jitter={self.control_jitter!r}; expected a "
                             "fraction in [0, 1)")
        if not 0 <= check_number("imperfections.dropped_frames", self.dropped_frames) <= 1:
            raise ValueError(f"imperfections.dropped_frames={self.dropped_frames!r}; expected a "
                             "probability in [0, 1]")

    @property
    def any(self) -> bool:
        """Whether any imperfection is on."""
        return any(getattr(self, f.name) for f in fields(self))


def wrap(env: gym.Env, config: ImperfectionConfig) -> gym.Env:
    """``env`` with the imperfections of ``config`` that are on, innermost first: control-rate
    jitter, latency, action noise, observation noise, dropped frames (so the policy's action is
    noised, then queued, then simulated; its observation is noised, then maybe dropped)."""
    if config.control_jitter:
        env = ControlRateJitter(env, config.control_jitter)
    if config.action_latency:
        env = ActionLatency(env, config.action_latency)
    if config.action_noise:
        env = ActionNoise(env, config.action_noise)
    if config.observation_noise:
        env = ObservationNoise(env, config.observation_noise)
    if config.dropped_frames:
        env = DroppedFrames(env, config.dropped_frames)
    return env


def noise_generator(snapshot: Snapshot, key: int, stream: int) -> np.random.Generator:
    """The generator of one wrapper (``stream``) for an episode starting at ``snapshot`` with
    reset option ``noise_key=key``."""
    digest = hashlib.sha256(snapshot.physics)
    for name, value in sorted(snapshot.task_state.items()):  # arrays by their bytes: a repr
        digest.update(name.encode())                         # would follow print options
        digest.update(value.tobytes() if isinstance(value, np.ndarray) else repr(value).encode())
    digest.update(repr(snapshot.rng_state).encode())
    start = int.from_bytes(digest.digest()[:16], "little")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([start, stream, key])))


def check_scale_ranges(ranges: Mapping[str, Any] | None) -> dict[str, tuple[float, float]]:
    """The reset option ``imperfections``: ``{name: (low, high)}`` with names from
    :data:`SCALABLE` and ``0 <= low <= high``, finite.

    Raises:
        ValueError: An unknown name or a malformed range, naming it and the value.
    """
    if ranges is None:
        return {}
    if not isinstance(ranges, Mapping):
        raise ValueError(f"reset option imperfections={ranges!r}; expected {{name: (low, "
                         f"high)}} with names from {list(SCALABLE)}")
    unknown = sorted(set(ranges) - set(SCALABLE))
    if unknown:
        raise ValueError(f"reset option imperfections: {unknown} cannot be scaled; scalable "
                         f"imperfections are {list(SCALABLE)}")
    checked = {}
    for name, value in ranges.items():
        try:
            low, high = (check_number(name, v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"reset option imperfections.{name}={value!r}; expected a range "
                             "(low, high) of two finite numbers") from None
        if not 0 <= low <= high:
            raise ValueError(f"reset option imperfections.{name}={(low, high)}; expected a "
                             "scale range with 0 <= low <= high")
        checked[name] = (low, high)
    return checked


def draw_scale(start: Snapshot, stream: int, bounds: tuple[float, float]) -> float:
    """The scale in ``bounds`` (uniform) of wrapper ``stream`` for an episode starting at
    ``start``, whatever its ``noise_key``; ``low`` itself when ``low == high``."""
    low, high = bounds
    if low == high:
        return float(low)
    return float(noise_generator(start, 0, SCALE_STREAM + stream).uniform(low, high))


class ImperfectionWrapper(gym.Wrapper):
    """What the imperfection wrappers share: a noise generator restarted at every reset (see
    the module docstring), ``snapshot``/``restore`` that keep restores exact, and every other
    attribute read through to the wrapped env (``env.task``, ``env.expert_action()``...).

    Subclasses set ``stream`` (distinct, so their noises are independent), ``scaled`` (the
    :data:`SCALABLE` imperfection whose level they play, if any) and may override
    :meth:`_restart` (called with the first observation and the start snapshot).

    Attributes:
        scale: This episode's scale of the configured level (1 unless the reset option
            ``imperfections`` names :attr:`scaled`).
    """

    stream: ClassVar[int]
    scaled: ClassVar[str | None] = None

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.rng = np.random.default_rng(0)  # replaced at every reset
        self.scale = 1.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        key = (options or {}).get("noise_key")
        key = 0 if key is None else check_int("reset option noise_key", key, 0)
        ranges = check_scale_ranges((options or {}).get("imperfections"))
        obs, info = self.env.reset(seed=seed, options=options)
        start = self.env.unwrapped.snapshot()
        self.rng = noise_generator(start, key, self.stream)
        self.scale = (draw_scale(start, self.stream, ranges[self.scaled])
                      if self.scaled in ranges else 1.0)
        return self._restart(obs, start), info

    def _restart(self, obs: dict[str, np.ndarray], start: Snapshot) -> dict[str, np.ndarray]:
        return obs

    def snapshot(self) -> Snapshot:
        """The base env's snapshot (the wrappers' state restarts on restore)."""
        return self.env.unwrapped.snapshot()

    def restore(self, snapshot: Snapshot, noise_key: int | None = None,
                imperfections: Mapping[str, Any] | None = None) -> None:
        """Restore ``snapshot`` exactly and restart every wrapper as a reset from it would
        (``reset(options={"snapshot": snapshot, "noise_key": noise_key, "imperfections":
        imperfections})``): the same scale ranges give the same scales."""
        self.reset(options={"snapshot": snapshot, "noise_key": noise_key,
                            "imperfections": imperfections})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


class ActionNoise(ImperfectionWrapper):
    """Gaussian noise of standard deviation ``sigma * scale`` (action units) added to every
    action dimension; the env clips the result to [-1, 1]."""

    stream = 1
    scaled = "action_noise"

    def __init__(self, env: gym.Env, sigma: float) -> None:
        super().__init__(env)
        self.sigma = float(sigma)

    def step(self, action):
        action = check_action(action)
        return self.env.step(action + self.rng.normal(0.0, self.sigma * self.scale,
                                                      action.shape))


class ActionLatency(ImperfectionWrapper):
    """Each action is executed ``steps`` control steps after it is given (a FIFO of actions);
    an episode's first ``steps`` steps execute "hold" (no motion, the gripper command of the
    start state)."""

    stream = 2

    def __init__(self, env: gym.Env, steps: int) -> None:
        super().__init__(env)
        self.steps = check_int("action_latency", steps, 1, MAX_LATENCY)
        self.queue: deque[np.ndarray] = deque()

    def _restart(self, obs, start):
        hold = np.array([0.0, 0.0, 0.0, float(start.task_state["gripper_cmd"])])
        self.queue = deque(hold.copy() for _ in range(self.steps))
        return obs

    def step(self, action):
        self.queue.append(check_action(action))
        return self.env.step(self.queue.popleft())


class ControlRateJitter(ImperfectionWrapper):
    """Each control step lasts ``substeps * (1 + u)`` physics steps, rounded and at least one,
    with ``u`` uniform in ``[-jitter * scale, jitter * scale]``."""

    stream = 3
    scaled = "control_jitter"

    def __init__(self, env: gym.Env, jitter: float) -> None:
        super().__init__(env)
        self.jitter = float(jitter)
        self.nominal = int(env.unwrapped.config.substeps)

    def step(self, action):
        base = self.env.unwrapped
        jitter = self.jitter * self.scale
        base.substeps = max(1, round(self.nominal * (1.0 + self.rng.uniform(-jitter, jitter))))
        try:
            return self.env.step(action)
        finally:
            base.substeps = self.nominal


class ObservationNoise(ImperfectionWrapper):
    """Gaussian noise of standard deviation ``sigma * scale`` (observation units) added to
    ``state`` and ``proprio``."""

    stream = 4
    scaled = "observation_noise"
    KEYS = ("state", "proprio")

    def __init__(self, env: gym.Env, sigma: float) -> None:
        super().__init__(env)
        self.sigma = float(sigma)

    def _noisy(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        obs = dict(obs)
        for key in self.KEYS:
            if key in obs:
                noise = self.rng.normal(0.0, self.sigma * self.scale, obs[key].shape)
                obs[key] = (obs[key] + noise).astype(obs[key].dtype)
        return obs

    def _restart(self, obs, start):
        return self._noisy(obs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._noisy(obs), reward, terminated, truncated, info


class DroppedFrames(ImperfectionWrapper):
    """With probability ``p`` a step's ``pixels`` repeat the previous image (a dropped camera
    frame); other observations are fresh."""

    stream = 5

    def __init__(self, env: gym.Env, p: float) -> None:
        super().__init__(env)
        self.p = float(p)
        self.last: np.ndarray | None = None
        self.dropped = 0  # frames dropped since the last reset

    def _restart(self, obs, start):
        self.last, self.dropped = obs.get("pixels"), 0
        return obs

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.last is not None and "pixels" in obs:
            if self.rng.random() < self.p:
                obs = {**obs, "pixels": self.last.copy()}
                self.dropped += 1
            else:
                self.last = obs["pixels"]
        return obs, reward, terminated, truncated, info


def imperfection_scales(start: Snapshot, ranges: Mapping[str, Any] | None
                        ) -> dict[str, float]:
    """The scale each imperfection of ``ranges`` plays in an episode starting at ``start``: what
    its wrapper draws at that reset, whatever the ``noise_key``. The group trainer pins its
    groups' scales with it, so that attempts from perturbed copies of a start share them.

    Raises:
        ValueError: An unknown name or a malformed range (:func:`check_scale_ranges`).
    """
    streams = {w.scaled: w.stream for w in (ActionNoise, ControlRateJitter, ObservationNoise)}
    return {name: draw_scale(start, streams[name], bounds)
            for name, bounds in check_scale_ranges(ranges).items()}
