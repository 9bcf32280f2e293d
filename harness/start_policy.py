"""The start of group fine-tuning: a policy cloned on scripted-expert demonstrations.

:func:`cloned_start_policy` records the demos once per task, environment options and difficulty
(cached in :func:`harness.demos.demo_cache_dir`, one file each: :func:`demo_file`), optionally
first teaches a pixel policy's features where things are
(:func:`harness.state_pretraining.pretrain_state_features`, which regresses the simulator state
from noisy-expert frames: the policy never reads the state as an input), then behaviour-clones it
(:func:`harness.bc.pretrain_bc`). :class:`CloneOptions` says how.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import tasks
from harness.bc import pretrain_bc
from harness.config.algos import BC_KEEP
from harness.demos import collect_demos, demo_cache_dir, load_demos
from harness.lerobot import load_lerobot
from harness.policies import Policy, resolve_device
from harness.policies import make as make_policy
from harness.state_pretraining import pretrain_state_features

NAMED_DEMO_OPTIONS: tuple[str, ...] = ("obs_mode", "camera", "image_size", "max_episode_steps")
START_POLICY_FILE = "start_policy.pt"


@dataclass(frozen=True)
class CloneOptions:
    """How :func:`cloned_start_policy` clones a start policy.

    Attributes:
        demos: Number of expert demonstrations (successes only); 0 with ``dataset``.
        epochs: Behaviour-cloning epochs.
        difficulty: Start-state difficulty of the demos.
        seed: Seeds the weights and the training.
        demo_seed: Reset seed of the first demo attempt (runs use
            ``harness.config.demo_first_seed``); demos of another first seed are cached apart.
        demo_dir: Where demo files are cached, one per task, demo count, difficulty and set of
            environment options (see :func:`demo_file`).
        progress: Show progress bars.
        state_pretrain_episodes: When > 0 (pixel policies), first run
            :func:`harness.state_pretraining.pretrain_state_features` on this
            many noisy-expert episodes.
        state_pretrain_epochs: Its epochs.
        state_pretrain_shift_pad: Random-shift augmentation of the state pretraining's frames
            (its ``shift_pad``); 0 leaves them as rendered.
        device: Where the policy is trained and left (see
            :func:`harness.policies.resolve_device`; ``"auto"`` picks CUDA, MPS or the CPU).
        dataset: A LeRobotDataset v3.0 folder (:func:`harness.lerobot.load_lerobot`) to clone
            on instead of recorded demos (``demos`` and ``difficulty`` are then unused); it must
            give every observation of the task under its options, in its shape.
        noise: When > 0, the demos are recorded with this Gaussian noise on the executed
            actions and labelled with the expert's noise-free ones (DART; see
            :func:`harness.demos.collect_demos`'s ``label``), and cached apart.
        bc_shift_pad: Random-shift augmentation of the pixels in behaviour cloning
            (``shift_pad`` of :func:`harness.bc.pretrain_bc`); 0 leaves them as rendered.
        bc_lr: Learning rate of behaviour cloning (``lr`` of :func:`harness.bc.pretrain_bc`).
        bc_keep: The weights it hands on (``keep`` of :func:`harness.bc.pretrain_bc`):
            ``"last"`` or ``"best_val_loss"``.

    Raises:
        ValueError: A count, pad or noise below its range, no demos and no ``dataset``, or an
            unknown ``bc_keep``; the message names the value.
    """

    demos: int
    epochs: int
    difficulty: float
    seed: int = 0
    demo_seed: int = 0
    demo_dir: str | os.PathLike = field(default_factory=demo_cache_dir)
    progress: bool = True
    state_pretrain_episodes: int = 0
    state_pretrain_epochs: int = 15
    state_pretrain_shift_pad: int = 0
    device: str = "cpu"
    dataset: str | os.PathLike | None = None
    noise: float = 0.0
    bc_shift_pad: int = 4
    bc_lr: float = 3e-3
    bc_keep: str = "last"

    def __post_init__(self) -> None:
        for name in ("demos", "state_pretrain_episodes", "state_pretrain_shift_pad",
                     "bc_shift_pad", "noise"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}; must be >= 0")
        if self.demos == 0 and self.dataset is None:
            raise ValueError("demos=0 and no dataset: nothing to clone the start policy on")
        if self.epochs < 1:
            raise ValueError(f"epochs={self.epochs}; must be >= 1")
        if self.bc_keep not in BC_KEEP:
            raise ValueError(f"bc_keep={self.bc_keep!r}; choose one of {BC_KEEP}")


def check_start_policy(held: Policy, wanted, path: str | os.PathLike) -> None:
    """Refuse a loaded start policy (``algo.init_policy``) that this run cannot fine-tune as
    configured: another kind, or other action chunks (its head predicts ``chunk_size``
    actions, and what it was cloned to execute is part of what it learnt).

    Args:
        held: The loaded policy.
        wanted: The run's policy config.
        path: The file, for the message.

    Raises:
        ValueError: Naming the file and both sets of values.
    """
    spec = held.spec
    have = {"kind": spec.kind, "chunk_size": spec.chunk_size, "execute_steps": spec.execute_steps}
    need = {"kind": wanted.name, "chunk_size": wanted.chunk_size,
            "execute_steps": wanted.steps_per_decision}
    if have != need:
        raise ValueError(f"algo.init_policy={path} holds a policy with {have}; this run's "
                         f"policy has {need}")


def keep_start_policy(policy: Policy, run_dir: str | os.PathLike,
                      init_policy: str | None = None) -> str | None:
    """Where a run's start policy can be loaded from by ``algo.init_policy`` of another run.

    Cloning the start of a pixel run (state pretraining, then BC) takes minutes and gives the
    same weights for the same seed and settings, so the arms of an ablation can share it: a
    cloned or fresh start is written to ``<run_dir>/start_policy.pt``
    (:func:`harness.policies.save_policy`); a run that loaded ``init_policy`` names that file.
    A run started from the saved file plays exactly the run that wrote it.

    Returns:
        The file, or ``None`` for a policy that lives in a model folder instead (``hf_vla``,
        whose transformers folders are written with its checkpoints).
    """
    if init_policy:
        return str(init_policy)
    if not policy.spec.single_file:
        return None
    path = Path(run_dir) / START_POLICY_FILE
    policy.save(path)
    return str(path)


def cloned_start_policy(
    task: str,
    task_options: dict[str, Any],
    policy_config,
    options: CloneOptions,
) -> tuple[Policy, dict[str, Any]]:
    """A policy behaviour-cloned on scripted-expert episodes: the usual start of group
    fine-tuning. Demos are recorded once per task, options and difficulty, then reused; with
    ``options.dataset``, the policy is cloned on that LeRobot dataset folder instead.

    Args:
        task: Task name.
        task_options: Options of ``tasks.make``; every one of them (but ``difficulty``, which
            ``options.difficulty`` replaces) is passed to :func:`harness.demos.collect_demos`.
        policy_config: The policy's config (a registered kind's).
        options: The demos, the state pretraining and the behaviour cloning.

    Returns:
        ``(policy, metrics)``; metrics include the demo file (or ``bc/dataset``), the BC losses
        and, with state pretraining, its ``pretrain/...`` figures.

    Raises:
        FileNotFoundError: ``options.dataset`` is not a folder.
        ValueError: An invalid task option, a ``device`` this machine does not have, or a
            ``dataset`` of another version or lacking a feature or file the task needs (raised
            before any training).
    """
    torch_device = resolve_device(options.device)
    path = demo_file(options.demo_dir, task, task_options, options.demos, options.difficulty,
                     noise=options.noise, seed=options.demo_seed)
    if options.dataset is None and not path.exists():
        _record_start_demos(path, task, task_options, options)
    env = tasks.make(task, **task_options)
    demonstrations = None if options.dataset is None else load_lerobot(
        options.dataset,
        shapes={key: space.shape for key, space in env.observation_space.spaces.items()})
    torch.manual_seed(options.seed)
    policy = make_policy(policy_config, env.observation_space).to(torch_device)
    env.close()
    pretrain_metrics = {}
    if options.state_pretrain_episodes > 0:
        pretrain_metrics = pretrain_state_features(
            policy, task, task_options, episodes=options.state_pretrain_episodes,
            epochs=options.state_pretrain_epochs, difficulty=options.difficulty,
            seed=options.seed, shift_pad=options.state_pretrain_shift_pad,
            progress=options.progress,
        )
    if demonstrations is None:
        demonstrations = load_demos(path)
    metrics = pretrain_bc(policy, demonstrations, epochs=options.epochs, lr=options.bc_lr,
                          seed=options.seed, augment=options.bc_shift_pad > 0,
                          shift_pad=options.bc_shift_pad, keep=options.bc_keep,
                          progress=options.progress)
    metrics.pop("history", None)
    source = ({"bc/demo_file": str(path)} if options.dataset is None
              else {"bc/dataset": str(options.dataset)})
    return policy, {**pretrain_metrics, **metrics, **source}


def _record_start_demos(path: Path, task: str, task_options: Mapping[str, Any],
                        options: CloneOptions) -> None:
    """Record :func:`cloned_start_policy`'s demos into ``path``: the named task options become
    :func:`harness.demos.collect_demos`'s own arguments, the others its ``env_options``."""
    named = {key: task_options[key] for key in NAMED_DEMO_OPTIONS if key in task_options}
    collect_demos(path, task, options.demos, difficulty=options.difficulty,
                  seed=options.demo_seed, progress=options.progress,
                  obs_mode=named.get("obs_mode", "state"),
                  camera=named.get("camera", "front"),
                  image_size=named.get("image_size", 84),
                  max_episode_steps=named.get("max_episode_steps"),
                  env_options={key: value for key, value in task_options.items()
                               if key not in (*NAMED_DEMO_OPTIONS, "difficulty")},
                  noise=options.noise, label="expert" if options.noise > 0 else "executed")


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
    if tasks.TASKS[task].version > 1:  # version 1 tasks keep the names of their older caches
        fields["task_version"] = tasks.TASKS[task].version
    canonical = json.dumps(fields, sort_keys=True)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:10]
    readable = [f"{key}{task_options[key]}" for key in sorted(NAMED_DEMO_OPTIONS)
                if key in task_options]
    dart = [f"dart{noise:g}"] if noise > 0 else []
    first = [f"s{seed}"] if seed else []
    name = "_".join([task, *readable, digest, *dart, f"d{difficulty:g}", f"n{demos}", *first])
    return Path(demo_dir) / f"{name}.hdf5"
