"""Advantage estimators, KL estimators and the clipped policy loss, as pure functions.

The split follows TRL's GRPO: how an advantage is estimated (:func:`group_advantages`) is kept
apart from the per-token objective and from how token losses are aggregated into one scalar
(:func:`policy_loss`). Nothing here touches an environment, a model or a logger; every function
takes tensors and returns tensors (plus a dict of python floats for metrics).

References:
    Williams (1992), REINFORCE. Schulman et al. (2015), GAE. Schulman et al. (2017), PPO.
    Shao et al. (2024), DeepSeekMath (GRPO). Kool et al. (2019), "Buy 4 REINFORCE samples, get
    a baseline for free!" (RLOO). Liu et al. (2025), "Understanding R1-Zero-Like Training"
    (Dr. GRPO). Yu et al. (2025), DAPO (clip-higher). Schulman (2020), "Approximating KL
    divergence" (the k3 estimator).
"""

from __future__ import annotations

import torch

from harness.objective_names import AGGREGATIONS, ESTIMATORS, RATIO_UNITS  # noqa: F401

_GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo")


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    estimator: str = "grpo",
    values: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """One advantage per attempt, from rewards of groups of attempts that share a start state.

    With ``r`` the rewards of one group of ``G = group_size`` attempts:

    * ``grpo`` (Shao et al., 2024): ``(r - mean(r)) / (std(r) + eps)``, population std.
    * ``dr_grpo`` (Liu et al., 2025): ``r - mean(r)``; drops the std, which over-weights groups
      that are nearly all right or all wrong.
    * ``rloo`` (Kool et al., 2019): ``r_i - mean(r_j, j != i)``, the leave-one-out baseline;
      equals ``G / (G - 1) * (r - mean(r))``.
    * ``critic``: ``r - values``, a learned ``V(s0)`` as baseline (actor-critic style).
    * ``reinforce`` (Williams, 1992): ``r`` itself, no baseline.

    Args:
        rewards: ``(N,)`` float rewards ordered group by group, so ``rewards.view(-1, G)`` puts
            one group per row. ``N`` must be a multiple of ``group_size``.
        group_size: ``G``, attempts per group.
        estimator: One of :data:`ESTIMATORS`.
        values: ``(N,)`` baseline values, required by ``critic`` and ignored otherwise.
        eps: Added to the std by ``grpo`` so all-equal groups give zero, not NaN.

    Returns:
        ``(N,)`` advantages, in the order of ``rewards``.

    Raises:
        ValueError: Unknown estimator, ``group_size`` too small for the estimator, ``N`` not a
            multiple of ``group_size``, or ``critic`` without matching ``values``.
    """
    _check_group_rewards(rewards, group_size, estimator)

    if estimator == "reinforce":
        return rewards.clone()
    if estimator == "critic":
        if values is None:
            raise ValueError("estimator 'critic' needs values (a baseline V(s0) per attempt)")
        if values.shape != rewards.shape:
            raise ValueError(
                f"values shape {tuple(values.shape)} must match rewards shape"
                f" {tuple(rewards.shape)}"
            )
        return rewards - values

    grouped = rewards.view(-1, group_size)  # (num_groups, G)
    group_mean = grouped.mean(dim=1, keepdim=True)
    if estimator == "grpo":
        group_std = grouped.std(dim=1, unbiased=False, keepdim=True)
        advantages = (grouped - group_mean) / (group_std + eps)
    elif estimator == "dr_grpo":
        advantages = grouped - group_mean
    else:  # rloo
        mean_of_others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
        advantages = grouped - mean_of_others
    return advantages.reshape(-1)


def _check_group_rewards(rewards: torch.Tensor, group_size: int, estimator: str) -> None:
    """Raise ``ValueError`` unless ``rewards`` split into groups ``estimator`` can compare."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose one of {ESTIMATORS}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if estimator in _GROUP_ESTIMATORS and group_size < 2:
        raise ValueError(
            f"estimator {estimator!r} compares attempts within a group and needs group_size >= 2,"
            f" got {group_size}"
        )
    if rewards.numel() % group_size != 0:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of group_size={group_size}"
        )


def gae(
    rewards: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
    last_values: torch.Tensor, terminated: torch.Tensor, gamma: float, lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al., 2015) over padded attempts.

    ``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)`` and
    ``A_t = sum_{l >= 0} (gamma * lam)^l * delta_{t+l}``, computed backwards as
    ``A_t = delta_t + gamma * lam * A_{t+1}``. After an attempt's last decision the next value is
    0 when it ``terminated`` (success ended it) and ``last_values`` (the critic's value of the
    state it was cut in) when a step limit truncated it, so a time limit is not read as a
    failure.

    Args:
        rewards: ``(N, T)`` reward of each decision, padded after ``lengths``.
        values: ``(N, T)`` ``V(s_t)`` at each decision, padded likewise.
        lengths: ``(N,)`` decisions of each attempt, in ``[1, T]``.
        last_values: ``(N,)`` value of the state after the last decision (used if truncated).
        terminated: ``(N,)`` bool, the attempt ended in a terminal state.
        gamma: Discount per decision, in [0, 1].
        lam: GAE's lambda, in [0, 1] (0: one-step TD, 1: Monte-Carlo return minus V).

    Returns:
        ``(advantages, returns)``, both ``(N, T)`` and 0 on the padding; the returns
        (``advantages + values``) are the value head's regression targets.

    Raises:
        ValueError: Mismatched shapes, lengths outside ``[1, T]``, or gamma/lam outside [0, 1].
    """
    if rewards.shape != values.shape or rewards.dim() != 2:
        raise ValueError(f"rewards {tuple(rewards.shape)} and values {tuple(values.shape)} "
                         "must both be (N, T)")
    n, t_max = rewards.shape
    for name, tensor in (("lengths", lengths), ("last_values", last_values),
                         ("terminated", terminated)):
        if tensor.shape != (n,):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}; expected ({n},)")
    if n and (int(lengths.min()) < 1 or int(lengths.max()) > t_max):
        raise ValueError(f"lengths must be in [1, {t_max}]; got {lengths.tolist()}")
    for name, value in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}={value}; must be in [0, 1]")
    steps = torch.arange(t_max, device=rewards.device)
    mask = steps[None, :] < lengths[:, None]
    last = steps[None, :] == (lengths[:, None] - 1)
    bootstrap = torch.where(terminated, torch.zeros_like(last_values), last_values)
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    next_values = torch.where(last, bootstrap[:, None].expand_as(values), next_values)
    deltas = (rewards + gamma * next_values - values) * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(n, dtype=rewards.dtype, device=rewards.device)
    for t in range(t_max - 1, -1, -1):
        running = deltas[:, t] + gamma * lam * running * mask[:, t]
        advantages[:, t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, clip: float | None = None) -> torch.Tensor:
    """PPO's value loss, ``0.5 * (V - R)^2``, averaged over the unmasked decisions; with
    ``clip``, the larger of it and the loss of ``old_V + clip(V - old_V, -clip, clip)`` (the
    value moves at most ``clip`` from the value the rollout recorded, as in PPO2's baselines).

    Args:
        values: Current ``V(s_t)``, any shape.
        old_values: ``V(s_t)`` when the rollout was collected, same shape.
        returns: The targets (:func:`gae`'s returns), same shape.
        mask: 1 where a decision exists, same shape.
        clip: Clip range of the value's move; ``None`` leaves it unclipped.

    Returns:
        The scalar loss.
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"clip={clip}; must be > 0 or None")
    losses = (values - returns) ** 2
    if clip is not None:
        moved = old_values + torch.clamp(values - old_values, -clip, clip)
        losses = torch.maximum(losses, (moved - returns) ** 2)
    mask = mask.to(values.dtype)
    return 0.5 * (losses * mask).sum() / mask.sum().clamp(min=1.0)


def ratio_unit_mask(executed: torch.Tensor, unit: str, parts: int, chunk: int,
                    width: int) -> torch.Tensor:
    """Which of :func:`ratio_units`'s units count for decisions that played ``executed``
    ``(N,)`` control steps of their chunk of ``chunk`` entries: ``(N, U)`` bool, the units of
    the played entries (every ``decision`` unit counts).

    Raises:
        ValueError: An unknown unit.
    """
    if unit not in RATIO_UNITS[1:]:
        raise ValueError(f"unit={unit!r}; choose one of {RATIO_UNITS[1:]} (native units come "
                         "from the policy's own log_prob)")
    executed = torch.as_tensor(executed)
    played = torch.arange(chunk, device=executed.device)[None, :] < executed[:, None]
    if unit == "decision":
        return torch.ones((len(executed), 1), dtype=torch.bool, device=executed.device)
    if unit == "step":
        return played
    elements = played.repeat_interleave(width, dim=1)
    return elements if unit == "element" else elements.repeat(1, parts)


def ratio_units(parts: torch.Tensor, executed: torch.Tensor, unit: str,
                normalize: bool = False,
                clamp: tuple[float, float] | None = None) -> torch.Tensor:
    """A decision's log-probability cut into the units the clipped ratio treats one by one.

    A decision's log-density is a sum of *parts* ``(N, P, H, W)``: for each of its ``H`` chunk
    entries and ``W`` action dimensions, ``P`` terms (one for a token or a Gaussian entry; for a
    Flow-Noise chain, the start ``x_0`` and each of the ``K`` denoising steps, ``P = K + 1``).
    The units (:func:`ratio_unit_mask` says which count: those of the entries played):

    * ``element``: one per (entry, dimension), its ``P`` parts summed: ``(N, H * W)``;
    * ``chain_element``: one per part: ``(N, P * H * W)``, part-major;
    * ``step``: one per entry, its ``P * W`` parts summed: ``(N, H)``;
    * ``decision``: one per decision, the parts of its played entries summed: ``(N, 1)``.

    With ``normalize``, a unit's log-probability is divided by the number of parts it sums
    (``P``, ``1``, ``P * W``, ``P * W * executed``: πRL's average over denoising steps,
    ReinFlow's log-prob over steps and dims), so that its ratio moves as one part's does;
    ``clamp`` then bounds it (ReinFlow's ``[-1, 1]``). Old, new and reference log-probabilities
    all go through the same cut.

    Args:
        parts: ``(N, P, H, W)`` log-probability parts of ``N`` decisions.
        executed: ``(N,)`` int, control steps each decision played, in ``[1, H]``.
        unit: One of ``decision``, ``step``, ``element``, ``chain_element``.
        normalize: Divide each unit by the number of parts it sums.
        clamp: ``(low, high)`` bounds of each unit's log-probability, or ``None``.

    Returns:
        ``(N, U)`` log-probabilities of the units.

    Raises:
        ValueError: An unknown unit, ``parts`` not 4-D, or ``executed`` of another length.
    """
    if unit not in RATIO_UNITS[1:]:
        raise ValueError(f"unit={unit!r}; choose one of {RATIO_UNITS[1:]} (native units come "
                         "from the policy's own log_prob)")
    if parts.dim() != 4 or tuple(executed.shape) != tuple(parts.shape[:1]):
        raise ValueError(f"parts of shape {tuple(parts.shape)} and executed of shape "
                         f"{tuple(executed.shape)}; expected (N, P, H, W) and (N,)")
    p, h, w = parts.shape[1:]
    if unit == "element":
        units, count = parts.sum(dim=1).flatten(1), p
    elif unit == "chain_element":
        units, count = parts.flatten(1), 1
    elif unit == "step":
        units, count = parts.sum(dim=(1, 3)), p * w
    else:  # decision: the played entries only
        played = ratio_unit_mask(executed.to(parts.device), "step", p, h, w)
        units = (parts.sum(dim=(1, 3)) * played.to(parts.dtype)).sum(dim=1, keepdim=True)
        count = (p * w * played.sum(dim=1, keepdim=True).clamp(min=1)).to(parts.dtype)
    if normalize:
        units = units / count
    if clamp is not None:
        units = units.clamp(float(clamp[0]), float(clamp[1]))
    return units


def max_ratio_units(unit: str, max_episode_steps: int, steps_per_decision: int, parts: int,
                    width: int) -> int:
    """Most units of ``unit`` an attempt of ``max_episode_steps`` control steps can count
    (Dr. GRPO's constant ``T_max``), decisions playing ``steps_per_decision`` steps each, with
    ``parts`` log-prob parts per element and ``width`` elements per step.

    Raises:
        ValueError: An unknown unit.
    """
    if unit == "decision":
        return -(-max_episode_steps // steps_per_decision)
    per_step = {"element": width, "chain_element": parts * width, "step": 1}
    if unit not in per_step:
        raise ValueError(f"unit={unit!r}; choose one of {RATIO_UNITS[1:]}")
    return max_episode_steps * per_step[unit]


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of ``KL(pi_theta || pi_ref)`` from samples of ``pi_theta``.

    ``exp(ref_logp - logp) - (ref_logp - logp) - 1``: unbiased, and non-negative for every sample
    because ``exp(x) >= 1 + x`` (Schulman, 2020; used as GRPO's KL penalty, Shao et al., 2024).

    Args:
        logp: Log-probabilities of the sampled tokens under the current policy, any shape.
        ref_logp: Log-probabilities of the same tokens under the reference policy, same shape.

    Returns:
        The per-token estimate, same shape as ``logp``.
    """
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    aggregation: str = "seq_mean_token_mean",
    max_tokens: int | None = None,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate per token, an optional KL leash, aggregated into one loss.

    Per valid token (Schulman et al., 2017; GRPO's form in Shao et al., 2024)::

        rho = exp(logp - old_logp)
        l   = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A) + beta * k3(logp, ref)

    ``clip_high > clip_low`` is DAPO's "clip-higher" (Yu et al., 2025). The token losses are
    then aggregated into one scalar by :func:`aggregate_token_loss`.

    Args:
        logp: ``(B, T)`` log-probabilities of the taken tokens under the policy being trained
            (an attempt's row: the tokens of the steps it played, decision after decision;
            with action chunks, a decision's unplayed tail is not in it).
        old_logp: ``(B, T)`` the same under the policy that collected the data (no gradient).
        advantages: ``(B,)`` one advantage per attempt, shared by all of its tokens, or ``(B,
            T)`` one per token (PPO with GAE: each decision's advantage on its tokens).
        mask: ``(B, T)`` bool or float, 1 for a valid token, 0 for padding.
        clip_low: ``epsilon_low``; the ratio is clipped below at ``1 - clip_low``.
        clip_high: ``epsilon_high``; the ratio is clipped above at ``1 + clip_high``. Defaults to
            ``clip_low``.
        aggregation: One of :data:`AGGREGATIONS` (see :func:`aggregate_token_loss`).
        max_tokens: The constant ``T_max`` of ``token_sum_const``.
        ref_logp: ``(B, T)`` log-probabilities under a frozen reference policy, for the KL term.
        beta: Weight of the KL term; needs ``ref_logp`` when positive.

    Returns:
        ``(loss, metrics)``: the scalar loss to minimise and python floats ``clip_fraction``
        (share of valid tokens whose clipped term was chosen and differs from the unclipped one),
        ``approx_kl`` (mean k3 estimate of ``KL(old || new)``, i.e. ``(rho - 1) - log rho``),
        ``ratio_mean``, the spread ``ratio_std``, ``ratio_min``, ``ratio_max`` and, when
        ``ref_logp`` is given, ``kl_ref`` (mean k3 to the reference).

    Raises:
        ValueError: Unknown aggregation, ``token_sum_const`` without ``max_tokens``,
            ``beta > 0`` without ``ref_logp``, or mismatched shapes.
    """
    _check_loss_inputs(logp, old_logp, advantages, mask, aggregation, max_tokens, ref_logp, beta)
    if clip_high is None:
        clip_high = clip_low

    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)  # (B, 1), broadcast over tokens
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    pg_unclipped = ratio * adv
    pg_clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(pg_unclipped, pg_clipped)  # (B, T)
    kl_ref = None if ref_logp is None else kl_k3(logp, ref_logp)
    if kl_ref is not None and beta > 0:
        per_token = per_token + beta * kl_ref

    loss = aggregate_token_loss(per_token, mask, aggregation, max_tokens)
    return loss, _surrogate_metrics(mask, log_ratio, ratio, pg_unclipped, pg_clipped, kl_ref)


@torch.no_grad()
def _surrogate_metrics(
    mask: torch.Tensor, log_ratio: torch.Tensor, ratio: torch.Tensor,
    pg_unclipped: torch.Tensor, pg_clipped: torch.Tensor, kl_ref: torch.Tensor | None,
) -> dict[str, float]:
    """Means over valid tokens of :func:`policy_loss`'s terms (its Returns names them)."""
    num_valid = mask.sum().clamp(min=1.0)

    def valid_mean(x: torch.Tensor) -> float:
        return float((x * mask).sum() / num_valid)

    metrics = {
        "clip_fraction": valid_mean((pg_clipped < pg_unclipped).to(mask.dtype)),
        "approx_kl": valid_mean((ratio - 1.0) - log_ratio),
        "ratio_mean": valid_mean(ratio),
        "ratio_std": float(ratio[mask > 0].std()) if int(mask.sum()) > 1 else 0.0,
        "ratio_min": float(ratio[mask > 0].min()) if int(mask.sum()) else 1.0,
        "ratio_max": float(ratio[mask > 0].max()) if int(mask.sum()) else 1.0,
    }
    if kl_ref is not None:
        metrics["kl_ref"] = valid_mean(kl_ref)
    return metrics


def aggregate_token_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    aggregation: str = "seq_mean_token_mean",
    max_tokens: int | None = None,
) -> torch.Tensor:
    """One scalar loss from per-token losses, padding excluded.

    * ``seq_mean_token_mean`` (GRPO): mean over each row's valid tokens, then mean over rows. A
      long attempt's tokens each weigh less, which favours long wrong attempts (Liu et al., 2025).
      Rows without valid tokens count as zero.
    * ``token_sum_const`` (Dr. GRPO): sum over valid tokens divided by the constant
      ``B * max_tokens``, so every token weighs the same whatever its attempt's length.
    * ``token_mean`` (DAPO): sum over valid tokens divided by the number of valid tokens.

    Args:
        per_token: ``(B, T)`` loss of each token.
        mask: ``(B, T)`` float, 1 for a valid token, 0 for padding.
        aggregation: One of :data:`AGGREGATIONS`.
        max_tokens: The constant ``T_max`` of ``token_sum_const``.

    Returns:
        The scalar loss.

    Raises:
        ValueError: Unknown aggregation, or ``token_sum_const`` without ``max_tokens >= 1``.
    """
    _check_aggregation(aggregation, max_tokens)
    masked = per_token * mask
    if aggregation == "seq_mean_token_mean":
        return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean()
    if aggregation == "token_sum_const":
        return masked.sum() / (per_token.shape[0] * max_tokens)
    return masked.sum() / mask.sum().clamp(min=1.0)  # token_mean


def _check_aggregation(aggregation: str, max_tokens: int | None) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {AGGREGATIONS}")
    if aggregation == "token_sum_const" and (max_tokens is None or max_tokens < 1):
        raise ValueError(f"aggregation 'token_sum_const' needs max_tokens >= 1, got {max_tokens}")


def _check_loss_inputs(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    aggregation: str, max_tokens: int | None, ref_logp: torch.Tensor | None, beta: float,
) -> None:
    """Raise ``ValueError`` on inputs :func:`policy_loss` refuses, before any arithmetic."""
    _check_aggregation(aggregation, max_tokens)
    if beta > 0 and ref_logp is None:
        raise ValueError(f"beta={beta} weighs a KL to the reference policy but ref_logp is None")
    if logp.dim() != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp, old_logp and mask must share one (B, T) shape, got {tuple(logp.shape)},"
            f" {tuple(old_logp.shape)} and {tuple(mask.shape)}"
        )
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(
            f"advantages must have shape (B,)=({logp.shape[0]},) (one per attempt) or (B, T)="
            f"{tuple(logp.shape)} (one per token), got {tuple(advantages.shape)}"
        )
