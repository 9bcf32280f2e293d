"""The contract every action head meets: features ``(B, F)`` -> a distribution over a chunk of
``H`` actions ``(B, H, A)`` in the box ``[-1, 1]^A``.

A decision is one chunk. Its *record* ``(B, R)`` is everything needed to score the same
decision again under changed weights: the clipped ratio ``exp(log_prob - old_log_prob)`` of
group fine-tuning and the k3 KL to a frozen reference (:func:`harness.objectives.kl_k3`) both
read per-decision log-probabilities of records, so they work unchanged whichever head made them.
The heads themselves live in :mod:`harness.policies.action_heads` and
:mod:`harness.policies.flow_head`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import NamedTuple

import torch
from torch import nn

LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class Decision(NamedTuple):
    """One sampled chunk per row.

    Attributes:
        actions: ``(B, H, A)`` float in ``[-1, 1]``: what the environment executes.
        record: ``(B, R)`` float: what :meth:`ActionHead.log_prob` scores.
        log_prob: ``(B,)`` log-density of the decision at the temperature it was sampled at.
    """

    actions: torch.Tensor
    record: torch.Tensor
    log_prob: torch.Tensor


def gaussian_log_density(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise ``log N(x; mean, std^2)``, broadcast over the three arguments."""
    return -0.5 * ((x - mean) / std) ** 2 - std.log() - LOG_SQRT_2PI


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


class ActionHead(nn.Module, ABC):
    """Features ``(B, F)`` -> a distribution over action chunks ``(B, H, A)`` in ``[-1, 1]^A``.

    Subclasses set :attr:`record_dim` and implement the five methods below; the shape checks
    are shared here.

    Args:
        feature_dim: ``F``, width of the features.
        chunk_size: ``H``, actions per decision.
        action_dim: ``A``, dimensions of one action.

    Raises:
        ValueError: A size that is not a positive int, naming it.
    """

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
