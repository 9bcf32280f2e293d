"""Behaviour cloning of a policy on demonstrations, and its evaluation in the task.

The policy trains by its own loss on the demonstrated actions (:meth:`harness.policies.Policy.
bc_loss`): the tokens head by cross-entropy on each action dimension's nearest of its ``K`` bins,
as RT-2 / OpenVLA fine-tune on robot data, a Gaussian head by the likelihood, a flow by flow
matching. Pixels are augmented by random shifts (DrQ, Kostrikov et al. 2020), which matters with
few demonstrations. A policy with action chunks (``chunk_size = H``) learns at step ``t`` the
expert's actions ``t .. t+H-1`` of the same episode; the slots past an episode's end are masked
out of the loss (:func:`harness.policies.chunks.chunk_targets` says why).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tqdm import tqdm

from harness.config.start import BC_KEEP
from harness.demos import Demos
from harness.policies import Policy, obs_to_batch
from harness.policies.chunks import chunk_targets
from harness.start_policy.bc_validation import validate
from harness_common.stats import wilson_interval


def random_shift(pixels: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """Shift each image by up to ``pad`` pixels in x and y, repeating the border (DrQ).

    Equivalent to DrQ's replicate-pad by ``pad`` then random crop back to the original size, done
    by gathering with clamped indices so the uint8 images are never padded or converted.

    Args:
        pixels: ``(B, H, W, C)`` images, any dtype.
        pad: Largest shift in pixels; 0 returns ``pixels`` unchanged.
        generator: Source of the shifts (on the CPU).

    Returns:
        ``(B, H, W, C)`` shifted images, same dtype and device.
    """
    if pad == 0:
        return pixels
    batch, height, width, _ = pixels.shape
    shifts = torch.randint(-pad, pad + 1, (2, batch), generator=generator).to(pixels.device)
    rows = (torch.arange(height, device=pixels.device) + shifts[0, :, None]).clamp(0, height - 1)
    cols = (torch.arange(width, device=pixels.device) + shifts[1, :, None]).clamp(0, width - 1)
    index = torch.arange(batch, device=pixels.device)[:, None, None]
    return pixels[index, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)


def bc_targets(policy: Policy, demos: Demos,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target chunk of every demo step, ``(N, chunk_size, action_dim)``, and which of its
    slots are actions of the step's episode, ``(N, chunk_size)`` (``None``: all of them, as with
    one action)."""
    targets, valid = chunk_targets(demos.actions, demos.episode_ids, policy.spec.chunk_size)
    chunks = torch.as_tensor(np.asarray(targets, dtype=np.float32), device=device)
    return chunks, None if valid is None else torch.as_tensor(valid, device=device)


def pretrain_bc(
    policy: Policy, demos: Demos, epochs: int = 250, lr: float = 3e-3,
    batch_size: int = 32, seed: int = 0, augment: bool = True, shift_pad: int = 4,
    weight_decay: float = 1e-4, val_fraction: float = 0.1, keep: str = "last",
    progress: bool = True,
) -> dict[str, Any]:
    """Train ``policy`` in place, on its device, by its loss on the demos' action chunks.

    A policy with an input normalisation (the MLP's ``normalize_state``) first fits it on the
    training steps (:meth:`harness.policies.Policy.fit_normalizer`).

    Episodes, not steps, are split into training and validation (consecutive steps are nearly
    identical, so a step split would validate on the training set). The policy is left in eval
    mode with the weights ``keep`` names (why the last epoch is the default: :class:`_BestEpoch`).

    Args:
        policy: The policy.
        demos: Demonstrations with every observation key the policy reads.
        epochs: Passes over the training steps.
        lr: AdamW learning rate.
        batch_size: Steps per gradient step.
        seed: Seeds the split, the shuffling and the augmentation (not the initial weights).
        augment: Randomly shift ``pixels`` by up to ``shift_pad`` pixels during training.
        shift_pad: Largest shift of the augmentation.
        weight_decay: AdamW weight decay.
        val_fraction: Share of episodes held out (at least one when > 0 and there are two or
            more episodes).
        keep: ``"last"`` (the last epoch's weights) or ``"best_val_loss"`` (the epoch with the
            lowest validation loss; the last epoch when there is no validation split).
        progress: Show a progress bar over epochs.

    Returns:
        Metrics of the last epoch, ``bc/train_loss``, ``bc/val_loss``, ``bc/val_accuracy`` (share
        of validation tokens predicted exactly; NaN for a continuous head),
        ``bc/val_action_error`` (mean absolute error of the greedy actions, in action units),
        and ``bc/best_epoch``, ``bc/best_val_loss``, ``bc/kept_epoch`` (whose weights the policy
        holds), ``bc/train_steps``, ``bc/val_steps``, ``bc/seconds``, with a fitted
        normalisation ``bc/normalizer_states``; ``history`` holds the per-epoch metrics.
        Validation metrics are NaN without a validation split.

    Raises:
        ValueError: A bad hyper-parameter, an unknown ``keep``, or the demos lack an observation
            the policy reads or have a shape it was not built for.
        FloatingPointError: The loss became NaN or infinite.
    """
    _check_bc_settings(epochs, batch_size, lr, shift_pad, val_fraction, keep)
    device = next(policy.parameters()).device
    obs = policy_inputs(policy, demos, device)
    chunks, valid = bc_targets(policy, demos, device)  # (N, H, A), (N, H)
    train_idx, val_idx = (i.to(device) for i in
                          split_by_episode(demos.episode_ids, val_fraction, seed))
    normalizer = policy.fit_normalizer({key: value[train_idx] for key, value in obs.items()})
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=weight_decay)
    best = _BestEpoch(keep)
    history: list[dict[str, float]] = []
    start = time.perf_counter()
    for epoch in tqdm(range(1, epochs + 1), desc="bc", disable=not progress, leave=False):
        order = train_idx[torch.randperm(len(train_idx), generator=generator)]
        # a pad of 0 shifts nothing and draws nothing: the same as no augmentation
        losses = _train_epoch(policy, obs, (chunks, valid), order, optimizer, generator,
                              batch_size, shift_pad if augment else 0, epoch)
        validation = validate(policy, obs, (chunks, valid), val_idx, batch_size)
        history.append({"bc/train_loss": float(np.mean(losses)), **validation})
        best.update(epoch, validation["bc/val_loss"], policy)
    kept = best.restore(policy, epochs)
    policy.eval()
    return {
        **history[-1],
        **kept,
        "bc/train_steps": len(train_idx),
        "bc/val_steps": len(val_idx),
        "bc/seconds": time.perf_counter() - start,
        **normalizer,
        "history": history,
    }


class _BestEpoch:
    """The epoch of lowest validation loss and, when ``keep`` is ``"best_val_loss"``, a copy of
    its weights to hand on instead of the last ones.

    The last epoch is :func:`pretrain_bc`'s default because, with a handful of held-out
    episodes, the validation cross-entropy rises as the policy grows confident while its
    rollouts keep improving (robomimic, Mandlekar et al. 2021, saw the same): on ``reach`` with
    30 demos, the best-validation-loss weights succeeded in 40-84% of episodes, the last ones in
    76-94%.
    """

    def __init__(self, keep: str) -> None:
        self.keep, self.epoch, self.val_loss = keep, 0, math.inf
        self.state: dict[str, torch.Tensor] | None = None

    def update(self, epoch: int, val_loss: float, policy: Policy) -> None:
        if val_loss < self.val_loss:  # never true without a validation split: the loss is NaN
            self.epoch, self.val_loss = epoch, val_loss
            if self.keep == "best_val_loss":
                self.state = copy.deepcopy(policy.state_dict())

    def restore(self, policy: Policy, epochs: int) -> dict[str, float]:
        """Load the kept weights, if any, into ``policy``.

        Returns:
            ``bc/best_epoch``, ``bc/best_val_loss`` (NaN without a validation split) and
            ``bc/kept_epoch`` (``epochs`` when the last weights are kept).
        """
        if self.state is not None:
            policy.load_state_dict(self.state)
        return {"bc/best_epoch": self.epoch if self.epoch else math.nan,
                "bc/best_val_loss": self.val_loss if self.epoch else math.nan,
                "bc/kept_epoch": self.epoch if self.state is not None else epochs}


def _check_bc_settings(epochs: int, batch_size: int, lr: float, shift_pad: int,
                       val_fraction: float, keep: str) -> None:
    """Raise ``ValueError`` on a setting :func:`pretrain_bc` cannot train with, naming it."""
    if epochs < 1 or batch_size < 1 or not lr > 0 or shift_pad < 0:
        raise ValueError(
            f"epochs={epochs}, batch_size={batch_size}, lr={lr}, shift_pad={shift_pad}; need"
            " epochs >= 1, batch_size >= 1, lr > 0 and shift_pad >= 0"
        )
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction}; expected a number in [0, 1)")
    if keep not in BC_KEEP:
        raise ValueError(f"keep={keep!r}; choose one of {BC_KEEP}")


def _train_epoch(
    policy: Policy,
    obs: Mapping[str, torch.Tensor],
    targets: tuple[torch.Tensor, torch.Tensor | None],
    order: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    batch_size: int,
    shift_pad: int,
    epoch: int,
) -> list[float]:
    """One pass of the policy's behaviour-cloning steps over the steps ``order`` lists, in that
    order, on ``targets``: the chunks and which of their slots count (:func:`bc_targets`).

    Returns:
        The loss of each minibatch.

    Raises:
        FloatingPointError: A loss became NaN or infinite (before its step is taken).
    """
    policy.train()
    losses = []
    chunks, valid = targets
    for batch_idx in order.split(batch_size):
        batch = {key: value[batch_idx] for key, value in obs.items()}
        if "pixels" in batch:
            batch["pixels"] = random_shift(batch["pixels"], shift_pad, generator)
        loss = policy.bc_loss(batch, chunks[batch_idx],
                              None if valid is None else valid[batch_idx], generator)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"BC loss is {loss.item()} at epoch {epoch}; try a lower "
                                     f"lr than {optimizer.param_groups[0]['lr']}")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def policy_inputs(
    policy: Policy, demos: Demos, device: torch.device
) -> dict[str, torch.Tensor]:
    """The demos' observations the policy was built for, as tensors, checked against its shapes."""
    shared = [key for key in policy.obs_shapes if key in demos.obs]
    for key in shared:
        if demos.obs[key].shape[1:] != policy.obs_shapes[key]:
            raise ValueError(
                f"demos have {key!r} of shape {demos.obs[key].shape[1:]}, but the policy was"
                f" built for {policy.obs_shapes[key]}"
            )
    obs = obs_to_batch({key: demos.obs[key] for key in shared}, device=device, batched=True)
    try:
        with torch.no_grad():
            policy.features({key: value[:1] for key, value in obs.items()})
    except KeyError as error:
        raise ValueError(
            f"the {policy.spec.kind} policy reads observation {error.args[0]!r}, which the"
            f" demos lack (they have {sorted(demos.obs)})"
        ) from None
    return obs


def split_by_episode(
    episode_ids: np.ndarray, val_fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step indices of the training and validation episodes."""
    episodes = np.unique(episode_ids)
    num_val = 0
    if val_fraction > 0 and len(episodes) >= 2:
        num_val = min(max(1, round(val_fraction * len(episodes))), len(episodes) - 1)
    val_episodes = np.random.default_rng(seed).permutation(episodes)[:num_val]
    is_val = np.isin(episode_ids, val_episodes)
    return torch.from_numpy(np.flatnonzero(~is_val)), torch.from_numpy(np.flatnonzero(is_val))


def evaluate_policy(
    policy: Policy,
    env: gym.Env | Callable[[], gym.Env],
    episodes: int,
    seed: int,
    deterministic: bool = True,
    difficulty: float | None = None,
) -> dict[str, float]:
    """Success rate of ``policy`` over ``episodes`` episodes, with its Wilson 95% interval.

    Episode ``j`` starts from ``reset(seed=seed + j)``, so two policies evaluated with the same
    ``seed`` face the same start states; success is ``info["is_success"]`` on the last step.

    Args:
        policy: The policy, fed the environment's observations.
        env: An environment (left open) or a function that builds one (closed at the end).
        episodes: Episodes to play, >= 1.
        seed: Seed of the first episode; when sampling, it also seeds the token sampling (the
            global torch generator is left as it was).
        deterministic: Take each dimension's most likely token instead of sampling.
        difficulty: Reset difficulty; ``None`` uses the environment's own default.

    Returns:
        ``eval/success_rate``, ``eval/success_low``, ``eval/success_high``,
        ``eval/mean_length``, ``eval/episodes``.

    Raises:
        ValueError: ``episodes < 1``.
    """
    if episodes < 1:
        raise ValueError(f"episodes={episodes}; must be >= 1")
    owns_env = not isinstance(env, gym.Env)
    if owns_env:
        env = env()
    device = next(policy.parameters()).device
    options = None if difficulty is None else {"difficulty": float(difficulty)}
    was_training = policy.training
    policy.eval()
    steps = policy.spec.execute_steps
    successes, lengths = 0, []
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for j in range(episodes):
                obs, info = env.reset(seed=seed + j, options=options)
                length, done = 0, False
                while not done:  # each decision plays its chunk's first `steps` actions
                    _, chunk = policy.act(obs_to_batch(obs, device=device),
                                          deterministic=deterministic)
                    for action in chunk[0, :steps].cpu().numpy():
                        obs, _, terminated, truncated, info = env.step(action)
                        length += 1
                        done = terminated or truncated
                        if done:
                            break
                successes += bool(info["is_success"])
                lengths.append(length)
    finally:
        policy.train(was_training)
        if owns_env:
            env.close()
    low, high = wilson_interval(successes, episodes)
    return {
        "eval/success_rate": successes / episodes,
        "eval/success_low": low,
        "eval/success_high": high,
        "eval/mean_length": float(np.mean(lengths)),
        "eval/episodes": episodes,
    }
