"""What behaviour cloning measures on held-out demos: its loss, the exact-token accuracy (tokens
only) and the greedy actions' error, for every action head alike (each policy scores a batch,
:meth:`harness.policies.Policy.bc_scores`)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from harness.policies import Policy


@torch.no_grad()
def validate(
    policy: Policy,
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
    chunks, valid = targets
    # A flow head's loss draws noise: from a fixed seed, so that epochs compare.
    generator = torch.Generator(device=chunks.device).manual_seed(0)
    loss_sum, correct, error, count = 0.0, 0.0, 0.0, 0.0
    for batch_idx in val_idx.split(batch_size):
        scores = policy.bc_scores({key: value[batch_idx] for key, value in obs.items()},
                                  chunks[batch_idx], None if valid is None else valid[batch_idx],
                                  generator)
        loss_sum += scores.loss_sum
        correct += scores.correct
        error += scores.error_sum
        count += scores.count
    return {"bc/val_loss": loss_sum / count, "bc/val_accuracy": correct / count,
            "bc/val_action_error": error / count}
