"""The policy contract: all that the trainers, rollouts, behaviour cloning, evaluation and export
know of a policy (:class:`Policy`), and the facts of its decisions (:class:`PolicySpec`).

A *decision* is one policy call for one observation: a chunk of ``chunk_size`` actions, of which
``execute_steps`` are played before the next call. Its *record* (int64 tokens, or a head's
floats) is what :meth:`Policy.log_prob` scores again under changed weights, as *units* that the
clipped ratio treats one by one (a token, a Gaussian chunk entry, a whole flow chain);
:meth:`PolicySpec.executed_mask` says which units count for the steps a decision played.

Every kind (``mlp``, ``tiny_vla``, ``hf_vla``, ``smolvla``, a plugin's) meets :class:`Policy`
directly; nothing outside :mod:`harness.policies` asks a policy what it is.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from harness.objectives import max_ratio_units, ratio_unit_mask
from harness.policies.chunks import executed_token_mask
from harness.policies.heads.base import BCScores

Observations = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class PolicySpec:
    """What a policy's decisions look like.

    Attributes:
        kind: The registered kind (``mlp``, ``tiny_vla``, ...).
        head: The action head (``tokens``, ``gaussian``, ``flow`` or a plugin's).
        chunk_size: ``H``, actions one decision predicts.
        execute_steps: ``k <= H``, actions played per decision.
        action_dim: ``A``, dimensions of one action.
        units_per_step: Units of :meth:`Policy.log_prob` per control step of a chunk; 0 when
            one unit covers the whole decision.
        noise_width: Uniforms one sampled decision reads (the ``uniforms`` of
            :meth:`Policy.act`).
        feature_dim: Width of :meth:`Policy.features`.
        input_keys: The observation keys the policy reads, in the order an export takes them.
        rollout_mode: Where ``algo.rollout.mode=auto`` puts it: ``per_worker`` (a copy in each
            worker) or ``batched`` (one copy in the learner; models of several GB).
        single_file: :meth:`Policy.save` writes one file (``torch.save``); otherwise the policy
            lives in a model folder (:meth:`Policy.save_pretrained`), written beside each
            checkpoint.
        folder_format: The layout :meth:`Policy.save_pretrained` writes (``transformers``,
            ``lerobot``), or ``None`` for a kind without one.
        parts_per_element: ``P`` of :meth:`Policy.log_prob_parts`: terms per chunk element (a
            flow chain's start and denoising steps, ``K + 1``; else 1).
        part_width: ``W`` of :meth:`Policy.log_prob_parts` (``None``: ``action_dim``; SmolVLA's
            padded action columns).
    """

    kind: str
    head: str
    chunk_size: int
    execute_steps: int
    action_dim: int
    units_per_step: int
    noise_width: int
    feature_dim: int
    input_keys: tuple[str, ...]
    rollout_mode: str = "per_worker"
    single_file: bool = True
    folder_format: str | None = None
    parts_per_element: int = 1
    part_width: int | None = None

    @property
    def units_per_decision(self) -> int:
        """``U``: entries of :meth:`Policy.log_prob` per decision."""
        return 1 if self.units_per_step == 0 else self.units_per_step * self.chunk_size

    def executed_mask(self, executed: torch.Tensor) -> torch.Tensor:
        """Which units count for decisions that played ``executed`` ``(B,)`` control steps:
        ``(B, U)`` bool (every unit of a head whose one unit is the whole decision)."""
        executed = torch.as_tensor(executed)
        if self.units_per_step == 0:
            return torch.ones((len(executed), 1), dtype=torch.bool, device=executed.device)
        return executed_token_mask(executed, self.units_per_decision, self.units_per_step)

    def ratio_mask(self, executed: torch.Tensor, unit: str) -> torch.Tensor:
        """Which units of ``algo.ratio.unit`` count for decisions that played ``executed``
        ``(B,)`` control steps (:meth:`executed_mask` for ``native``)."""
        if unit == "native":
            return self.executed_mask(executed)
        return ratio_unit_mask(executed, unit, self.parts_per_element, self.chunk_size,
                               self.part_width or self.action_dim)

    def max_ratio_units(self, max_episode_steps: int, unit: str) -> int:
        """:meth:`max_units` for the units of ``algo.ratio.unit``."""
        if unit == "native":
            return self.max_units(max_episode_steps)
        return max_ratio_units(unit, max_episode_steps, self.execute_steps,
                               self.parts_per_element, self.part_width or self.action_dim)

    def max_units(self, max_episode_steps: int) -> int:
        """Most units an attempt of ``max_episode_steps`` control steps can count (Dr. GRPO's
        constant ``T_max``)."""
        if self.units_per_step == 0:
            return math.ceil(max_episode_steps / self.execute_steps)
        return max_episode_steps * self.units_per_step


def frozen_copy(module: torch.nn.Module) -> Any:
    """A deep copy of ``module`` in eval mode with every parameter frozen: the KL reference that
    most policies' :meth:`Policy.frozen_reference` returns."""
    reference = copy.deepcopy(module).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


class Reference(Protocol):
    """The frozen start policy of group fine-tuning (:meth:`Policy.frozen_reference`): it scores
    records and saves its weights."""

    def log_prob(self, obs: Observations, records: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor: ...

    def log_prob_parts(self, obs: Observations, records: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> Any: ...


@runtime_checkable
class Policy(Protocol):
    """What every policy kind provides (and ``torch.nn.Module``'s ``parameters``, ``buffers``,
    ``state_dict``, ``load_state_dict``, ``train``, ``eval``, ``to``).

    Observations are dicts of batched tensors (:func:`harness.policies.obs_to_batch`).
    """

    config: Any  # the kind's registered config dataclass
    spec: PolicySpec
    obs_shapes: dict[str, tuple[int, ...]]

    def act(self, obs: Observations, deterministic: bool = False, temperature: float = 1.0,
            uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One decision per row, without gradients: ``(records (B, R), actions (B, H, A))``.
        Sampled at ``temperature`` from the rows' own ``uniforms`` ``(B, noise_width)`` (torch's
        generator when ``None``), or the greedy chunk."""

    def log_prob(self, obs: Observations, records: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """Per-unit log-probabilities ``(B, U)`` of ``records`` at ``temperature``."""

    def log_prob_parts(self, obs: Observations, records: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
        """The decision's log-density as parts ``(B, P, H, W)`` that sum to it: ``P`` terms for
        each of the chunk's ``H`` entries and ``W`` action columns (one for a token or a
        Gaussian entry; the start and each denoising step of a flow chain). The ratio units of
        ``algo.ratio`` (:func:`harness.objectives.ratio_units`) are cut from them."""

    def exploration(self) -> dict[str, float]:
        """Figures of the head's exploration noise for the log (a Gaussian's std, a flow's
        noise scales: mean, min, max); empty for a head without learned noise."""

    def bound_exploration(self, low: float | None, high: float | None,
                          fixed: float | None) -> None:
        """Bound the head's noise scale to ``[low, high]`` (``None`` keeps a bound), or fix it
        at ``fixed`` and stop learning it (``algo.exploration``); a saved policy keeps them.

        Raises:
            ValueError: A head without a noise scale of its own, naming it.
        """

    def entropy(self, obs: Observations, temperature: float = 1.0) -> torch.Tensor:
        """Per-unit entropy ``(B, U)`` (Monte-Carlo parts from a fixed seed, so it repeats)."""

    def value(self, obs: Observations) -> torch.Tensor:
        """Value estimate ``(B,)`` (the critic baseline, vla_ppo's shared critic)."""

    def value_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters only :meth:`value` reads (its value head): what a critic's own
        learning rate and warm-up move."""

    def features(self, obs: Observations) -> torch.Tensor:
        """The shared feature ``(B, spec.feature_dim)`` the heads read."""

    def bc_loss(self, obs: Observations, target_chunks: torch.Tensor,
                valid: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Scalar behaviour-cloning loss of demonstrated chunks ``(B, H, A)`` over the steps
        ``valid`` ``(B, H)`` marks (``None``: all)."""

    def bc_scores(self, obs: Observations, target_chunks: torch.Tensor,
                  valid: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> BCScores:
        """A held-out batch's behaviour-cloning figures, as sums."""

    def fit_normalizer(self, obs: Observations) -> dict[str, float]:
        """Fit an input normalisation to demos (a policy without one ignores it)."""

    def frozen_reference(self) -> Reference:
        """The policy as it is now, frozen: the KL reference of group fine-tuning."""

    def freeze_encoder(self) -> None:
        """Stop training the image encoder (``algo.freeze_encoder``).

        Raises:
            ValueError: The policy has no image encoder of its own, naming its kind.
        """

    def encode_frozen(self, obs: Observations) -> dict[str, torch.Tensor]:
        """``obs`` with ``pixels`` replaced by the frozen encoder's ``image_features``, which
        every other method accepts in their place."""

    def save(self, path: str | Path) -> None:
        """Write the policy to one file that :func:`harness.policies.load_policy` reads
        (``spec.single_file``), crash-safe.

        Raises:
            TypeError: A policy that lives in a model folder instead.
        """

    def save_pretrained(self, folder: str | Path) -> Path | None:
        """Write the policy's model folder in ``spec.folder_format`` (transformers', LeRobot's),
        crash-safe; ``None`` for a kind without one."""

    def export_graph(self, keys: tuple[str, ...]) -> torch.nn.Module:
        """A module from the observation arrays ``keys`` (in order) to the greedy outputs
        :meth:`export_record` names, for ``torch.onnx.export``.

        Raises:
            TypeError: A kind that ONNX export does not cover, naming it.
        """

    def export_record(self) -> dict[str, Any]:
        """What an export record says of the actions: ``outputs``, sizes and the head's rule."""
