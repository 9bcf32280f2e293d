"""State-feature pretraining: a pixel policy's features taught where things are, before
behaviour cloning, by regressing the simulator state from noisy-expert frames through a
throw-away linear head (the policy never reads the state as an input). Part of the start of
group fine-tuning (:func:`harness.start_policy.cloned_start_policy`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

import tasks
from harness.config import state_pretrain_first_seed
from harness.policies import Policy, obs_to_batch
from harness.start_policy.bc import random_shift, split_by_episode


def pretrain_state_features(
    policy: Policy,
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
        policy: A policy reading ``pixels``; trained in place on its parameters' device
            (its token head is untouched).
        task: Task name.
        task_options: Options of ``tasks.make``; ``obs_mode`` is replaced by ``pixels_state``.
        episodes: Noisy-expert episodes to render (seeds
            ``harness.config.state_pretrain_first_seed(seed) + i``, disjoint from the evaluation
            seeds).
        epochs: Passes over the frames.
        difficulty: Start-state difficulty of those episodes.
        noise: Std of the Gaussian noise on the expert's actions.
        lr: Adam learning rate.
        batch_size: Frames per gradient step.
        seed: Seeds the episodes, the split and the shuffling.
        val_fraction: Share of episodes held out to report how well the state is predicted.
        shift_pad: Randomly shift the training frames by up to this many pixels
            (:func:`harness.start_policy.bc.random_shift`,
             DrQ); the held-out frames are never shifted. 0
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
    _check_settings(policy, episodes, epochs, shift_pad)
    start = time.perf_counter()
    frames, episode_ids = _noisy_expert_frames(
        task, task_options, (*policy.obs_shapes, "state"), range(episodes), difficulty, noise,
        seed, progress)
    obs, target, train_idx, val_idx = _standardised_states(
        frames, episode_ids, next(policy.parameters()).device, val_fraction, seed)
    head, losses = _fit_state_head(policy, obs, target, train_idx, epochs, lr, batch_size, seed,
                                   shift_pad, progress)
    policy.eval()
    return {
        "pretrain/frames": len(episode_ids),
        "pretrain/train_loss": float(np.mean(losses)),
        "pretrain/val_r2": _explained_variance(policy, head, obs, target, val_idx),
        "pretrain/seconds": time.perf_counter() - start,
    }


def _standardised_states(
    frames: dict[str, list[np.ndarray]], episode_ids: list[int], device: torch.device,
    val_fraction: float, seed: int,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """The policy's inputs, the state standardised by the training steps' statistics, and the
    training and held-out step indices (episodes split by
    :func:`harness.start_policy.bc.split_by_episode`)."""
    obs = obs_to_batch({k: np.stack(v) for k, v in frames.items() if k != "state"},
                       device=device, batched=True)
    state = torch.as_tensor(np.stack(frames["state"]), dtype=torch.float32, device=device)
    train_idx, val_idx = (i.to(device) for i in
                          split_by_episode(np.asarray(episode_ids), val_fraction, seed))
    mean = state[train_idx].mean(dim=0)
    std = state[train_idx].std(dim=0).clamp(min=1e-3)
    return obs, (state - mean) / std, train_idx, val_idx


def _fit_state_head(
    policy: Policy, obs: Mapping[str, torch.Tensor], target: torch.Tensor,
    train_idx: torch.Tensor, epochs: int, lr: float, batch_size: int, seed: int,
    shift_pad: int, progress: bool,
) -> tuple[torch.nn.Linear, list[float]]:
    """Train the policy's features and a fresh linear head to regress ``target`` (MSE).

    Returns:
        The head and the minibatch losses of the last epoch.
    """
    head = torch.nn.Linear(policy.spec.feature_dim, target.shape[1]).to(target.device)
    optimizer = torch.optim.Adam([*policy.parameters(), *head.parameters()], lr=lr)
    generator = torch.Generator().manual_seed(seed)  # the shuffling and the shifts
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
    return head, losses


def _noisy_expert_frames(
    task: str, task_options: Mapping[str, Any], keys: tuple[str, ...], episodes: range,
    difficulty: float, noise: float, seed: int, progress: bool,
) -> tuple[dict[str, list[np.ndarray]], list[int]]:
    """The observations ``keys`` of every step of noisy-expert episodes, rendered in
    ``pixels_state`` mode, with each step's episode index (seeds as in
    :func:`pretrain_state_features`)."""
    env = tasks.make(task, **{**task_options, "obs_mode": "pixels_state"})
    frames: dict[str, list[np.ndarray]] = {key: [] for key in keys}
    episode_ids: list[int] = []
    try:
        for i in tqdm(episodes, desc="state pretraining frames", disable=not progress,
                      leave=False):
            episode_seed = state_pretrain_first_seed(seed) + i
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
    return frames, episode_ids


@torch.no_grad()
def _explained_variance(policy: Policy, head: torch.nn.Module,
                        obs: Mapping[str, torch.Tensor], target: torch.Tensor,
                        val_idx: torch.Tensor) -> float:
    """Share of the held-out standardised state's variance the head predicts from the policy's
    features (R^2 over the dimensions that vary); NaN without held-out steps."""
    if not len(val_idx):
        return math.nan
    policy.eval()
    predicted = torch.cat([head(policy.features({k: v[idx] for k, v in obs.items()}))
                           for idx in val_idx.split(256)])
    truth = target[val_idx]
    varying = truth.var(dim=0) > 1e-6  # parked cubes never move
    residual = ((predicted - truth)[:, varying] ** 2).mean()
    return float(1.0 - residual / truth[:, varying].var(dim=0).mean())


def _check_settings(policy: Policy, episodes: int, epochs: int, shift_pad: int) -> None:
    """Raise ``ValueError`` on what :func:`pretrain_state_features` refuses, naming the value."""
    if episodes < 1 or epochs < 1:
        raise ValueError(f"episodes={episodes}, epochs={epochs}; both must be >= 1")
    if shift_pad < 0:
        raise ValueError(f"shift_pad={shift_pad}; must be >= 0 (pixels)")
    if "pixels" not in policy.obs_shapes:
        raise ValueError(
            f"state-feature pretraining is for pixel policies; this {policy.spec.kind} policy"
            f" reads {sorted(policy.obs_shapes)}"
        )
