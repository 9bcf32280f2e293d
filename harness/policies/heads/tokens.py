"""The ``tokens`` head: every action dimension of every chunk step is one categorical token.

Vision-language-action models (RT-2, OpenVLA) discretise every action dimension into ``K``
uniform bins and predict one token per dimension, so a policy-gradient step works on
log-probabilities of discrete tokens exactly as in language-model RL (PPO, GRPO). Here bin
centres are ``linspace(-1, 1, K)`` over the action space ``Box(-1, 1, (action_dim,))``; a
decision of ``H`` actions scores ``H * action_dim`` tokens, step major (token ``h * A + d`` is
dimension ``d`` of the chunk's action ``h``). Tokens are drawn by the inverse CDF at given
uniforms (:func:`sample_tokens`), so a row's draw depends on its own numbers only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from harness.policies.heads.base import ActionHead, BCScores, Decision, check_temperature

MAX_BINS = 4096  # the record holds bin indices; more bins than this is a typo, not a policy

BIN_CENTRES_RULE = "action = -1 + 2 * token / (num_bins - 1)"  # harness.deploy's too


# --- discretisation ---------------------------------------------------------------------------


def actions_to_tokens(actions: torch.Tensor | np.ndarray, num_bins: int) -> torch.Tensor:
    """Index of the nearest of ``num_bins`` bin centres ``linspace(-1, 1, num_bins)``.

    Args:
        actions: Float actions of any shape; values outside ``[-1, 1]`` go to the end bins.
        num_bins: ``K >= 2``.

    Returns:
        Int64 tokens in ``[0, K)``, same shape as ``actions``.

    Raises:
        ValueError: ``num_bins < 2``.
    """
    _check_num_bins(num_bins)
    actions = torch.as_tensor(actions, dtype=torch.float32)
    scaled = (actions.clamp(-1.0, 1.0) + 1.0) * 0.5 * (num_bins - 1)
    return torch.round(scaled).long().clamp(0, num_bins - 1)


def tokens_to_actions(tokens: torch.Tensor | np.ndarray, num_bins: int) -> torch.Tensor:
    """Bin centres of ``tokens``: ``-1 + 2 * token / (K - 1)``.

    Args:
        tokens: Integer tokens in ``[0, K)``, any shape.
        num_bins: ``K >= 2``.

    Returns:
        Float32 actions in ``[-1, 1]``, same shape as ``tokens``.

    Raises:
        ValueError: ``num_bins < 2``.
    """
    _check_num_bins(num_bins)
    tokens = torch.as_tensor(tokens)
    return tokens.to(torch.float32) * (2.0 / (num_bins - 1)) - 1.0


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """Sample one token per row of ``logits`` by the inverse CDF of its softmax.

    Token ``k`` is drawn when ``u`` falls in ``[cdf[k-1], cdf[k])``, so a row's token depends
    only on that row's logits and its own number ``u``: the same ``u`` gives the same token
    whichever batch, worker or device the row was computed in. Zero-probability tokens are
    never drawn.

    Args:
        logits: ``(..., K)`` unnormalised scores (already divided by any temperature).
        uniforms: ``logits.shape[:-1]`` numbers in ``[0, 1)``; ``None`` draws them with
            torch's global generator.

    Returns:
        Int64 tokens, ``logits.shape[:-1]``.

    Raises:
        ValueError: ``uniforms`` has another shape.
    """
    if uniforms is None:
        uniforms = torch.rand(logits.shape[:-1], device=logits.device)
    uniforms = torch.as_tensor(uniforms, dtype=torch.float32, device=logits.device)
    if uniforms.shape != logits.shape[:-1]:
        raise ValueError(f"uniforms of shape {tuple(uniforms.shape)} for logits of shape "
                         f"{tuple(logits.shape)}; expected {tuple(logits.shape[:-1])}")
    cdf = torch.softmax(logits.float(), dim=-1).cumsum(dim=-1)
    cdf = cdf / cdf[..., -1:]  # the last entry exactly 1, so every u < 1 finds a token
    tokens = torch.searchsorted(cdf, uniforms.unsqueeze(-1).contiguous(), right=True)
    return tokens.squeeze(-1).clamp(max=logits.shape[-1] - 1)


def _check_num_bins(num_bins: int) -> None:
    if num_bins < 2:
        raise ValueError(f"num_bins must be >= 2 to cover [-1, 1], got {num_bins}")


# --- behaviour cloning ------------------------------------------------------------------------


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


def chunk_token_targets(target_chunks: torch.Tensor, valid: torch.Tensor | None,
                        num_bins: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Demonstrated chunks ``(B, H, A)`` and their step mask ``(B, H)`` (or ``None``) as target
    tokens ``(B, H * A)`` and a token mask of the same shape (or ``None``)."""
    tokens = actions_to_tokens(target_chunks.reshape(len(target_chunks), -1), num_bins)
    tokens = tokens.to(target_chunks.device)
    if valid is None:
        return tokens, None
    return tokens, valid.to(tokens.device).repeat_interleave(target_chunks.shape[-1], dim=1)


def token_bc_scores(logits: torch.Tensor, target: torch.Tensor, counted: torch.Tensor | None,
                    num_bins: int) -> BCScores:
    """:class:`BCScores` of token logits ``(B, T, K)`` against target tokens ``(B, T)`` over the
    ``counted`` ones (``None``: all): the cross-entropy, the exact tokens of the arg-max and the
    distance between their bin centres."""
    predicted = logits.argmax(dim=-1)
    distance = (tokens_to_actions(predicted, num_bins) - tokens_to_actions(target, num_bins)).abs()
    if counted is None:
        return BCScores(token_cross_entropy(logits, target).item() * target.numel(),
                        (predicted == target).sum().item(), distance.sum().item(),
                        target.numel())
    count = counted.sum().item()
    return BCScores(token_cross_entropy(logits, target, counted).item() * count,
                    ((predicted == target) & counted).sum().item(),
                    (distance * counted).sum().item(), count)


# --- the head ---------------------------------------------------------------------------------


class TokenHead(ActionHead):
    """``num_bins`` categorical tokens per action dimension and chunk step (RT-2, OpenVLA).

    One linear layer gives logits ``(B, H, A, K)`` (its output laid out step, then dimension,
    then bin); tokens are drawn by the inverse CDF :func:`sample_tokens` with the logits divided
    by the temperature. The record is the chunk's ``H * A`` tokens, int64. Each token is one
    unit of the clipped ratio.

    Args:
        feature_dim: ``F``.
        chunk_size: ``H``.
        action_dim: ``A``.
        num_bins: ``K`` in ``[2, MAX_BINS]``.
    """

    @dataclass
    class Config:
        """``policy.head`` of ``tokens``.

        Attributes:
            num_bins: ``K`` tokens per action dimension, in ``[2, 4096]``.
        """

        num_bins: int = 11

        def __post_init__(self) -> None:
            if isinstance(self.num_bins, bool) or not isinstance(self.num_bins, int) or not (
                    2 <= self.num_bins <= MAX_BINS):
                raise ValueError(f"num_bins={self.num_bins!r}; need an int in [2, {MAX_BINS}]")

    export_outputs = ("logits", "tokens", "actions")

    def __init__(self, feature_dim: int, chunk_size: int, action_dim: int = 4, *,
                 num_bins: int = 11) -> None:
        super().__init__(feature_dim, chunk_size, action_dim)
        self.num_bins = self.Config(num_bins).num_bins
        self.record_dim = self.noise_dim = self.chunk_dim
        self.linear = nn.Linear(feature_dim, self.chunk_dim * num_bins)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores ``(B, H * A, K)``: row ``h * A + d`` scores dimension ``d`` of
        the chunk's action ``h``."""
        return self.linear(self.check_features(features)).view(-1, self.chunk_dim, self.num_bins)

    @torch.no_grad()
    def sample(self, features: torch.Tensor, temperature: float = 1.0,
               generator: torch.Generator | None = None,
               noise: torch.Tensor | None = None) -> Decision:
        """One token per chunk entry from ``softmax(logits / temperature)``; ``noise`` (``(B,
        H * A)`` uniforms in ``[0, 1)``) or else ``generator`` (on the features' device) gives
        the uniforms of the inverse CDF."""
        logits = self.logits(features) / check_temperature(temperature)
        if noise is None:
            uniforms = torch.rand(logits.shape[:-1], generator=generator, device=logits.device)
        else:
            uniforms = self.check_noise(features, noise)
        tokens = sample_tokens(logits, uniforms)  # (B, H * A)
        log_probs = F.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        actions = tokens_to_actions(tokens, self.num_bins)
        return Decision(actions.view(-1, self.chunk_size, self.action_dim), tokens,
                        log_probs.sum(dim=-1))

    def noise_from_uniforms(self, uniforms: torch.Tensor) -> torch.Tensor:
        """The uniforms themselves: the inverse CDF reads them."""
        return uniforms

    def unit_log_probs(self, features: torch.Tensor, record: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        """Each token's log-probability ``(B, H * A)`` under ``softmax(logits / temperature)``,
        the distribution :meth:`sample` draws from."""
        expected = (features.shape[0], self.record_dim)
        if tuple(record.shape) != expected:
            raise ValueError(f"record of shape {tuple(record.shape)}; expected {expected} "
                             f"for TokenHead and {features.shape[0]} feature rows")
        log_probs = F.log_softmax(self.logits(features) / check_temperature(temperature), dim=-1)
        return log_probs.gather(-1, record.long().unsqueeze(-1)).squeeze(-1)

    def log_prob(self, features: torch.Tensor, record: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """``(B,)``: the sum of :meth:`unit_log_probs` over the chunk."""
        return self.unit_log_probs(features, record, temperature).sum(dim=-1)

    def units_per_step(self) -> int:
        """``A``: one token per action dimension."""
        return self.action_dim

    def greedy(self, features: torch.Tensor) -> torch.Tensor:
        """Bin centres of the most likely tokens, ``(B, H, A)``."""
        return self.greedy_decision(features)[1]

    def greedy_decision(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The most likely tokens ``(B, H * A)`` and their bin centres ``(B, H, A)``."""
        tokens = self.logits(features).argmax(dim=-1)
        actions = tokens_to_actions(tokens, self.num_bins)
        return tokens, actions.view(len(tokens), self.chunk_size, self.action_dim)

    def bc_loss(self, features: torch.Tensor, target_chunks: torch.Tensor,
                generator: torch.Generator | None = None,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """Cross-entropy of the demonstrated actions' nearest bins (:func:`token_cross_entropy`),
        over every token or over those of the steps ``valid`` ``(B, H)`` marks; ``generator`` is
        unused."""
        target_chunks = self.check_targets(features, target_chunks)
        tokens, counted = chunk_token_targets(target_chunks, valid, self.num_bins)
        return token_cross_entropy(self.logits(features), tokens, counted)

    def bc_scores(self, features: torch.Tensor, target_chunks: torch.Tensor,
                  valid: torch.Tensor | None, generator: torch.Generator | None) -> BCScores:
        """:func:`token_bc_scores` of the demonstrated chunks' tokens."""
        target_chunks = self.check_targets(features, target_chunks)
        tokens, counted = chunk_token_targets(target_chunks, valid, self.num_bins)
        return token_bc_scores(self.logits(features), tokens, counted, self.num_bins)

    def entropy(self, features: torch.Tensor, temperature: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Exact entropy ``(B,)`` of the chunk: the sum of its tokens' entropies, each in
        ``[0, log K]``; ``generator`` is unused."""
        return self.unit_entropy(features, temperature).sum(dim=-1)

    def unit_entropy(self, features: torch.Tensor, temperature: float = 1.0,
                     generator: torch.Generator | None = None) -> torch.Tensor:
        """Each token's entropy, ``(B, H * A)``."""
        log_probs = F.log_softmax(self.logits(features) / check_temperature(temperature), dim=-1)
        return -(log_probs.exp() * log_probs).sum(dim=-1)

    def export_graph(self, features: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``logits`` ``(B, H * A, K)``, the greedy ``tokens`` (first arg-max) and their bin
        centres ``actions`` ``(B, H, A)``."""
        logits = self.logits(features)
        tokens = logits.argmax(dim=-1)
        actions = tokens_to_actions(tokens, self.num_bins)
        return logits, tokens, actions.view(-1, self.chunk_size, self.action_dim)

    def export_record(self) -> dict[str, object]:
        """The bins: their count, rule and centres."""
        return {"num_bins": self.num_bins, "bin_centres_rule": BIN_CENTRES_RULE,
                "bin_centres": np.linspace(-1.0, 1.0, self.num_bins).tolist()}
