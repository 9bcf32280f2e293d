"""Checkpoints back into policies: load any run's policy by its algorithm, and evaluate it.

**Loading contract.** A checkpoint's metadata names its ``algo``; the run class that trains
that algorithm (``harness.trainers.trainer_class``, a :class:`harness.trainers.Trainer`)
provides ``load_policy(checkpoint, metadata, device, sampled, reference) -> PolicyFn``, where
the policy function takes the task's raw observation dict and returns the greedy action, or a
sampled one with ``sampled``. A class whose checkpoints also hold the frozen start policy has
``has_reference_policy = True`` and loads that one with ``reference=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

import tasks
from harness.evaluation import (
    EnvFactory,
    EvaluationResult,
    PolicyFn,
    evaluate,
    override_task_options,
)
from harness.runs import resolve_checkpoint
from harness.trainers import trainer_class


def load_policy(
    checkpoint: Path,
    metadata: dict[str, Any],
    device: str = "cpu",
    sampled: bool = False,
    reference: bool = False,
) -> PolicyFn:
    """Policy function of a checkpoint, by the trainer of its ``algo``.

    Args:
        checkpoint: The checkpoint file.
        metadata: Its metadata.
        device: Torch device.
        sampled: Sample actions (SB3: ``deterministic=False``; token policies: tokens at
            temperature 1, what group fine-tuning optimises) instead of the greedy action.
        reference: Group-trainer checkpoints: the frozen start policy (e.g. the BC policy)
            stored with the fine-tuned one, to compare both from one file.

    Raises:
        ValueError: The algorithm's run class is not in this checkout, or ``reference``
            for a checkpoint that holds no reference policy.
    """
    trainer = trainer_class(metadata["algo"])
    if reference:
        if not trainer.has_reference_policy:
            raise ValueError(
                f"reference=true: a {metadata['algo']} checkpoint holds no reference policy;"
                " only group-trainer checkpoints (grpo, dr_grpo, rloo, critic, reinforce,"
                " vla_ppo) do"
            )
        return trainer.load_policy(checkpoint, metadata, device, sampled=sampled, reference=True)
    return trainer.load_policy(checkpoint, metadata, device, sampled=sampled)


def task_env_factory(metadata: dict[str, Any], render: bool = False,
                     task_overrides: Mapping[str, Any] | None = None) -> EnvFactory:
    """Factory of the task environment a checkpoint was trained on (raw observations), with
    ``task_overrides`` over its task options (:func:`harness.evaluation.override_task_options`).

    Raises:
        ValueError: A bad override, naming it (checked here, before any environment is built).
    """
    options = override_task_options(metadata["task"], metadata["task_options"], task_overrides)

    def factory() -> gym.Env:
        return tasks.make(metadata["task"], render_mode="rgb_array" if render else None, **options)

    return factory


def evaluate_checkpoint(
    checkpoint: str | Path,
    episodes: int = 100,
    difficulties: Sequence[float] | None = None,
    seed: int | None = None,
    video_episodes: int = 0,
    device: str = "cpu",
    sampled: bool = False,
    reference: bool = False,
    task_overrides: Mapping[str, Any] | None = None,
    wrap: Callable[[gym.Env], gym.Env] | None = None,
) -> tuple[EvaluationResult, dict[str, Any]]:
    """Evaluate a saved checkpoint on the task it was trained on, with its task options or
    with ``task_overrides`` over them.

    Args:
        checkpoint: Anything :func:`harness.runs.resolve_checkpoint` accepts.
        episodes: Episodes per difficulty.
        difficulties: Defaults to the training run's evaluation difficulties.
        seed: First episode seed; defaults to the training run's evaluation seed.
        video_episodes: Episodes to record (frames in ``result.videos``).
        device: Torch device.
        sampled: Sample actions instead of taking the greedy one (see :func:`load_policy`);
            the sampling is seeded by ``seed``, so a rerun gives the same result.
        reference: Group-trainer checkpoints: evaluate the stored start policy.
        task_overrides: Task options in place of the training run's, each replacing its own
            whole (:func:`harness.evaluation.override_task_options`): e.g.
            ``{"imperfections": {"action_latency": 2}}``, ``{"randomization": {}}`` (off) or
            ``{"max_episode_steps": 100}`` (each episode's step limit; without it, the training
            run's evaluation limit ``eval.max_episode_steps``, else its training limit). The
            seeds stay the same, but a randomised reset draws its parameters before the start
            state, so the start states differ from the unrandomised ones.
        wrap: Wraps each environment the evaluation builds (e.g.
            :class:`harness.outcomes.OutcomeRecorder`); it must leave observations and actions
            as they are.

    Returns:
        ``(result, metadata)``.

    Raises:
        harness.runs.CheckpointError: Missing or corrupt checkpoint.
        ValueError: ``reference`` for a checkpoint without a reference policy, or a bad
            ``task_overrides`` (checked before the policy is loaded).
    """
    path, metadata = resolve_checkpoint(checkpoint)
    make_env = task_env_factory(metadata, render=video_episodes > 0,
                                task_overrides=task_overrides)
    env_factory = make_env if wrap is None else (lambda: wrap(make_env()))
    policy_fn = load_policy(path, metadata, device, sampled=sampled, reference=reference)
    evaluation = metadata.get("evaluation", {})
    if difficulties is None:
        difficulties = evaluation.get("difficulties") or [
            metadata["task_options"].get("difficulty", 1.0)
        ]
    if seed is None:
        seed = int(evaluation.get("seed", 1_000_000))
    # The evaluation's limit is a reset option, which would override the environment's own.
    max_episode_steps = (None if "max_episode_steps" in (task_overrides or {})
                         else evaluation.get("max_episode_steps"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        result = evaluate(policy_fn, env_factory, episodes, list(difficulties), seed,
                          video_episodes, max_episode_steps)
    return result, metadata
