"""The start of group fine-tuning: a token policy cloned on scripted-expert demonstrations.

:func:`cloned_start_policy` records the demos once per task, environment options and difficulty
(cached under ``data/demos``, :func:`demo_file`), optionally first teaches a pixel policy's
features where things are (:func:`pretrain_state_features`, which regresses the simulator state
from noisy-expert frames: the policy never reads the state as an input), then behaviour-clones
it (:func:`harness.bc.pretrain_bc`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

from harness.bc import pretrain_bc, random_shift, split_by_episode
from harness.policies import TokenPolicy, obs_to_batch, resolve_device, save_policy

NAMED_DEMO_OPTIONS: tuple[str, ...] = ("obs_mode", "camera", "image_size", "max_episode_steps")
START_POLICY_FILE = "start_policy.pt"


def keep_start_policy(policy: TokenPolicy, run_dir: str | os.PathLike,
                      init_policy: str | None = None) -> str | None:
    """Where a run's start policy can be loaded from by ``algo.init_policy`` of another run.

    Cloning the start of a pixel run (state pretraining, then BC) takes minutes and gives the
    same weights for the same seed and settings, so the arms of an ablation can share it: a
    cloned or fresh start is written to ``<run_dir>/start_policy.pt``
    (:func:`harness.policies.save_policy`); a run that loaded ``init_policy`` names that file.
    A run started from the saved file plays exactly the run that wrote it.

    Returns:
        The file, or ``None`` for a policy that ``save_policy`` cannot write (``hf_vla``,
        which saves transformers folders with its checkpoints instead).
    """
    if init_policy:
        return str(init_policy)
    if hasattr(policy, "save_pretrained"):
        return None
    path = Path(run_dir) / START_POLICY_FILE
    save_policy(path, policy)
    return str(path)


def pretrain_state_features(
    policy: TokenPolicy,
    task: str,
    task_options: dict[str, Any],
    episodes: int = 100,
    epochs: int = 15,
    difficulty: float = 0.0,
    noise: float = 0.5,
    lr: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
    val_fraction: float = 0.1,
    shift_pad: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Teach a pixel policy's features where things are, before behaviour cloning.

    A handful of demonstrations is too little to learn *where the cube and the goal are* from
    pixels: a TinyVLA cloned on 20 push demos often heads the wrong way from the first step. In
    simulation the answer is free, so the policy's shared features (image, instruction and
    proprio, as the token head reads them) are first trained to regress the task's privileged
    ``state`` vector (positions of the gripper, the objects and the goal, standardised per
    dimension) through a throw-away linear head, on frames of the scripted expert run with heavy
    action noise (so the frames cover much more than the demos do). This is the pose
    pretraining of the vision layers in Levine et al. 2016 ("End-to-end training of deep
    visuomotor policies"); the policy itself never reads the state.

    Args:
        policy: A token policy reading ``pixels``; trained in place on its parameters' device
            (its token head is untouched).
        task: Task name.
        task_options: Options of ``tasks.make``; ``obs_mode`` is replaced by ``pixels_state``.
        episodes: Noisy-expert episodes to render (seeds ``3_000_000 + seed * 10_000 + i``,
            disjoint from the evaluation seeds).
        epochs: Passes over the frames.
        difficulty: Start-state difficulty of those episodes.
        noise: Std of the Gaussian noise on the expert's actions.
        lr: Adam learning rate.
        batch_size: Frames per gradient step.
        seed: Seeds the episodes, the split and the shuffling.
        val_fraction: Share of episodes held out to report how well the state is predicted.
        shift_pad: Randomly shift the training frames by up to this many pixels
            (:func:`harness.bc.random_shift`, DrQ); the held-out frames are never shifted. 0
            trains on the frames as rendered.
        progress: Show progress bars.

    Returns:
        ``pretrain/frames``, ``pretrain/train_loss`` (standardised MSE), ``pretrain/val_r2``
        (share of the state variance explained on held-out episodes; NaN without them),
        ``pretrain/seconds``.

    Raises:
        ValueError: ``episodes`` or ``epochs`` < 1, ``shift_pad`` < 0, or a policy that does
            not read pixels.
    """
    import tasks

    if episodes < 1 or epochs < 1:
        raise ValueError(f"episodes={episodes}, epochs={epochs}; both must be >= 1")
    if shift_pad < 0:
        raise ValueError(f"shift_pad={shift_pad}; must be >= 0 (pixels)")
    if "pixels" not in policy.obs_shapes:
        raise ValueError(
            f"state-feature pretraining is for pixel policies; this {policy.config.kind} policy"
            f" reads {sorted(policy.obs_shapes)}"
        )
    start = time.perf_counter()
    env = tasks.make(task, **{**task_options, "obs_mode": "pixels_state"})
    frames: dict[str, list[np.ndarray]] = {key: [] for key in (*policy.obs_shapes, "state")}
    episode_ids: list[int] = []
    try:
        for i in tqdm(range(episodes), desc="state pretraining frames", disable=not progress,
                      leave=False):
            episode_seed = 3_000_000 + seed * 10_000 + i
            obs, _ = env.reset(seed=episode_seed, options={"difficulty": float(difficulty)})
            expert = tasks.ScriptedExpert(env, noise=noise, seed=episode_seed)
            done = False
            while not done:
                for key in frames:
                    frames[key].append(np.asarray(obs[key]))
                episode_ids.append(i)
                obs, _, terminated, truncated, _ = env.step(expert())
                done = terminated or truncated
    finally:
        env.close()
    device = next(policy.parameters()).device
    obs = obs_to_batch({k: np.stack(v) for k, v in frames.items() if k != "state"},
                       device=device, batched=True)
    state = torch.as_tensor(np.stack(frames["state"]), dtype=torch.float32, device=device)
    train_idx, val_idx = (i.to(device) for i in
                          split_by_episode(np.asarray(episode_ids), val_fraction, seed))
    mean = state[train_idx].mean(dim=0)
    std = state[train_idx].std(dim=0).clamp(min=1e-3)
    target = (state - mean) / std

    head = torch.nn.Linear(policy.feature_dim, state.shape[1]).to(device)
    optimizer = torch.optim.Adam([*policy.parameters(), *head.parameters()], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    policy.train()
    losses: list[float] = []
    for _ in tqdm(range(epochs), desc="state pretraining", disable=not progress, leave=False):
        losses = []
        for batch_idx in train_idx[torch.randperm(len(train_idx), generator=generator)].split(
            batch_size
        ):
            batch = {key: value[batch_idx] for key, value in obs.items()}
            batch["pixels"] = random_shift(batch["pixels"], shift_pad, generator)
            loss = F.mse_loss(head(policy.features(batch)), target[batch_idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    val_r2 = math.nan
    if len(val_idx):
        policy.eval()
        with torch.no_grad():
            predicted = torch.cat([
                head(policy.features({k: v[idx] for k, v in obs.items()}))
                for idx in val_idx.split(256)
            ])
        truth = target[val_idx]
        varying = truth.var(dim=0) > 1e-6  # parked cubes never move
        residual = ((predicted - truth)[:, varying] ** 2).mean()
        val_r2 = float(1.0 - residual / truth[:, varying].var(dim=0).mean())
    policy.eval()
    return {
        "pretrain/frames": len(episode_ids),
        "pretrain/train_loss": float(np.mean(losses)),
        "pretrain/val_r2": val_r2,
        "pretrain/seconds": time.perf_counter() - start,
    }


def cloned_start_policy(
    task: str,
    task_options: dict[str, Any],
    policy_config,
    demos: int,
    epochs: int,
    difficulty: float,
    seed: int = 0,
    demo_dir: str | os.PathLike = "data/demos",
    progress: bool = True,
    state_pretrain_episodes: int = 0,
    state_pretrain_epochs: int = 15,
    device: str = "cpu",
    dataset: str | os.PathLike | None = None,
    noise: float = 0.0,
    state_pretrain_shift_pad: int = 0,
    bc_shift_pad: int = 4,
    bc_lr: float = 3e-3,
    bc_keep: str = "last",
) -> tuple[TokenPolicy, dict[str, Any]]:
    """A token policy behaviour-cloned on ``demos`` scripted-expert episodes: the usual start of
    group fine-tuning. Demos are recorded once per task, options and difficulty, then reused;
    with ``dataset``, the policy is cloned on that LeRobot dataset folder instead.

    Args:
        task: Task name.
        task_options: Options of ``tasks.make``; every one of them (but ``difficulty``, which
            ``difficulty`` below replaces) is passed to :func:`harness.demos.collect_demos`.
        policy_config: A ``TokenPolicyConfig``.
        demos: Number of expert demonstrations (successes only).
        epochs: Behaviour-cloning epochs.
        difficulty: Start-state difficulty of the demos.
        seed: Seeds the weights and the training.
        demo_dir: Where demo files are cached, one per task, demo count, difficulty and set of
            environment options (see :func:`demo_file`).
        progress: Show progress bars.
        state_pretrain_episodes: When > 0 (pixel policies), first run
            :func:`pretrain_state_features` on this many noisy-expert episodes.
        state_pretrain_epochs: Its epochs.
        device: Where the policy is trained and left (see
            :func:`harness.policies.resolve_device`; ``"auto"`` picks CUDA, MPS or the CPU).
        dataset: A LeRobotDataset v3.0 folder (:func:`harness.lerobot.load_lerobot`) to clone
            on instead of recorded demos (``demos`` and ``difficulty`` are then unused); it must
            give every observation of ``task`` under ``task_options``, in its shape.
        noise: When > 0, the demos are recorded with this Gaussian noise on the executed
            actions and labelled with the expert's noise-free ones (DART; see
            :func:`harness.demos.collect_demos`'s ``label``), and cached apart.
        state_pretrain_shift_pad: Random-shift augmentation of the state pretraining's frames
            (``shift_pad`` of :func:`pretrain_state_features`); 0 leaves them as rendered.
        bc_shift_pad: Random-shift augmentation of the pixels in behaviour cloning
            (``shift_pad`` of :func:`harness.bc.pretrain_bc`); 0 leaves them as rendered.
        bc_lr: Learning rate of behaviour cloning (``lr`` of :func:`harness.bc.pretrain_bc`).
        bc_keep: The weights it hands on (``keep`` of :func:`harness.bc.pretrain_bc`):
            ``"last"`` or ``"best_val_loss"``.

    Returns:
        ``(policy, metrics)``; metrics include the demo file (or ``bc/dataset``), the BC losses
        and, with state pretraining, its ``pretrain/...`` figures.

    Raises:
        FileNotFoundError: ``dataset`` is not a folder.
        ValueError: An invalid task option, a ``device`` this machine does not have, or a
            ``dataset`` of another version or lacking a feature or file the task needs (raised
            before any training).
    """
    import tasks
    from harness.demos import collect_demos, load_demos
    from harness.lerobot import load_lerobot
    from harness.policies import make as make_policy

    torch_device = resolve_device(device)
    path = demo_file(demo_dir, task, task_options, demos, difficulty, noise=noise)
    if dataset is None and not path.exists():
        named = {key: task_options[key] for key in NAMED_DEMO_OPTIONS if key in task_options}
        collect_demos(path, task, demos, difficulty=difficulty, progress=progress,
                      obs_mode=named.get("obs_mode", "state"),
                      camera=named.get("camera", "front"),
                      image_size=named.get("image_size", 84),
                      max_episode_steps=named.get("max_episode_steps"),
                      env_options={key: value for key, value in task_options.items()
                                   if key not in (*NAMED_DEMO_OPTIONS, "difficulty")},
                      noise=noise, label="expert" if noise > 0 else "executed")
    env = tasks.make(task, **task_options)
    demonstrations = None if dataset is None else load_lerobot(
        dataset, shapes={key: space.shape for key, space in env.observation_space.spaces.items()})
    torch.manual_seed(seed)
    policy = make_policy(policy_config, env.observation_space).to(torch_device)
    env.close()
    pretrain_metrics = {}
    if state_pretrain_episodes > 0:
        pretrain_metrics = pretrain_state_features(
            policy, task, task_options, episodes=state_pretrain_episodes,
            epochs=state_pretrain_epochs, difficulty=difficulty, seed=seed,
            shift_pad=state_pretrain_shift_pad, progress=progress,
        )
    if demonstrations is None:
        demonstrations = load_demos(path)
    metrics = pretrain_bc(policy, demonstrations, epochs=epochs, lr=bc_lr, seed=seed,
                          augment=bc_shift_pad > 0, shift_pad=bc_shift_pad, keep=bc_keep,
                          progress=progress)
    metrics.pop("history", None)
    source = {"bc/demo_file": str(path)} if dataset is None else {"bc/dataset": str(dataset)}
    return policy, {**pretrain_metrics, **metrics, **source}


def demo_file(
    demo_dir: str | os.PathLike,
    task: str,
    task_options: Mapping[str, Any],
    demos: int,
    difficulty: float,
    noise: float = 0.0,
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

    Returns:
        ``<demo_dir>/<task>_<readable options>_<hash>_d<difficulty>_n<demos>.hdf5``, with
        ``_dart<noise>`` before ``_d`` for noisy demos.

    Raises:
        ValueError: An unknown or invalid task option.
        TypeError: An unknown ``randomization`` field.
    """
    import tasks

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
    name = "_".join([task, *readable, digest, *dart, f"d{difficulty:g}", f"n{demos}"])
    return Path(demo_dir) / f"{name}.hdf5"
