"""A start policy cloned on scripted-expert demonstrations (or a LeRobot dataset).

:func:`cloned_start_policy` records the demos once per task, environment options and difficulty
(cached in :func:`harness.demos.demo_cache_dir`, one file each: :func:`demo_file`), optionally
first teaches a pixel policy's features where things are
(:func:`~harness.start_policy.state_pretraining.pretrain_state_features`, which regresses the
simulator state from noisy-expert frames: the policy never reads the state as an input), then
behaviour-clones it (:func:`~harness.start_policy.bc.pretrain_bc`), as ``algo.start_policy``
(:class:`harness.config.StartPolicyConfig`) says.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import tasks
from harness.config import Seeds, StartPolicyConfig
from harness.demos import Demos, collect_demos, demo_cache_dir, load_demos
from harness.lerobot import load_lerobot
from harness.policies import Policy, resolve_device
from harness.policies import make as make_policy
from harness.start_policy.bc import pretrain_bc
from harness.start_policy.state_pretraining import pretrain_state_features

NAMED_DEMO_OPTIONS: tuple[str, ...] = ("obs_mode", "camera", "image_size", "max_episode_steps")
START_POLICY_FILE = "start_policy.pt"


def check_start_policy(held: Policy, wanted, path: str | os.PathLike) -> None:
    """Refuse a loaded start policy (``algo.start_policy.file``) that this run cannot fine-tune as
    configured: another kind, another action head, or other action chunks (its head predicts
    ``chunk_size`` actions, and what it was cloned to execute is part of what it learnt).

    Args:
        held: The loaded policy.
        wanted: The run's policy config.
        path: The file, for the message.

    Raises:
        ValueError: Naming the file and both sets of values.
    """
    spec = held.spec
    have = {"kind": spec.kind, "head": spec.head, "chunk_size": spec.chunk_size,
            "execute_steps": spec.execute_steps}
    need = {"kind": wanted.name, "head": wanted.head_name or spec.head,
            "chunk_size": wanted.chunk_size, "execute_steps": wanted.steps_per_decision}
    if have != need:
        raise ValueError(f"algo.start_policy.file={path} holds a policy with {have}; this run's "
                         f"policy has {need}")


def keep_start_policy(policy: Policy, run_dir: str | os.PathLike,
                      loaded_from: str | None = None) -> str | None:
    """Where a run's start policy can be loaded from by ``algo.start_policy.file`` of another run.

    Cloning the start of a pixel run (state pretraining, then BC) takes minutes and gives the
    same weights for the same seed and settings, so the arms of an ablation can share it: a
    cloned or fresh start is written to ``<run_dir>/start_policy.pt``
    (:func:`harness.policies.save_policy`); a run that loaded its start (``loaded_from``) names
    that file.
    A run started from the saved file plays exactly the run that wrote it.

    Returns:
        The file, or ``None`` for a policy that lives in a model folder instead (``hf_vla``,
        whose transformers folders are written with its checkpoints).
    """
    if loaded_from:
        return str(loaded_from)
    if not policy.spec.single_file:
        return None
    path = Path(run_dir) / START_POLICY_FILE
    policy.save(path)
    return str(path)


def cloned_start_policy(
    task: str,
    task_options: dict[str, Any],
    policy_config,
    start: StartPolicyConfig,
    seeds: Seeds,
    device: str = "cpu",
    progress: bool = True,
    demo_dir: str | os.PathLike | None = None,
) -> tuple[Policy, dict[str, Any]]:
    """A policy behaviour-cloned on scripted-expert episodes: the usual start of group
    fine-tuning. Demos are recorded once per task, options and difficulty, then reused; with
    ``start.dataset``, the policy is cloned on that LeRobot dataset folder instead.

    Args:
        task: Task name.
        task_options: Options of ``tasks.make``; every one of them (but ``difficulty``, which
            the demos' own replaces) is passed to :func:`harness.demos.collect_demos`.
        policy_config: The policy's config (a registered kind's).
        start: The demos, the state pretraining and the behaviour cloning
            (``algo.start_policy``); the demos play ``start.bc.difficulty``, else the task's.
        seeds: The run's streams: the weights and the training from ``seeds.generator``, the
            demos from ``seeds.demos``, the pretraining's episodes from
            ``seeds.state_pretrain``.
        device: Where the policy is trained and left (see
            :func:`harness.policies.resolve_device`; ``"auto"`` picks CUDA, MPS or the CPU).
        progress: Show progress bars.
        demo_dir: Where demo files are cached (default :func:`harness.demos.demo_cache_dir`).

    Returns:
        ``(policy, metrics)``; metrics include the demo file (or ``bc/dataset``), the BC losses
        and, with state pretraining, its ``pretrain/...`` figures.

    Raises:
        FileNotFoundError: ``start.dataset`` is not a folder.
        ValueError: Nothing to clone on, an invalid task option, a ``device`` this machine does
            not have, or a ``dataset`` of another version or lacking a feature or file the task
            needs (raised before any training).
    """
    bc, pretraining = start.bc, start.state_pretrain
    if not start.clones:
        raise ValueError("algo.start_policy.bc.demos=0 and no dataset: nothing to clone the "
                         "start policy on")
    torch_device = resolve_device(device)
    difficulty = demo_difficulty(start, task_options)
    path = demo_file(demo_cache_dir() if demo_dir is None else demo_dir, task, task_options,
                     bc.demos, difficulty, noise=bc.noise, seed=seeds.demos)
    if start.dataset is None and not path.exists():
        _record_start_demos(path, task, task_options, bc, difficulty, seeds.demos, progress)
    env = tasks.make(task, **task_options)
    demonstrations = None if start.dataset is None else load_lerobot(
        start.dataset,
        shapes={key: space.shape for key, space in env.observation_space.spaces.items()})
    torch.manual_seed(seeds.generator)
    policy = make_policy(policy_config, env.observation_space).to(torch_device)
    env.close()
    pretrain_metrics = {}
    if pretraining.episodes > 0:
        pretrain_metrics = pretrain_state_features(
            policy, task, task_options, episodes=pretraining.episodes,
            epochs=pretraining.epochs, difficulty=difficulty, seed=seeds.run,
            shift_pad=pretraining.shift_pad, progress=progress,
        )
    if demonstrations is None:
        demonstrations = load_demos(path)
    metrics = pretrain_bc(policy, demonstrations, epochs=bc.epochs, lr=bc.lr,
                          seed=seeds.generator, augment=bc.shift_pad > 0,
                          shift_pad=bc.shift_pad, keep=bc.keep, progress=progress)
    metrics.pop("history", None)
    source = ({"bc/demo_file": str(path)} if start.dataset is None
              else {"bc/dataset": str(start.dataset)})
    return policy, {**pretrain_metrics, **metrics, **source}


def demo_difficulty(start: StartPolicyConfig, task_options: Mapping[str, Any]) -> float:
    """The start-state difficulty of the clone's demos: ``bc.difficulty``, else the task's."""
    if start.bc.difficulty is not None:
        return float(start.bc.difficulty)
    return float(task_options.get("difficulty", 0.0))


def start_demonstrations(task: str, task_options: dict[str, Any], start: StartPolicyConfig,
                         seeds: Seeds, progress: bool = True,
                         demo_dir: str | os.PathLike | None = None) -> Demos:
    """The demonstrations a start is cloned on (``algo.start_policy``): the dataset folder, or
    the cached scripted-expert demos (recorded now when the cache lacks them).

    Raises:
        ValueError: Nothing to clone on (no ``bc.demos`` and no ``dataset``).
    """
    if not start.clones:
        raise ValueError("algo.start_policy.bc.demos=0 and no dataset: no demonstrations")
    if start.dataset is not None:
        env = tasks.make(task, **task_options)
        shapes = {key: space.shape for key, space in env.observation_space.spaces.items()}
        env.close()
        return load_lerobot(start.dataset, shapes=shapes)
    difficulty = demo_difficulty(start, task_options)
    path = demo_file(demo_cache_dir() if demo_dir is None else demo_dir, task, task_options,
                     start.bc.demos, difficulty, noise=start.bc.noise, seed=seeds.demos)
    if not path.exists():
        _record_start_demos(path, task, task_options, start.bc, difficulty, seeds.demos,
                            progress)
    return load_demos(path)


def _record_start_demos(path: Path, task: str, task_options: Mapping[str, Any], bc,
                        difficulty: float, seed: int, progress: bool) -> None:
    """Record :func:`cloned_start_policy`'s demos into ``path``: the named task options become
    :func:`harness.demos.collect_demos`'s own arguments, the others its ``env_options``."""
    named = {key: task_options[key] for key in NAMED_DEMO_OPTIONS if key in task_options}
    collect_demos(path, task, bc.demos, difficulty=difficulty, seed=seed, progress=progress,
                  obs_mode=named.get("obs_mode", "state"),
                  camera=named.get("camera", "front"),
                  image_size=named.get("image_size", 84),
                  max_episode_steps=named.get("max_episode_steps"),
                  env_options={key: value for key, value in task_options.items()
                               if key not in (*NAMED_DEMO_OPTIONS, "difficulty")},
                  noise=bc.noise, label="expert" if bc.noise > 0 else "executed")


def demo_file(
    demo_dir: str | os.PathLike,
    task: str,
    task_options: Mapping[str, Any],
    demos: int,
    difficulty: float,
    noise: float = 0.0,
    seed: int = 0,
) -> Path:
    """The cache file of :func:`cloned_start_policy`'s demos.

    The name shows the main options (``obs_mode``, ``camera``, ``image_size``,
    ``max_episode_steps``) for a reader, then the first 10 hex digits of the SHA-256 of
    the JSON of every ``tasks.TaskConfig`` field (defaults filled in, ``difficulty`` set to the
    demos'), so that demos recorded under other options (``terminate_on_success``,
    ``randomization``, ``reward_weights``, ``render_quality``...) are never reused, while
    spelling a default out or leaving it implicit gives the same file. A task whose
    ``version`` is above 1 adds it to the JSON, so demos of its older resets are not reused.

    Args:
        demo_dir: The cache folder.
        task: Task name.
        task_options: Options of ``tasks.make``.
        demos: Number of demonstrations.
        difficulty: Start-state difficulty of the demos.
        noise: Noise injected while recording with expert labels (DART); 0 names no noise.
        seed: Reset seed of the first attempt; 0 names none.

    Returns:
        ``<demo_dir>/<task>_<readable options>_<hash>_d<difficulty>_n<demos>.hdf5``, with
        ``_dart<noise>`` before ``_d`` for noisy demos and ``_s<seed>`` after ``_n`` for a
        first seed other than 0.

    Raises:
        ValueError: An unknown or invalid task option.
        TypeError: An unknown ``randomization`` field.
    """
    config = tasks.TaskConfig.from_options(task, {**task_options,
                                                  "difficulty": float(difficulty)})
    fields = dataclasses.asdict(config)
    version = tasks.task_version(task, task_options.get("suite", ""))
    if version > 1:  # version 1 tasks keep the names of their older caches
        fields["task_version"] = version
    if task_options.get("suite"):
        fields["suite"] = task_options["suite"]
    canonical = json.dumps(fields, sort_keys=True)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:10]
    readable = [f"{key}{task_options[key]}" for key in sorted(NAMED_DEMO_OPTIONS)
                if key in task_options]
    dart = [f"dart{noise:g}"] if noise > 0 else []
    first = [f"s{seed}"] if seed else []
    name = "_".join([task, *readable, digest, *dart, f"d{difficulty:g}", f"n{demos}", *first])
    return Path(demo_dir) / f"{name}.hdf5"
