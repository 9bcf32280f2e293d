"""Evaluation of a policy: success rate with its Wilson interval, episode length, per difficulty.

:func:`evaluate` is the generic core: a policy function (observation dict -> action, or a chunk
of actions played in order), a factory of task environments, held-out seeds and difficulties.
Every trainer uses it, for periodic and final evaluation, with its own policies;
``harness.checkpoints`` adds the checkpoint side
(``scripts/evaluate.py``), and :func:`override_task_options` the task options a trained policy is
evaluated or deployed with (``+task.<option>=`` of ``scripts/evaluate.py`` and
``scripts/deploy_policy.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

import tasks
from harness_common.stats import wilson_interval

# Observation dict -> one action ``(action_dim,)``, or a chunk ``(k, action_dim)`` of actions
# played in order before the next call (an episode that ends first drops the rest).
PolicyFn = Callable[[dict[str, np.ndarray]], np.ndarray]
EnvFactory = Callable[[], gym.Env]

# Task options that fix what a trained policy sees: its network takes that observation, so an
# evaluation or a deployment keeps them as trained while the world around it may change.
OBSERVATION_OPTIONS = ("obs_mode", "camera", "image_size")
# Options given elsewhere in the apps that take overrides: the reset's difficulty is theirs.
ELSEWHERE = {"difficulty": "difficulties=[...]"}
# Options whose value is a mapping of fields (``{}``: every field at its default).
BLOCK_OPTIONS = ("randomization", "imperfections", "reward_weights")


def override_task_options(task: str, options: Mapping[str, Any],
                          overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A trained policy's task options with ``overrides`` in place.

    Each option that ``overrides`` names replaces the trained one whole: a block such as
    ``{"imperfections": {"action_latency": 2}}`` is that block (its other fields off, as a
    training run's ``task.imperfections.action_latency=2`` gives), and ``{"randomization": {}}``
    turns randomisation off.

    Args:
        task: The task's name, for the validation and its messages.
        options: Options of ``tasks.make`` the policy was trained (or exported) with.
        overrides: Options of :class:`tasks.TaskConfig` to change (``None``: none).

    Returns:
        The options, validated by :class:`tasks.TaskConfig`.

    Raises:
        ValueError: An unknown option or field, a bad value, a block that is not a mapping, an
            option of :data:`OBSERVATION_OPTIONS` that differs from the trained one, or one of
            :data:`ELSEWHERE`, each named as ``task.<option>``.
    """
    overrides = dict(overrides or {})
    for key, spelling in ELSEWHERE.items():
        if key in overrides:
            raise ValueError(f"task.{key}={overrides[key]!r}: the episodes' difficulty is "
                             f"given by {spelling}, not by the task options")
    for key in BLOCK_OPTIONS:
        if key in overrides and not isinstance(overrides[key], Mapping):
            raise ValueError(f"task.{key}={overrides[key]!r}; expected a mapping of its "
                             f"fields ({{}}: all off), e.g. +task.{key}.<field>=<value>")
    merged = {**options, **{key: dict(value) if isinstance(value, Mapping) else value
                            for key, value in overrides.items()}}
    try:
        trained = tasks.TaskConfig.from_options(task, dict(options))
        config = tasks.TaskConfig.from_options(task, merged)
    except ValueError as error:
        raise ValueError(f"task: {error}") from None
    for key in OBSERVATION_OPTIONS:
        if key in overrides and getattr(config, key) != getattr(trained, key):
            raise ValueError(
                f"task.{key}={overrides[key]!r} would change what the policy sees; "
                f"{', '.join(OBSERVATION_OPTIONS)} stay as trained ({key}="
                f"{getattr(trained, key)!r}): train or export a policy for that observation")
    return merged


@dataclass(frozen=True)
class Episode:
    """Outcome of one evaluation episode (success is ``info["is_success"]`` at its last step)."""

    difficulty: float
    seed: int
    success: bool
    length: int
    episode_return: float


@dataclass
class EvaluationResult:
    """Episodes of one evaluation, and the frames of the recorded ones."""

    episodes: list[Episode]
    videos: list[list[np.ndarray]] = field(default_factory=list)

    @property
    def successes(self) -> int:
        return sum(e.success for e in self.episodes)

    @property
    def success_rate(self) -> float:
        return self.successes / max(len(self.episodes), 1)

    @property
    def success_interval(self) -> tuple[float, float]:
        """95% Wilson score interval of the success rate."""
        return wilson_interval(self.successes, len(self.episodes))

    @property
    def mean_length(self) -> float:
        return float(np.mean([e.length for e in self.episodes])) if self.episodes else 0.0

    @property
    def mean_return(self) -> float:
        return float(np.mean([e.episode_return for e in self.episodes])) if self.episodes else 0.0

    def per_difficulty(self) -> list[dict[str, float]]:
        """One row per difficulty: episodes, success rate and interval, mean length."""
        rows = []
        for difficulty in sorted({e.difficulty for e in self.episodes}):
            subset = [e for e in self.episodes if e.difficulty == difficulty]
            successes = sum(e.success for e in subset)
            low, high = wilson_interval(successes, len(subset))
            rows.append({
                "difficulty": difficulty,
                "episodes": len(subset),
                "success_rate": successes / len(subset),
                "success_low": low,
                "success_high": high,
                "mean_length": float(np.mean([e.length for e in subset])),
            })
        return rows

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """Namespaced scalars for a run's log (``eval/success_rate``, ...)."""
        low, high = self.success_interval
        out = {
            f"{prefix}/success_rate": self.success_rate,
            f"{prefix}/success_low": low,
            f"{prefix}/success_high": high,
            f"{prefix}/mean_length": self.mean_length,
            f"{prefix}/mean_return": self.mean_return,
        }
        rows = self.per_difficulty()
        if len(rows) > 1:
            for row in rows:
                out[f"{prefix}/success_rate_d{row['difficulty']:.2f}"] = row["success_rate"]
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-able summary (the evaluation part of ``summary.json``)."""
        return {
            "success_rate": self.success_rate,
            "success_interval": list(self.success_interval),
            "episodes": len(self.episodes),
            "mean_episode_length": self.mean_length,
            "mean_return": self.mean_return,
            "per_difficulty": self.per_difficulty(),
        }

    def table(self) -> str:
        """The per-difficulty results as a Markdown table."""
        lines = ["| difficulty | episodes | success | 95% interval | mean length |",
                 "|---:|---:|---:|:---:|---:|"]
        for row in self.per_difficulty():
            lines.append(
                f"| {row['difficulty']:.2f} | {row['episodes']} | {row['success_rate']:.3f} | "
                f"[{row['success_low']:.3f}, {row['success_high']:.3f}] | "
                f"{row['mean_length']:.1f} |"
            )
        low, high = self.success_interval
        lines.append(f"| all | {len(self.episodes)} | {self.success_rate:.3f} | "
                     f"[{low:.3f}, {high:.3f}] | {self.mean_length:.1f} |")
        return "\n".join(lines)


def evaluate(
    policy_fn: PolicyFn,
    env_factory: EnvFactory,
    episodes: int,
    difficulties: Sequence[float] = (1.0,),
    seed: int = 0,
    video_episodes: int = 0,
    max_episode_steps: int | None = None,
) -> EvaluationResult:
    """Play ``episodes`` episodes at each difficulty and collect their outcomes.

    Episode ``j`` at every difficulty starts from ``reset(seed=seed + j, options={"difficulty":
    d})``, so two evaluations with the same seed see the same start states (common random
    numbers), and seeds far from the training ones are held out.

    Args:
        policy_fn: Task observation dict -> action, or a chunk of actions ``(k,
            action_dim)`` (an action-chunking policy's decision: its ``k`` actions are played
            before ``policy_fn`` sees the next observation). Deterministic for a fair
            comparison.
        env_factory: Builds one task environment (``render_mode="rgb_array"`` to record videos);
            it is closed at the end.
        episodes: Episodes per difficulty.
        difficulties: Difficulties in [0, 1].
        seed: Seed of the first episode.
        video_episodes: Episodes (the first ones of the first difficulty) whose ``render()``
            frames are kept in ``result.videos``.
        max_episode_steps: Each episode's step limit (the ``max_episode_steps`` reset option
            of the task environments); ``None`` keeps the environment's own.

    Returns:
        The episodes and recorded frames.

    Raises:
        ValueError: ``episodes`` < 1, no difficulty, or video requested from an env that renders
            nothing.
    """
    if episodes < 1:
        raise ValueError(f"episodes={episodes}; must be >= 1")
    if not difficulties:
        raise ValueError("difficulties is empty; give at least one difficulty in [0, 1]")
    env = env_factory()
    results: list[Episode] = []
    videos: list[list[np.ndarray]] = []
    try:
        for difficulty in difficulties:
            for j in range(episodes):
                record = len(videos) < video_episodes and difficulty == difficulties[0]
                options = {"difficulty": float(difficulty)}
                if max_episode_steps is not None:
                    options["max_episode_steps"] = int(max_episode_steps)
                obs, info = env.reset(seed=seed + j, options=options)
                frames = [_frame(env)] if record else []
                total, length, done = 0.0, 0, False
                while not done:
                    for action in as_chunk(policy_fn(obs)):
                        obs, reward, terminated, truncated, info = env.step(action)
                        total += float(reward)
                        length += 1
                        done = terminated or truncated
                        if record:
                            frames.append(_frame(env))
                        if done:
                            break
                results.append(Episode(float(difficulty), seed + j, bool(info["is_success"]),
                                       length, total))
                if record:
                    videos.append(frames)
    finally:
        env.close()
    return EvaluationResult(results, videos)


def as_chunk(actions: np.ndarray) -> np.ndarray:
    """A policy function's answer as a chunk ``(k, action_dim)``: one action ``(action_dim,)``
    is a chunk of one.

    Raises:
        ValueError: Neither one action nor a chunk of them.
    """
    actions = np.asarray(actions)
    if actions.ndim == 1:
        return actions[None]
    if actions.ndim != 2 or len(actions) == 0:
        raise ValueError(f"a policy function answered an array of shape {actions.shape}; "
                         "expected one action (action_dim,) or a chunk (k, action_dim)")
    return actions


def _frame(env: gym.Env) -> np.ndarray:
    frame = env.render()
    if frame is None:
        raise ValueError("video requested but the environment renders nothing; build it with "
                         "render_mode='rgb_array'")
    return frame
