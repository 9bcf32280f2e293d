"""The ``flow`` head: flow matching over the chunk, sampled with injected Gaussian noise so that a
decision has an exact log-probability, and the Flow-Noise chain it shares with SmolVLA.

Behaviour cloning trains a vector field ``v(x, t, f)`` over the flattened chunk ``x`` (``D = H *
A`` entries) by conditional flow matching with linear interpolation, as pi0 / SmolVLA do, in
the convention ``x_t = t * a + (1 - t) * eps``: ``t = 0`` is noise ``eps ~ N(0, I)``, ``t = 1``
the demonstrated chunk ``a``, and the target velocity is ``a - eps``. Actions come from ``K``
Euler steps ``t_k = k / K``, ``dt = 1 / K``.

For RL, every Euler step gets Gaussian noise (πRL's Flow-Noise, Chen et al. 2025, arXiv
2510.25889; ReinFlow, Zhang et al. 2025, arXiv 2505.22094)::

    x_0     ~ N(0, T^2 I)
    x_{k+1} = mu_k + T * sigma_k * eps_k,   mu_k = x_k + d_k(x_k) / K,   eps_k ~ N(0, I)

where the *drift* ``d_k`` is the model's velocity in the direction of its own time (``+v`` here;
SmolVLA integrates from ``t = 1`` down to ``t = 0`` and its drift is ``-v``). Each step is
Gaussian given ``x_k``, so the chain ``x_0 .. x_K`` (the record, ``(K + 1) * D`` floats) has the
exact log-density::

    log p(chain) = log N(x_0; 0, T^2 I) + sum_k log N(x_{k+1}; mu_k, T^2 sigma_k^2 I)

:func:`sample_chain`, :func:`greedy_chain` and :func:`chain_log_density` are that chain, written
once: this head and :class:`~harness.policies.smolvla.policy.SmolVLAPolicy` call them with their
own drift and noise scales. Here ``sigma_k`` lies in ``[sigma_min, sigma_max]`` (a sigmoid of a
learned value per step and entry, or of a small noise network on ``(x_k, t_k, f)``), and ``T`` is
the sampling temperature: it scales all the noise, so ``T -> 0`` gives the deterministic ODE from
``x_0 = 0`` (:meth:`FlowHead.greedy`). The executed action is ``clip(x_K, -1, 1)``: clipping is
not differentiable and loses the density outside the box, so the log-probability is that of the
chain, which is what the ratio and the KL estimate of group fine-tuning need.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

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

NOISE_KINDS: tuple[str, ...] = ("learned", "network")
TIME_FREQUENCIES: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
MAX_STEPS = 100  # denoising steps (pi0 and SmolVLA use 10)
MAX_HIDDEN = 8192  # as policy.hidden (harness.policies.config.MAX_WIDTH)

# The drift ``d_k(x_k)`` and the noise scale ``sigma_k(x_k)`` of step ``k`` at temperature 1.
Drift = Callable[[torch.Tensor, int], torch.Tensor]


def sample_chain(drift: Drift, scale: Drift, draws: torch.Tensor,
                 temperature: float) -> torch.Tensor:
    """A Flow-Noise chain from its standard normals (see the module docstring).

    Args:
        drift: ``(x_k (B, D), k) -> d_k (B, D)``; the mean of step ``k`` is ``x_k + d_k / K``.
        scale: ``(x_k (B, D), k) -> sigma_k``, broadcastable to ``(B, D)``.
        draws: ``(B, K + 1, D)`` standard normals: ``x_0``'s, then one row per step.
        temperature: ``T`` > 0, scaling all the noise.

    Returns:
        The record ``x_0 .. x_K`` flattened, ``(B, (K + 1) * D)``.
    """
    steps = draws.shape[1] - 1
    x = temperature * draws[:, 0]
    chain = [x]
    for k in range(steps):
        mean = x + drift(x, k) / steps
        x = mean + temperature * scale(x, k) * draws[:, k + 1]
        chain.append(x)
    return torch.cat(chain, dim=-1)


def greedy_chain(drift: Drift, start: torch.Tensor, steps: int) -> torch.Tensor:
    """The noiseless chain from ``start`` (zeros: the ``T -> 0`` limit): ``x_K``, ``(B, D)``."""
    x = start
    for k in range(steps):
        x = x + drift(x, k) / steps
    return x


def chain_log_density_parts(chain: torch.Tensor, means: torch.Tensor, stds: torch.Tensor,
                            temperature: float) -> torch.Tensor:
    """The chain's log-density per element and term, ``(B, K + 1, D)``: row 0 is ``log N(x_0;
    0, T^2)``, row ``k + 1`` the ``k``-th step's ``log N(x_{k+1}; mu_k, T^2 sigma_k^2)``, for
    chains ``(B, K + 1, D)`` whose steps have means ``(B, K, D)`` and scales ``T * sigma_k``
    (``stds``, broadcastable to ``(B, K, D)``). Each step is a diagonal Gaussian given ``x_k``,
    so its density is the sum of its elements' terms."""
    x0 = chain[:, 0]
    start = gaussian_log_density(x0, torch.zeros_like(x0), x0.new_tensor(temperature))
    steps = gaussian_log_density(chain[:, 1:], means, stds)
    return torch.cat([start.unsqueeze(1), steps], dim=1)


def chain_log_density(chain: torch.Tensor, means: torch.Tensor, stds: torch.Tensor,
                      temperature: float) -> torch.Tensor:
    """``(B,)`` log-density of chains ``(B, K + 1, D)`` (see :func:`chain_log_density_parts`):
    the start's terms summed, plus every step's."""
    parts = chain_log_density_parts(chain, means, stds, temperature)
    return parts[:, 0].sum(dim=-1) + parts[:, 1:].reshape(len(parts), -1).sum(dim=-1)


def time_embedding(t: torch.Tensor) -> torch.Tensor:
    """``(N,)`` times in ``[0, 1]`` -> ``(N, 1 + 2 * len(TIME_FREQUENCIES))``: ``t`` and its
    sines and cosines at ``pi * frequency``."""
    angles = math.pi * t.unsqueeze(-1) * t.new_tensor(TIME_FREQUENCIES)
    return torch.cat([t.unsqueeze(-1), angles.sin(), angles.cos()], dim=-1)


def _mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden),
                         nn.SiLU(), nn.Linear(hidden, out_dim))


class FlowHead(ActionHead):
    """Flow matching over the chunk, sampled by ``steps`` noisy Euler steps (see the module).

    Args:
        feature_dim: ``F``.
        chunk_size: ``H``.
        action_dim: ``A``.
        steps: ``K``, denoising steps.
        hidden: Width of the vector field's (and the noise network's) hidden layers.
        noise: ``learned`` (one ``sigma`` per step and chunk entry, independent of the state)
            or ``network`` (``sigma`` from a small MLP on ``(x_k, t_k, f)``, as Flow-Noise).
        sigma_min: Smallest noise scale (> 0 keeps every step's density finite).
        sigma_max: Largest noise scale.
        sigma_init: Initial noise scale, everywhere.

    Raises:
        ValueError: An unknown ``noise`` (naming the choices), or ``0 < sigma_min < sigma_init
            < sigma_max`` does not hold.
    """

    @dataclass
    class Config:
        """``policy.head`` of ``flow``.

        Attributes:
            steps: ``K`` denoising steps, in ``[1, MAX_STEPS]``.
            hidden: Width of the vector field's (and noise network's) layers, in
                ``[1, MAX_HIDDEN]``.
            noise: ``learned`` (per step and entry) or ``network`` (an MLP on the step's
                input, as Flow-Noise).
            sigma_min: Smallest noise scale.
            sigma_max: Largest noise scale.
            sigma_init: Initial noise scale, everywhere.
            learn_noise: Train the noise scales by RL (BC never does); ``False`` keeps them
                where they are (``algo.exploration.fixed``).
        """

        steps: int = 4
        hidden: int = 128
        noise: str = "learned"
        sigma_min: float = 0.02
        sigma_max: float = 0.5
        sigma_init: float = 0.1
        learn_noise: bool = True

        def __post_init__(self) -> None:
            for name, top in (("steps", MAX_STEPS), ("hidden", MAX_HIDDEN)):
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                    raise ValueError(f"{name}={value!r}; need an int in [1, {top}]")
            if self.noise not in NOISE_KINDS:
                raise ValueError(f"noise={self.noise!r}; choose one of {NOISE_KINDS}")
            scales = (self.sigma_min, self.sigma_init, self.sigma_max)
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in scales) or not (
                    0.0 < self.sigma_min < self.sigma_init < self.sigma_max):
                raise ValueError(f"sigma_min={self.sigma_min}, sigma_init={self.sigma_init}, "
                                 f"sigma_max={self.sigma_max}; need 0 < min < init < max")

    greedy_rule = ("x_0 = 0; x_(k+1) = x_k + v(x_k, k / K, f) / K for k = 0 .. K-1 (K = flow "
                   "steps); actions = clip(x_K, -1, 1)")

    def __init__(self, feature_dim: int, chunk_size: int, action_dim: int = 4, *,
                 steps: int = 4, hidden: int = 128, noise: str = "learned",
                 sigma_min: float = 0.02, sigma_max: float = 0.5,
                 sigma_init: float = 0.1, learn_noise: bool = True) -> None:
        super().__init__(feature_dim, chunk_size, action_dim)
        self.Config(positive_int("steps", steps), positive_int("hidden", hidden), noise,
                    sigma_min, sigma_max, sigma_init, learn_noise)  # checks
        self.steps = steps
        self.noise, self.sigma_min, self.sigma_max = noise, float(sigma_min), float(sigma_max)
        self.record_dim = self.noise_dim = (self.steps + 1) * self.chunk_dim
        in_dim = self.chunk_dim + 1 + 2 * len(TIME_FREQUENCIES) + feature_dim
        self.velocity = _mlp(in_dim, hidden, self.chunk_dim)
        fraction = (sigma_init - sigma_min) / (sigma_max - sigma_min)
        noise_logit = math.log(fraction / (1.0 - fraction))
        if noise == "learned":
            self.noise_logit = nn.Parameter(torch.full((self.steps, self.chunk_dim), noise_logit))
        else:  # starts at sigma_init everywhere, whatever the input
            self.noise_network = nn.Sequential(nn.Linear(in_dim, hidden), nn.SiLU(),
                                               nn.Linear(hidden, self.chunk_dim))
            nn.init.zeros_(self.noise_network[-1].weight)
            nn.init.constant_(self.noise_network[-1].bias, noise_logit)
        if not learn_noise:
            self._noise_parameters().requires_grad_(False)

    def _noise_parameters(self) -> nn.Module | nn.Parameter:
        return self.noise_logit if self.noise == "learned" else self.noise_network

    def _scale(self, logit: torch.Tensor) -> torch.Tensor:
        return self.sigma_min + (self.sigma_max - self.sigma_min) * torch.sigmoid(logit)

    def exploration(self) -> dict[str, float]:
        """The noise scales at temperature 1 (of the noise network's bias, with
        ``noise="network"``)."""
        logit = self.noise_logit if self.noise == "learned" else self.noise_network[-1].bias
        return scale_figures(self._scale(logit))

    def bound_noise(self, low: float | None, high: float | None,
                    fixed: float | None) -> dict[str, object]:
        """The noise scales moved into ``[low, high]`` (each one inside already unchanged), or
        fixed at ``fixed`` and no longer trained.

        Raises:
            ValueError: Bounds on a ``noise="network"`` head (its scales depend on the state,
                so they cannot be kept), or ``low == high`` without ``fixed``.
        """
        if self.noise != "learned" and fixed is None:
            raise ValueError("algo.exploration.low/high keep a flow head's scales only with "
                             "noise=learned; use algo.exploration.fixed with noise=network")
        low, high = checked_bounds(low, high, fixed, (self.sigma_min, self.sigma_max))
        if fixed is not None:
            low, high = fixed / 2.0, fixed * 2.0
        elif low == high:
            raise ValueError(f"algo.exploration.low = high = {low}: to fix the noise scale "
                             "use algo.exploration.fixed")
        with torch.no_grad():
            if self.noise == "learned":
                target = (self._scale(self.noise_logit) if fixed is None
                          else torch.full_like(self.noise_logit, fixed))
            else:
                self.noise_network[-1].weight.zero_()
                target = torch.full_like(self.noise_network[-1].bias, fixed)
            fraction = ((target.clamp(low, high) - low) / (high - low)).clamp(1e-4, 1 - 1e-4)
            self.sigma_min, self.sigma_max = low, high
            logit = self.noise_logit if self.noise == "learned" else self.noise_network[-1].bias
            logit.copy_(torch.log(fraction) - torch.log1p(-fraction))
            init = float(self._scale(logit).mean().clamp(low + 1e-6 * (high - low),
                                                        high - 1e-6 * (high - low)))
        options: dict[str, object] = {"sigma_min": low, "sigma_max": high, "sigma_init": init}
        if fixed is not None:
            self._noise_parameters().requires_grad_(False)
            options["learn_noise"] = False
        return options

    # --- the pieces of one step ---------------------------------------------------------------

    def _inputs(self, x: torch.Tensor, t: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, time_embedding(t), features], dim=-1)

    def velocity_at(self, x: torch.Tensor, t: torch.Tensor,
                    features: torch.Tensor) -> torch.Tensor:
        """``v(x, t, f)``: ``(N, D)`` points, ``(N,)`` times, ``(N, F)`` features -> ``(N, D)``."""
        return self.velocity(self._inputs(x, t, features))

    def sigma_at(self, step: torch.Tensor, x: torch.Tensor,
                 features: torch.Tensor) -> torch.Tensor:
        """Noise scale ``(N, D)`` of the steps ``step`` ``(N,)`` (int) from points ``x`` at
        temperature 1."""
        if self.noise == "learned":
            logit = self.noise_logit[step]
        else:
            logit = self.noise_network(self._inputs(x, step / self.steps, features))
        return self._scale(logit)

    def _steps(self, rows: int, k: int, device: torch.device) -> torch.Tensor:
        return torch.full((rows,), k, dtype=torch.long, device=device)

    def _to_actions(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-1.0, 1.0).view(-1, self.chunk_size, self.action_dim)

    # --- the head -----------------------------------------------------------------------------

    @torch.no_grad()
    def sample(self, features: torch.Tensor, temperature: float = 1.0,
               generator: torch.Generator | None = None,
               noise: torch.Tensor | None = None) -> Decision:
        """A noisy chain ``x_0 .. x_K``, its log-density and the actions ``clip(x_K, -1, 1)``.

        The standard normals of the chain come from ``noise`` ``(B, (K + 1) * D)`` (the
        first ``D`` for ``x_0``, then ``D`` per step) or else from ``generator`` (on the
        features' device).

        The log-density is :meth:`log_prob` of the recorded chain (one more batched pass), so
        that a ratio recomputed on the same batch is exactly 1.
        """
        temperature = check_temperature(temperature)
        features = self.check_features(features)
        rows, dim, device = features.shape[0], self.chunk_dim, features.device
        if noise is None:
            noise = torch.randn((rows, self.noise_dim), generator=generator, device=device)
        else:
            noise = self.check_noise(features, noise)
        draws = noise.view(rows, self.steps + 1, dim)

        def drift(x: torch.Tensor, k: int) -> torch.Tensor:
            return self.velocity_at(x, self._steps(rows, k, device) / self.steps, features)

        def scale(x: torch.Tensor, k: int) -> torch.Tensor:
            return self.sigma_at(self._steps(rows, k, device), x, features)

        record = sample_chain(drift, scale, draws, temperature)
        x = record[:, -dim:]
        return Decision(self._to_actions(x), record, self.log_prob(features, record, temperature))

    @property
    def parts_per_element(self) -> int:
        """``K + 1``: the start ``x_0`` and each denoising step."""
        return self.steps + 1

    def log_prob(self, features: torch.Tensor, record: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """``(B,)`` log-density of the chain ``record`` at ``temperature``; all ``K`` steps are
        scored in one batched pass of the networks."""
        chain, means, stds, temperature = self._chain_terms(features, record, temperature)
        return chain_log_density(chain, means, stds, temperature)

    def log_prob_parts(self, features: torch.Tensor, record: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        """The chain's terms per element, ``(B, K + 1, H, A)`` (:func:`chain_log_density_parts`)."""
        parts = chain_log_density_parts(*self._chain_terms(features, record, temperature))
        return parts.view(-1, self.steps + 1, self.chunk_size, self.action_dim)

    def _chain_terms(self, features: torch.Tensor, record: torch.Tensor, temperature: float):
        """The recorded chain ``(B, K + 1, D)``, its steps' means and scales ``(B, K, D)`` and
        the checked temperature."""
        temperature = check_temperature(temperature)
        features = self.check_features(features)
        chain = self.check_record(features, record).view(-1, self.steps + 1, self.chunk_dim)
        rows = chain.shape[0]
        before = chain[:, :-1].flatten(0, 1)  # (B * K, D)
        step = torch.arange(self.steps, device=chain.device).repeat(rows)
        repeated = features.repeat_interleave(self.steps, dim=0)
        mean = before + self.velocity_at(before, step / self.steps, repeated) / self.steps
        std = temperature * self.sigma_at(step, before, repeated)
        shape = (rows, self.steps, self.chunk_dim)
        return chain, mean.view(shape), std.view(shape), temperature

    def greedy(self, features: torch.Tensor) -> torch.Tensor:
        """The noiseless Euler ODE from ``x_0 = 0``: ``clip(x_K, -1, 1)``, ``(B, H, A)``."""
        features = self.check_features(features)
        rows = features.shape[0]

        def drift(x: torch.Tensor, k: int) -> torch.Tensor:
            return self.velocity_at(x, features.new_full((rows,), k / self.steps), features)

        start = features.new_zeros((rows, self.chunk_dim))
        return self._to_actions(greedy_chain(drift, start, self.steps))

    def bc_loss(self, features: torch.Tensor, target_chunks: torch.Tensor,
                generator: torch.Generator | None = None,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """Conditional flow matching: ``mean |v(x_t, t, f) - (a - eps)|^2`` over rows and the
        chunk entries that count, with ``t ~ U(0, 1)``, ``eps ~ N(0, I)`` from ``generator``
        and ``x_t = t * a + (1 - t) * eps``. The noise scales are not trained by it (RL moves
        them)."""
        targets = self.check_targets(features, target_chunks).flatten(1)
        features = self.check_features(features)
        weights = self.step_weights(features, valid)
        t = torch.rand((targets.shape[0],), generator=generator, device=targets.device)
        eps = torch.randn(targets.shape, generator=generator, device=targets.device)
        x_t = t.unsqueeze(-1) * targets + (1.0 - t.unsqueeze(-1)) * eps
        errors = (self.velocity_at(x_t, t, features) - (targets - eps)).pow(2)
        return (errors * weights).sum() / weights.sum().clamp(min=1.0)

    def entropy(self, features: torch.Tensor, temperature: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Entropy ``(B,)`` of the denoising chain (the distribution the ratio scores), not of
        the final action alone, which has no closed form: ``H(x_0) + sum_k E[H(x_{k+1} |
        x_k)]``, each a Gaussian entropy ``sum (log(T sigma) + 1/2 + log sqrt(2 pi))``.

        Exact with ``noise="learned"``; with ``noise="network"`` ``sigma_k`` depends on ``x_k``,
        so the expectation is a one-chain Monte-Carlo estimate per row (chain drawn from
        ``generator``).
        """
        temperature = check_temperature(temperature)
        features = self.check_features(features)
        rows, device = features.shape[0], features.device
        per_entry = 0.5 + LOG_SQRT_2PI + math.log(temperature)
        total = features.new_full((rows,), per_entry * self.chunk_dim)  # x_0
        if self.noise == "learned":
            chain = features.new_zeros((rows, self.record_dim))  # sigma ignores the states
        else:
            chain = self.sample(features, temperature, generator).record
        before = chain.view(rows, self.steps + 1, self.chunk_dim)[:, :-1].flatten(0, 1)
        step = torch.arange(self.steps, device=device).repeat(rows)
        sigma = self.sigma_at(step, before, features.repeat_interleave(self.steps, dim=0))
        return total + (sigma.log() + per_entry).view(rows, -1).sum(dim=-1)
