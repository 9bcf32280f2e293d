"""The contract every action head meets: features ``(B, F)`` -> a distribution over a chunk of
``H`` actions ``(B, H, A)`` in the box ``[-1, 1]^A``.

A decision is one chunk. Its *record* ``(B, R)`` is everything needed to score the same
decision again under changed weights: the clipped ratio ``exp(log_prob - old_log_prob)`` of
group fine-tuning and the k3 KL to a frozen reference (:func:`harness.objectives.kl_k3`) both
read log-probabilities of records, so they work unchanged whichever head made them. A head's
log-density is split into *units* (:meth:`ActionHead.unit_log_probs`) that the trainer clips one
by one: one per token, one per chunk entry of a Gaussian, the whole chain of a flow.

Each head class carries its options as a dataclass, ``Config`` (checked when the run's config
is loaded, before anything is built), and is registered once under a name
(:func:`harness.policies.register_head`): the built-in ``tokens``
(:mod:`~harness.policies.heads.tokens`), ``gaussian`` (:mod:`~harness.policies.heads.gaussian`)
and ``flow`` (:mod:`~harness.policies.heads.flow`), or a user's own from a plugin module.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class Decision(NamedTuple):
    """One sampled chunk per row.

    Attributes:
        actions: ``(B, H, A)`` float in ``[-1, 1]``: what the environment executes.
        record: ``(B, R)``: what :meth:`ActionHead.log_prob` scores (int64 tokens, or floats).
        log_prob: ``(B,)`` log-density of the decision at the temperature it was sampled at.
    """

    actions: torch.Tensor
    record: torch.Tensor
    log_prob: torch.Tensor


class BCScores(NamedTuple):
    """A batch's held-out behaviour-cloning figures, as sums (a validation adds the batches).

    Attributes:
        loss_sum: The training loss times ``count``.
        correct: Entries predicted exactly (tokens); NaN for a continuous head.
        error_sum: Absolute error of the greedy actions, summed over the entries that count.
        count: Entries that count (action dimensions of the chunk slots inside the episode).
    """

    loss_sum: float
    correct: float
    error_sum: float
    count: float


def gaussian_log_density(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise ``log N(x; mean, std^2)``, broadcast over the three arguments."""
    return -0.5 * ((x - mean) / std) ** 2 - std.log() - LOG_SQRT_2PI


def uniforms_to_normals(uniforms: torch.Tensor) -> torch.Tensor:
    """Standard normals from uniforms in ``[0, 1)`` by the inverse normal CDF (in float64, then
    float32); the clamp to ``[eps, 1 - eps]`` keeps ``u = 0`` finite. The rollouts hand every
    policy uniforms, so a row's draw depends on its own numbers only; this is how the continuous
    heads (and SmolVLA's chain) read them."""
    tiny = torch.finfo(torch.float32).eps
    return torch.special.ndtri(uniforms.double().clamp(tiny, 1.0 - tiny)).float()


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an int >= 1 (not a bool).

    Raises:
        ValueError: Naming ``name`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}; need a positive int")
    return value


def check_temperature(temperature: float) -> float:
    """``temperature`` as a float if it is > 0 (finite).

    Raises:
        ValueError: ``temperature <= 0`` or not finite; greedy actions come from ``greedy``.
    """
    temperature = float(temperature)
    if not (0.0 < temperature < math.inf):
        raise ValueError(f"temperature={temperature}; need a finite value > 0 (the "
                         "deterministic limit is greedy())")
    return temperature


def continuous_bc_scores(loss: torch.Tensor, greedy: torch.Tensor, targets: torch.Tensor,
                         steps: torch.Tensor) -> BCScores:
    """:class:`BCScores` of a continuous head's batch: its loss over ``steps`` ``(B, H)`` (the
    slots that count) and the greedy chunk's error against the targets ``(B, H, A)``."""
    entries = steps.sum().item() * targets.shape[-1]
    error = ((greedy - targets).abs() * steps.unsqueeze(-1)).sum().item()
    return BCScores(loss.item() * entries, math.nan, error, entries)


def scale_figures(scales: torch.Tensor) -> dict[str, float]:
    """``std_mean``, ``std_min`` and ``std_max`` of a head's noise scales, for the log."""
    scales = scales.detach().float()
    return {"std_mean": float(scales.mean()), "std_min": float(scales.min()),
            "std_max": float(scales.max())}


def checked_bounds(low: float | None, high: float | None, fixed: float | None,
                   now: tuple[float, float]) -> tuple[float, float]:
    """The noise bounds ``algo.exploration`` asks for: ``(fixed, fixed)``, or ``low`` and
    ``high`` with ``None`` keeping the bound ``now`` has.

    Raises:
        ValueError: A bound that is not a positive finite number, or ``low > high``.
    """
    if fixed is not None:
        low = high = fixed
    low = now[0] if low is None else low
    high = now[1] if high is None else high
    for name, value in (("low", low), ("high", high)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"noise bound {name}={value!r}; need a positive finite number")
    if low > high:
        raise ValueError(f"noise bounds low={low} > high={high}")
    return float(low), float(high)


class ActionHead(nn.Module, ABC):
    """Features ``(B, F)`` -> a distribution over action chunks ``(B, H, A)`` in ``[-1, 1]^A``.

    Subclasses set :attr:`record_dim` and :attr:`noise_dim`, implement the five abstract methods
    and declare their options as the dataclass ``Config`` (whose fields are their keyword-only
    arguments); the shape checks are shared here. The default unit is the whole decision; a head
    whose log-density factorises overrides :meth:`unit_log_probs`, :meth:`unit_entropy` and
    :meth:`units_per_step`.

    Args:
        feature_dim: ``F``, width of the features.
        chunk_size: ``H``, actions per decision.
        action_dim: ``A``, dimensions of one action.

    Raises:
        ValueError: A size that is not a positive int, naming it.
    """

    Config: ClassVar[type]  # the head's options (set by each head, or derived at registration)
    # The outputs of an exported graph (harness.export) and what its record says of them.
    export_outputs: ClassVar[tuple[str, ...]] = ("actions",)
    greedy_rule: ClassVar[str] = "the head's greedy chunk, clipped to [-1, 1]"
    record_dim: int
    noise_dim: int  # standard-normal (or uniform, for tokens) numbers one decision draws

    def __init__(self, feature_dim: int, chunk_size: int, action_dim: int) -> None:
        super().__init__()
        self.feature_dim = positive_int("feature_dim", feature_dim)
        self.chunk_size = positive_int("chunk_size", chunk_size)
        self.action_dim = positive_int("action_dim", action_dim)

    @property
    def chunk_dim(self) -> int:
        """``H * A``: one flattened chunk."""
        return self.chunk_size * self.action_dim

    @abstractmethod
    def sample(self, features: torch.Tensor, temperature: float = 1.0,
               generator: torch.Generator | None = None,
               noise: torch.Tensor | None = None) -> Decision:
        """Draw one chunk per row (no gradients): actions, record and their log-density.

        ``noise`` ``(B, noise_dim)`` gives each row's random numbers (standard normals for the
        continuous heads, uniforms in ``[0, 1)`` for tokens) instead of ``generator``: a row's
        draw then depends on its own numbers only, whatever else shares the batch."""

    @abstractmethod
    def log_prob(self, features: torch.Tensor, record: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """``(B,)`` log-density of ``record`` ``(B, R)`` at ``temperature``, differentiable
        w.r.t. the head's parameters and ``features``."""

    @abstractmethod
    def greedy(self, features: torch.Tensor) -> torch.Tensor:
        """``(B, H, A)`` deterministic actions, the ``temperature -> 0`` limit of sampling."""

    @abstractmethod
    def bc_loss(self, features: torch.Tensor, target_chunks: torch.Tensor,
                generator: torch.Generator | None = None,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """Scalar behaviour-cloning loss of demonstrated chunks ``(B, H, A)``, averaged over
        rows and chunk entries, or over the steps ``valid`` ``(B, H)`` marks (a chunk's slots
        past the end of its episode do not count)."""

    @abstractmethod
    def entropy(self, features: torch.Tensor, temperature: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """``(B,)`` entropy of a decision (exact or an estimate, as each head documents)."""

    # --- what the policies call; defaults for a head whose one unit is the decision ---------

    def unit_log_probs(self, features: torch.Tensor, record: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        """The decision's log-density split into the units a trainer clips one by one,
        ``(B, U)``, summing to :meth:`log_prob`; one unit (the whole decision) unless a head
        factorises."""
        return self.log_prob(features, record, temperature).unsqueeze(-1)

    def unit_entropy(self, features: torch.Tensor, temperature: float = 1.0,
                     generator: torch.Generator | None = None) -> torch.Tensor:
        """:meth:`entropy` split as :meth:`unit_log_probs` is, ``(B, U)``."""
        return self.entropy(features, temperature, generator).unsqueeze(-1)

    def units_per_step(self) -> int:
        """Units of :meth:`unit_log_probs` per control step of the chunk; 0 when one unit
        covers the whole decision."""
        return 0

    @property
    def parts_per_element(self) -> int:
        """``P``: log-probability parts of one chunk element (:meth:`log_prob_parts`)."""
        return 1

    def log_prob_parts(self, features: torch.Tensor, record: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        """The decision's log-density as parts ``(B, P, H, A)`` that sum to :meth:`log_prob`:
        ``P`` terms for each chunk element (the ratio units of
        :func:`harness.objectives.ratio_units` are cut from them). A head whose units are its
        elements (``units_per_step() == A``) has one part per element, its unit.

        Raises:
            NotImplementedError: A head with one unit per decision that does not say how its
                log-density splits over the chunk's elements.
        """
        if self.units_per_step() != self.action_dim:
            raise NotImplementedError(
                f"{type(self).__name__} scores a decision as one unit and does not split it "
                "over the chunk's elements; use algo.ratio.unit=native with it")
        units = self.unit_log_probs(features, record, temperature)
        return units.view(-1, 1, self.chunk_size, self.action_dim)

    def exploration(self) -> dict[str, float]:
        """Figures of the head's learned exploration noise for the log (``std_mean``,
        ``std_min``, ``std_max`` of a Gaussian's std or a flow's noise scales); none here."""
        return {}

    def bound_noise(self, low: float | None, high: float | None,
                    fixed: float | None) -> dict[str, Any]:
        """Bound the head's noise scale to ``[low, high]`` (``None``: keep that bound), or fix
        it at ``fixed`` and stop learning it, keeping every scale already inside the bounds
        (``algo.exploration``); returns the head options that rebuild it so.

        Raises:
            ValueError: A head without a noise scale of its own (the tokens head explores by
                ``algo.temperature``).
        """
        raise ValueError(f"algo.exploration bounds the noise scale of the gaussian and flow "
                         f"heads; {type(self).__name__} has none (a tokens head explores by "
                         "algo.temperature)")

    def noise_from_uniforms(self, uniforms: torch.Tensor) -> torch.Tensor:
        """The ``noise`` of :meth:`sample` from ``(B, noise_dim)`` uniforms in ``[0, 1)``: standard
        normals (:func:`uniforms_to_normals`); the tokens head reads the uniforms themselves."""
        return uniforms_to_normals(uniforms)

    def greedy_decision(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(record, actions)`` of the greedy chunk: zeros for a record (nothing scores a
        greedy decision) and :meth:`greedy`."""
        actions = self.greedy(features)
        return features.new_zeros((len(actions), self.record_dim)), actions

    def bc_scores(self, features: torch.Tensor, target_chunks: torch.Tensor,
                  valid: torch.Tensor | None, generator: torch.Generator | None) -> BCScores:
        """A held-out batch's :class:`BCScores`: the loss over the slots that count and the
        error of the greedy chunk."""
        steps = (torch.ones(target_chunks.shape[:2], dtype=torch.bool,
                            device=target_chunks.device) if valid is None else valid)
        loss = self.bc_loss(features, target_chunks, generator, steps)
        return continuous_bc_scores(loss, self.greedy(features), target_chunks, steps)

    def export_graph(self, features: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The exported graph's outputs (named :attr:`export_outputs`) from the features: the
        greedy chunk ``(B, H, A)``."""
        return (self.greedy(features),)

    def export_record(self) -> dict[str, object]:
        """What an export record says of the actions beyond their sizes (the greedy rule)."""
        return {"greedy_rule": self.greedy_rule}

    # --- shared checks ------------------------------------------------------------------------

    def check_features(self, features: torch.Tensor) -> torch.Tensor:
        """``features`` as float, if they are ``(B, feature_dim)``.

        Raises:
            ValueError: Another shape, naming it and the expected one.
        """
        if features.dim() != 2 or features.shape[1] != self.feature_dim:
            raise ValueError(f"features of shape {tuple(features.shape)}; expected "
                             f"(B, {self.feature_dim})")
        return features.float()

    def check_record(self, features: torch.Tensor, record: torch.Tensor) -> torch.Tensor:
        """``record`` as float, if it is ``(B, record_dim)`` with the features' ``B``.

        Raises:
            ValueError: Another shape, naming it and the expected one.
        """
        expected = (features.shape[0], self.record_dim)
        if tuple(record.shape) != expected:
            raise ValueError(f"record of shape {tuple(record.shape)}; expected {expected} "
                             f"for {type(self).__name__} and {features.shape[0]} feature rows")
        return record.float()

    def check_noise(self, features: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """``noise`` as float, if it is ``(B, noise_dim)`` with the features' ``B``.

        Raises:
            ValueError: Another shape, naming it and the expected one.
        """
        expected = (features.shape[0], self.noise_dim)
        if tuple(noise.shape) != expected:
            raise ValueError(f"noise of shape {tuple(noise.shape)}; expected {expected} for "
                             f"{type(self).__name__}")
        return noise.to(device=features.device, dtype=torch.float32)

    def step_weights(self, features: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """``(B, H * A)`` float weights of the chunk entries from a ``(B, H)`` step mask (all
        ones for ``None``).

        Raises:
            ValueError: ``valid`` of another shape.
        """
        rows = features.shape[0]
        if valid is None:
            return features.new_ones((rows, self.chunk_dim))
        if tuple(valid.shape) != (rows, self.chunk_size):
            raise ValueError(f"valid of shape {tuple(valid.shape)}; expected "
                             f"{(rows, self.chunk_size)}")
        return valid.to(features.device, torch.float32).repeat_interleave(self.action_dim, 1)

    def check_targets(self, features: torch.Tensor, target_chunks: torch.Tensor) -> torch.Tensor:
        """``target_chunks`` as float, if they are ``(B, H, A)`` inside ``[-1, 1]``.

        Raises:
            ValueError: Another shape, or values outside the box (the largest named).
        """
        expected = (features.shape[0], self.chunk_size, self.action_dim)
        if tuple(target_chunks.shape) != expected:
            raise ValueError(f"target_chunks of shape {tuple(target_chunks.shape)}; expected "
                             f"{expected}")
        target_chunks = target_chunks.float()
        largest = float(target_chunks.abs().max()) if target_chunks.numel() else 0.0
        if not largest <= 1.0:
            raise ValueError(f"target_chunks reach |a|={largest}; actions live in [-1, 1]")
        return target_chunks
