"""Action heads over a chunk of ``H`` actions: ``tokens``, ``gaussian`` and ``flow``.

Every head maps features ``(B, F)`` (a policy's shared trunk output) to a distribution over a
chunk ``(B, H, A)`` of actions in ``[-1, 1]^A`` and meets :class:`~harness.policies.head_base.
ActionHead`: ``sample`` (actions, a record and its log-density), ``log_prob`` of a record,
``greedy``, ``bc_loss`` and ``entropy``. Log-densities are per decision (summed over the chunk),
so the clipped ratio and the k3 KL of :mod:`harness.objectives` apply unchanged. Build one with
:func:`make_head`; ``flow`` lives in :mod:`harness.policies.flow_head`.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn
from torch.nn import functional as F

from harness.policies.flow_head import FlowHead
from harness.policies.head_base import (
    LOG_SQRT_2PI,
    ActionHead,
    Decision,
    check_temperature,
    gaussian_log_density,
    positive_int,
)
from harness.policies.tokens import (
    HEAD_KINDS,
    actions_to_tokens,
    sample_tokens,
    tokens_to_actions,
)

__all__ = ["HEAD_KINDS", "ActionHead", "Decision", "FlowHead", "GaussianHead", "TokenHead",
           "log1m_tanh_squared", "make_head"]


class TokenHead(ActionHead):
    """``num_bins`` categorical tokens per action dimension and chunk step (RT-2, OpenVLA).

    One linear layer gives logits ``(B, H, A, K)``; bins are :mod:`~harness.policies.tokens`'
    centres ``linspace(-1, 1, K)`` and tokens are drawn by its inverse-CDF
    :func:`~harness.policies.tokens.sample_tokens`, with the logits divided by the temperature.
    The layer's output is laid out as :class:`~harness.policies.TokenPolicy`'s ``action_head``
    (step, then dimension, then bin), so with ``H = 1`` a policy's ``action_head`` weights load
    into :attr:`linear` and give exactly its per-step distribution; :meth:`log_prob` is then the
    sum of :meth:`TokenPolicy.log_prob <harness.policies.TokenPolicy.log_prob>` over dimensions.

    The record is the chunk's ``H * A`` bin indices as floats (exact below ``2^24`` bins).

    Args:
        feature_dim: ``F``.
        chunk_size: ``H``.
        action_dim: ``A``.
        num_bins: ``K >= 2``.
    """

    def __init__(self, feature_dim: int, chunk_size: int, action_dim: int = 4, *,
                 num_bins: int = 11) -> None:
        super().__init__(feature_dim, chunk_size, action_dim)
        if positive_int("num_bins", num_bins) < 2:
            raise ValueError(f"num_bins={num_bins}; need >= 2 to cover [-1, 1]")
        self.num_bins = num_bins
        self.record_dim = self.noise_dim = self.chunk_dim
        self.linear = nn.Linear(feature_dim, self.chunk_dim * num_bins)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores ``(B, H, A, K)``."""
        flat = self.linear(self.check_features(features))
        return flat.view(-1, self.chunk_size, self.action_dim, self.num_bins)

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
            uniforms = self.check_noise(features, noise).view(logits.shape[:-1])
        tokens = sample_tokens(logits, uniforms)  # (B, H, A)
        log_probs = F.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1))
        return Decision(tokens_to_actions(tokens, self.num_bins), tokens.flatten(1).float(),
                        log_probs.sum(dim=(1, 2, 3)))

    def token_log_probs(self, features: torch.Tensor, record: torch.Tensor,
                        temperature: float = 1.0) -> torch.Tensor:
        """Per-token log-probabilities ``(B, H, A)`` of ``record`` at ``temperature``: what a
        trainer that clips each token's ratio (today's objective, ``H = 1``) reads."""
        tokens = self.check_record(features, record).round().long()
        tokens = tokens.view(-1, self.chunk_size, self.action_dim, 1)
        logits = self.logits(features) / check_temperature(temperature)
        return F.log_softmax(logits, dim=-1).gather(-1, tokens).squeeze(-1)

    def log_prob(self, features: torch.Tensor, record: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """``(B,)``: the sum of :meth:`token_log_probs` over the chunk."""
        return self.token_log_probs(features, record, temperature).sum(dim=(1, 2))

    def unit_log_probs(self, features: torch.Tensor, record: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        """One unit per token, ``(B, H * A)``, step major."""
        return self.token_log_probs(features, record, temperature).flatten(1)

    def units_per_step(self) -> int:
        """``A``: one token per action dimension."""
        return self.action_dim

    def greedy(self, features: torch.Tensor) -> torch.Tensor:
        """Bin centres of the most likely tokens, ``(B, H, A)``."""
        return tokens_to_actions(self.logits(features).argmax(dim=-1), self.num_bins)

    def bc_loss(self, features: torch.Tensor, target_chunks: torch.Tensor,
                generator: torch.Generator | None = None,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """Cross-entropy of the targets' nearest bins, averaged over the tokens that count (as
        :func:`harness.bc.token_cross_entropy`); ``generator`` is unused."""
        targets = actions_to_tokens(self.check_targets(features, target_chunks), self.num_bins)
        weights = self.step_weights(features, valid).flatten()
        logits = self.logits(features)
        losses = F.cross_entropy(logits.reshape(-1, self.num_bins), targets.flatten(),
                                 reduction="none")
        return (losses * weights).sum() / weights.sum().clamp(min=1.0)

    def entropy(self, features: torch.Tensor, temperature: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Exact entropy ``(B,)`` of the chunk: the sum of its tokens' entropies, each in
        ``[0, log K]``; ``generator`` is unused."""
        return self.unit_entropy(features, temperature).sum(dim=-1)

    def unit_entropy(self, features: torch.Tensor, temperature: float = 1.0,
                     generator: torch.Generator | None = None) -> torch.Tensor:
        """Each token's entropy, ``(B, H * A)``."""
        log_probs = F.log_softmax(self.logits(features) / check_temperature(temperature), dim=-1)
        return -(log_probs.exp() * log_probs).sum(dim=-1).flatten(1)


def log1m_tanh_squared(u: torch.Tensor) -> torch.Tensor:
    """``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))``, finite for every float ``u``
    (the left side is ``log 0`` once ``tanh(u)`` rounds to 1, near ``|u| = 9`` in float32)."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


class GaussianHead(ActionHead):
    """A diagonal Gaussian over the chunk, squashed into the box by ``tanh`` (SAC's policy).

    ``u ~ N(mean(f), (T * std)^2)`` per chunk entry and the action is ``a = tanh(u)``, so at
    temperature ``T`` the standard deviation of ``u`` is ``T`` times the head's own. The record is
    the pre-squash ``u`` ``(B, H * A)``: ``a`` rounds to +-1 in float32 far from the mean, ``u``
    keeps the exact point. :meth:`log_prob` is the log-density of the *action* by the change of
    variables ``log p(a) = sum [log N(u; mean, (T std)^2) - log(1 - tanh(u)^2)]``; the Jacobian
    term does not depend on the weights, so ratios and KL estimates equal those of ``u``.

    Args:
        feature_dim: ``F``.
        chunk_size: ``H``.
        action_dim: ``A``.
        state_dependent_std: ``log std`` from a linear layer on the features (starting at
            ``log_std_init`` everywhere) instead of one learned value per chunk entry.
        log_std_init: Initial ``log std``.
        log_std_min: Lower clamp of ``log std``.
        log_std_max: Upper clamp of ``log std``.

    Raises:
        ValueError: ``log_std_min <= log_std_init <= log_std_max`` does not hold.
    """

    BC_EDGE = 1e-3  # demonstrated actions are clamped to |a| <= 1 - BC_EDGE before atanh

    def __init__(self, feature_dim: int, chunk_size: int, action_dim: int = 4, *,
                 state_dependent_std: bool = False, log_std_init: float = -0.5,
                 log_std_min: float = -5.0, log_std_max: float = 1.0) -> None:
        super().__init__(feature_dim, chunk_size, action_dim)
        if not log_std_min <= log_std_init <= log_std_max:
            raise ValueError(f"log_std_min={log_std_min}, log_std_init={log_std_init}, "
                             f"log_std_max={log_std_max}; need min <= init <= max")
        self.log_std_min, self.log_std_max = float(log_std_min), float(log_std_max)
        self.record_dim = self.noise_dim = self.chunk_dim
        self.mean = nn.Linear(feature_dim, self.chunk_dim)
        self.state_dependent_std = bool(state_dependent_std)
        if self.state_dependent_std:
            self.log_std_layer = nn.Linear(feature_dim, self.chunk_dim)
            nn.init.zeros_(self.log_std_layer.weight)
            nn.init.constant_(self.log_std_layer.bias, log_std_init)
        else:
            self.log_std = nn.Parameter(torch.full((self.chunk_dim,), float(log_std_init)))

    def mean_and_log_std(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and clamped ``log std`` of ``u`` at temperature 1, each ``(B, H * A)``."""
        features = self.check_features(features)
        mean = self.mean(features)
        raw = self.log_std_layer(features) if self.state_dependent_std else self.log_std
        return mean, raw.clamp(self.log_std_min, self.log_std_max).expand_as(mean)

    def _entry_log_probs(self, u: torch.Tensor, mean: torch.Tensor,
                         std: torch.Tensor) -> torch.Tensor:
        return gaussian_log_density(u, mean, std) - log1m_tanh_squared(u)

    def _action_log_prob(self, u: torch.Tensor, mean: torch.Tensor,
                         std: torch.Tensor) -> torch.Tensor:
        return self._entry_log_probs(u, mean, std).sum(dim=-1)

    @torch.no_grad()
    def sample(self, features: torch.Tensor, temperature: float = 1.0,
               generator: torch.Generator | None = None,
               noise: torch.Tensor | None = None) -> Decision:
        """``u = mean + T * std * eps``, ``eps`` the ``noise`` ``(B, H * A)`` or else from
        ``generator`` (on the features' device)."""
        temperature = check_temperature(temperature)
        mean, log_std = self.mean_and_log_std(features)
        std = temperature * log_std.exp()
        if noise is None:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        else:
            noise = self.check_noise(features, noise)
        u = mean + std * noise
        actions = torch.tanh(u).view(-1, self.chunk_size, self.action_dim)
        return Decision(actions, u, self._action_log_prob(u, mean, std))

    def log_prob(self, features: torch.Tensor, record: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """``(B,)`` log-density of the action ``tanh(record)`` at ``temperature``."""
        u = self.check_record(features, record)
        mean, log_std = self.mean_and_log_std(features)
        return self._action_log_prob(u, mean, check_temperature(temperature) * log_std.exp())

    def unit_log_probs(self, features: torch.Tensor, record: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        """One unit per chunk entry, ``(B, H * A)``: the diagonal Gaussian and the elementwise
        ``tanh`` factorise, so each entry's log-density is its own term of :meth:`log_prob`."""
        u = self.check_record(features, record)
        mean, log_std = self.mean_and_log_std(features)
        return self._entry_log_probs(u, mean, check_temperature(temperature) * log_std.exp())

    def units_per_step(self) -> int:
        """``A``: one unit per action dimension."""
        return self.action_dim

    def greedy(self, features: torch.Tensor) -> torch.Tensor:
        """``tanh(mean)``, ``(B, H, A)``."""
        mean, _ = self.mean_and_log_std(features)
        return torch.tanh(mean).view(-1, self.chunk_size, self.action_dim)

    def bc_loss(self, features: torch.Tensor, target_chunks: torch.Tensor,
                generator: torch.Generator | None = None,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """Negative log-likelihood of the demonstrated actions (temperature 1), per chunk entry
        that counts.

        Targets are clamped to ``|a| <= 1 - BC_EDGE`` first (``atanh`` of a saturated demo
        action would ask for an infinite mean); ``generator`` is unused.
        """
        targets = self.check_targets(features, target_chunks).flatten(1)
        weights = self.step_weights(features, valid)
        u = torch.atanh(targets.clamp(-1.0 + self.BC_EDGE, 1.0 - self.BC_EDGE))
        mean, log_std = self.mean_and_log_std(features)
        nll = -self._entry_log_probs(u, mean, log_std.exp())
        return (nll * weights).sum() / weights.sum().clamp(min=1.0)

    def entropy(self, features: torch.Tensor, temperature: float = 1.0,
                generator: torch.Generator | None = None, samples: int = 16) -> torch.Tensor:
        """Entropy ``(B,)`` of the squashed chunk: ``H(a) = H(u) + E[log(1 - tanh(u)^2)]``.

        ``H(u)`` is exact, ``sum (log(T std) + 1/2 + log sqrt(2 pi))``; the expectation is a
        Monte-Carlo mean over ``samples`` draws of ``u`` per row (reparametrised, so it has
        gradients).
        """
        temperature = check_temperature(temperature)
        positive_int("samples", samples)
        mean, log_std = self.mean_and_log_std(features)
        log_std = log_std + math.log(temperature)
        gaussian = (log_std + 0.5 + LOG_SQRT_2PI).sum(dim=-1)
        noise = torch.randn((samples, *mean.shape), generator=generator, device=mean.device)
        u = mean + log_std.exp() * noise
        return gaussian + log1m_tanh_squared(u).sum(dim=-1).mean(dim=0)

    def unit_entropy(self, features: torch.Tensor, temperature: float = 1.0,
                     generator: torch.Generator | None = None, samples: int = 16) -> torch.Tensor:
        """:meth:`entropy` per chunk entry, ``(B, H * A)`` (the entries are independent)."""
        temperature = check_temperature(temperature)
        positive_int("samples", samples)
        mean, log_std = self.mean_and_log_std(features)
        log_std = log_std + math.log(temperature)
        noise = torch.randn((samples, *mean.shape), generator=generator, device=mean.device)
        u = mean + log_std.exp() * noise
        return log_std + 0.5 + LOG_SQRT_2PI + log1m_tanh_squared(u).mean(dim=0)


_HEADS: dict[str, type[ActionHead]] = {"tokens": TokenHead, "gaussian": GaussianHead,
                                       "flow": FlowHead}


def head_options(kind: str) -> tuple[str, ...]:
    """The keyword options the head ``kind`` takes (beyond the three sizes)."""
    parameters = inspect.signature(_HEADS[kind]).parameters.values()
    return tuple(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def make_head(kind: str, feature_dim: int, chunk_size: int, action_dim: int = 4,
              **options: object) -> ActionHead:
    """Build the action head ``kind`` names.

    Args:
        kind: One of :data:`HEAD_KINDS`: ``tokens`` (:class:`TokenHead`), ``gaussian``
            (:class:`GaussianHead`) or ``flow`` (:class:`~harness.policies.flow_head.FlowHead`).
        feature_dim: ``F``, width of the features the head reads.
        chunk_size: ``H``, actions per decision.
        action_dim: ``A``, dimensions of one action.
        **options: The head's keyword options (``num_bins``; ``state_dependent_std``,
            ``log_std_*``; ``steps``, ``hidden``, ``noise``, ``sigma_*``).

    Returns:
        A freshly initialised head.

    Raises:
        ValueError: An unknown kind or option (the choices named), or a bad size or option
            value (the value named).
    """
    if kind not in _HEADS:
        raise ValueError(f"action_head={kind!r}; choose one of {HEAD_KINDS}")
    unknown = sorted(set(options) - set(head_options(kind)))
    if unknown:
        raise ValueError(f"options {unknown} are unknown to the {kind!r} action head; it takes "
                         f"{head_options(kind)}")
    return _HEADS[kind](feature_dim, chunk_size, action_dim, **options)
