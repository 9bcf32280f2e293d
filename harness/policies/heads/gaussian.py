"""The ``gaussian`` head: a diagonal Gaussian over the chunk, squashed into the box by ``tanh``.

Each chunk entry is one unit of the clipped ratio: the diagonal Gaussian and the elementwise
``tanh`` factorise, so the decision's log-density is a sum of per-entry terms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from harness.policies.heads.base import (
    LOG_SQRT_2PI,
    ActionHead,
    Decision,
    check_temperature,
    checked_bounds,
    gaussian_log_density,
    positive_int,
    scale_figures,
)


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
        learn_std: Train the std (by BC and RL); ``False`` keeps it where it is.

    Raises:
        ValueError: ``log_std_min <= log_std_init <= log_std_max`` does not hold.
    """

    @dataclass
    class Config:
        """``policy.head`` of ``gaussian``.

        Attributes:
            state_dependent_std: ``log std`` from a linear layer on the features instead of one
                learned value per chunk entry.
            log_std_init: Initial ``log std``.
            log_std_min: Lower clamp of ``log std``.
            log_std_max: Upper clamp of ``log std``.
            learn_std: Train the std (by BC and RL); ``False`` keeps it where it is (a fixed
                exploration noise, ``algo.exploration.fixed``).
        """

        state_dependent_std: bool = False
        log_std_init: float = -0.5
        log_std_min: float = -5.0
        log_std_max: float = 1.0
        learn_std: bool = True

        def __post_init__(self) -> None:
            values = (self.log_std_min, self.log_std_init, self.log_std_max)
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values) or not (
                    self.log_std_min <= self.log_std_init <= self.log_std_max):
                raise ValueError(f"log_std_min={self.log_std_min}, log_std_init="
                                 f"{self.log_std_init}, log_std_max={self.log_std_max}; need "
                                 "finite numbers with min <= init <= max")

    BC_EDGE = 1e-3  # demonstrated actions are clamped to |a| <= 1 - BC_EDGE before atanh
    greedy_rule = "actions = tanh(mean(f)), the squashed mean of the Gaussian over the chunk"

    def __init__(self, feature_dim: int, chunk_size: int, action_dim: int = 4, *,
                 state_dependent_std: bool = False, log_std_init: float = -0.5,
                 log_std_min: float = -5.0, log_std_max: float = 1.0,
                 learn_std: bool = True) -> None:
        super().__init__(feature_dim, chunk_size, action_dim)
        self.Config(state_dependent_std, log_std_init, log_std_min, log_std_max,
                    learn_std)  # checks
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
        if not learn_std:
            self._std_parameters().requires_grad_(False)

    def _std_parameters(self) -> nn.Module | nn.Parameter:
        return self.log_std_layer if self.state_dependent_std else self.log_std

    def exploration(self) -> dict[str, float]:
        """The std at temperature 1 (of the bias, with a state-dependent std)."""
        raw = self.log_std_layer.bias if self.state_dependent_std else self.log_std
        return scale_figures(raw.clamp(self.log_std_min, self.log_std_max).exp())

    def bound_noise(self, low: float | None, high: float | None,
                    fixed: float | None) -> dict[str, object]:
        """The std clamped to ``[low, high]``, or fixed at ``fixed`` and no longer trained
        (a state-dependent std then reads nothing from the state)."""
        now = (math.exp(self.log_std_min), math.exp(self.log_std_max))
        low, high = checked_bounds(low, high, fixed, now)
        self.log_std_min, self.log_std_max = math.log(low), math.log(high)
        options: dict[str, object] = {"log_std_min": self.log_std_min,
                                       "log_std_max": self.log_std_max}
        with torch.no_grad():
            raw = self.log_std_layer.bias if self.state_dependent_std else self.log_std
            options["log_std_init"] = min(max(float(raw.mean()), self.log_std_min),
                                          self.log_std_max)
            if fixed is not None:
                raw.fill_(self.log_std_min)
                if self.state_dependent_std:
                    self.log_std_layer.weight.zero_()
                self._std_parameters().requires_grad_(False)
                options["learn_std"] = False
        return options

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
