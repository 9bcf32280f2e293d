"""What behaviour cloning measures: the token cross-entropy it trains token policies by, and
its held-out figures (loss, exact-token accuracy and the greedy actions' error), for token
policies and for the continuous action heads alike."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch.nn import functional as F

from harness.policies import TokenPolicy, tokens_to_actions


def token_cross_entropy(logits: torch.Tensor, tokens: torch.Tensor,
                        valid: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over every action token, or over the ``valid`` ones.

    Args:
        logits: ``(B, T, K)`` token scores (``T``: the tokens of a decision).
        tokens: ``(B, T)`` int64 target tokens.
        valid: ``(B, T)`` bool, the tokens that count (a chunk's slots past the end of its
            episode do not); ``None``: all.

    Returns:
        Scalar loss.
    """
    if valid is None:
        return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    losses = F.cross_entropy(logits.flatten(0, 1), tokens.flatten(), reduction="none")
    weights = valid.flatten().to(losses.dtype)
    return (losses * weights).sum() / weights.sum().clamp(min=1.0)


@torch.no_grad()
def validate(
    policy: TokenPolicy,
    obs: Mapping[str, torch.Tensor],
    targets: tuple[torch.Tensor, torch.Tensor | None],
    val_idx: torch.Tensor,
    batch_size: int,
) -> dict[str, float]:
    """``bc/val_loss`` (the training loss), ``bc/val_accuracy`` (exact tokens) and
    ``bc/val_action_error`` (mean absolute error of the greedy actions) on ``val_idx``, over the
    entries that count (``targets``: what :func:`bc_targets` gives); NaN when empty."""
    if len(val_idx) == 0:
        return {"bc/val_loss": math.nan, "bc/val_accuracy": math.nan,
                "bc/val_action_error": math.nan}
    policy.eval()
    if policy.continuous:
        return _validate_continuous(policy, obs, targets, val_idx, batch_size)
    tokens, valid = targets
    bins = policy.config.num_bins
    loss_sum, correct, error = 0.0, 0, 0.0
    for batch_idx in val_idx.split(batch_size):
        target = tokens[batch_idx]
        logits = policy.logits({key: value[batch_idx] for key, value in obs.items()}, target)
        predicted = logits.argmax(dim=-1)
        distance = (tokens_to_actions(predicted, bins) - tokens_to_actions(target, bins)).abs()
        if valid is None:
            loss_sum += token_cross_entropy(logits, target).item() * target.numel()
            correct += (predicted == target).sum().item()
            error += distance.sum().item()
        else:
            counted = valid[batch_idx]
            loss_sum += token_cross_entropy(logits, target, counted).item() * counted.sum().item()
            correct += ((predicted == target) & counted).sum().item()
            error += (distance * counted).sum().item()
    count = tokens[val_idx].numel() if valid is None else valid[val_idx].sum().item()
    return {"bc/val_loss": loss_sum / count, "bc/val_accuracy": correct / count,
            "bc/val_action_error": error / count}


def _validate_continuous(policy, obs, targets, val_idx, batch_size) -> dict[str, float]:
    """:func:`_validate` for a continuous head: its loss (a flow head's with noise from a
    fixed seed, so that epochs compare) and the greedy actions' error; no token accuracy."""
    chunks, valid = targets
    generator = torch.Generator(device=chunks.device).manual_seed(0)
    loss_sum, error, count = 0.0, 0.0, 0.0
    for batch_idx in val_idx.split(batch_size):
        batch = {key: value[batch_idx] for key, value in obs.items()}
        target = chunks[batch_idx]
        steps = (torch.ones(target.shape[:2], dtype=torch.bool, device=target.device)
                 if valid is None else valid[batch_idx])
        entries = steps.sum().item() * policy.config.action_dim
        loss_sum += policy.bc_loss(batch, target, steps, generator).item() * entries
        _, greedy = policy.act(batch, deterministic=True)
        error += ((greedy - target).abs() * steps.unsqueeze(-1)).sum().item()
        count += entries
    return {"bc/val_loss": loss_sum / count, "bc/val_accuracy": math.nan,
            "bc/val_action_error": error / count}
