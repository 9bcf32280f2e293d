"""Action-token policies: each continuous action dimension becomes one categorical token.

Vision-language-action models (RT-2, OpenVLA) discretise every action dimension into ``K``
uniform bins and predict one token per dimension, so a policy-gradient step works on
log-probabilities of discrete tokens exactly as in language-model RL (PPO, GRPO). This module
does the same for the harness's action space ``Box(-1, 1, (action_dim,))``: bin centres are
``linspace(-1, 1, K)``, and a policy outputs ``(B, action_dim, K)`` logits. With an action chunk
(``chunk_size = H``, :mod:`harness.policies.chunks`) one decision scores ``H * action_dim``
tokens, step major, so the logits are ``(B, H * action_dim, K)``.

Observations are dicts of batched tensors with some of the keys ``state`` float ``(B, D)``,
``pixels`` uint8 ``(B, H, W, 3)``, ``proprio`` float ``(B, P)`` and ``instruction`` int64
``(B, L)`` token ids padded with :data:`tasks.language.PAD`. Use :func:`obs_to_batch` to turn
numpy observations from an environment into such a dict.
"""

from __future__ import annotations

import copy
import math
from abc import abstractmethod
from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from harness.policies.chunks import decision_log_prob, executed_token_mask
from harness.policies.head_base import ActionHead
from harness.policies.tokens import (  # noqa: F401  (KINDS, IMAGE_FEATURES: read from here too)
    IMAGE_FEATURES,
    KINDS,
    ObsShapes,
    TokenPolicyConfig,
    sample_tokens,
    tokens_to_actions,
)

# --- policies ---------------------------------------------------------------------------------


class TokenPolicy(nn.Module):
    """A policy over action chunks, plus a value head: categorical tokens per action dimension
    (``action_head="tokens"``, the default) or a continuous head.

    Subclasses only encode observations into a ``(B, hidden)`` feature (:meth:`features`); the
    action head, value head and the sampling/log-probability surface live here. A decision is
    one chunk of ``chunk_size`` actions (one action by default); its record is its
    ``chunk_size * action_dim`` tokens, or with a continuous head (``gaussian``, ``flow``:
    :attr:`head`, an :class:`~harness.policies.head_base.ActionHead`) the head's float record.

    The trainer reads a decision's log-probability as *units* (:meth:`log_prob`, ``(B, U)``)
    that :meth:`executed_mask` selects and the clipped ratio treats one by one: one per token,
    one per chunk entry for ``gaussian`` (the diagonal Gaussian factorises), and the whole
    denoising chain for ``flow`` (it does not; its unit counts whatever part of the chunk was
    played, since the chain as a whole was sampled).

    Args:
        config: The policy configuration.
        obs_shapes: Shape of one observation per key, without the batch dimension.
    """

    ENTROPY_SEED = 0  # the diagnostic entropy of the continuous heads draws from a fixed stream

    def __init__(self, config: TokenPolicyConfig, obs_shapes: ObsShapes) -> None:
        super().__init__()
        self.config = config
        self.obs_shapes = {k: tuple(int(d) for d in v) for k, v in obs_shapes.items()}
        self.head: ActionHead | None = None
        if config.action_head == "tokens":
            self.action_head = nn.Linear(config.hidden, self.chunk_tokens * config.num_bins)
        else:
            from harness.policies.action_heads import make_head

            options = ({"steps": config.flow_steps, "noise": config.flow_noise}
                       if config.action_head == "flow"
                       else {"state_dependent_std": config.state_dependent_std})
            self.head = make_head(config.action_head, config.hidden, config.chunk_size,
                                  config.action_dim, **options)
        # The critic baseline V(s0) is a separate small MLP on the shared features.
        self.value_head = nn.Sequential(
            nn.Linear(config.hidden, config.hidden), nn.Tanh(), nn.Linear(config.hidden, 1)
        )

    @abstractmethod
    def features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Batched observation dict -> ``(B, hidden)`` features."""

    def fit_normalizer(self, obs: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Fit the policy's input normalisation to a batch of observations (behaviour cloning
        calls this with its training steps); a policy without one ignores it.

        Returns:
            Figures for the log (empty when nothing was fitted).
        """
        return {}

    def logits(self, obs: Mapping[str, torch.Tensor],
               tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Unnormalised token scores, ``(B, chunk_size * action_dim, num_bins)``: row
        ``h * action_dim + d`` scores dimension ``d`` of the chunk's action ``h``.

        ``tokens`` ``(B, action_dim)`` are the earlier dimensions' tokens an autoregressive
        policy conditions each dimension on (teacher forcing, as BC trains it); these policies
        score every dimension from the observation alone and ignore them.

        Raises:
            TypeError: The policy has a continuous head (no token scores).
        """
        if self.head is not None:
            raise TypeError(f"policy.action_head={self.config.action_head!r} has no token "
                            "logits; this needs action_head='tokens'")
        flat = self.action_head(self.features(obs))
        return flat.view(-1, self.chunk_tokens, self.config.num_bins)

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Same as :meth:`logits`."""
        return self.logits(obs)

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, torch.Tensor],
        deterministic: bool = False,
        temperature: float = 1.0,
        uniforms: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Choose a decision, one token per action dimension of each action of the chunk,
        without gradients (for rollouts).

        Args:
            obs: Batched observation dict.
            deterministic: Take the most likely token instead of sampling.
            temperature: Divides the logits before sampling; on-policy RL computes its
                log-probabilities at the same temperature (:meth:`log_prob`).
            uniforms: ``(B, chunk_size * action_dim)`` numbers in ``[0, 1)``, one per token
                to sample: the
                token is the inverse CDF of its categorical at that number
                (:func:`sample_tokens`), so each row's draw depends only on its own numbers,
                whatever else shares the batch. ``None`` draws them from torch's generator.

        Returns:
            ``(tokens, actions)``: the decision records, int64 ``(B, chunk_size * action_dim)``,
            and their float32 bin centres in ``[-1, 1]`` as actions ``(B, chunk_size,
            action_dim)``, on the policy's device; the first ``execute_steps`` are played.

        With a continuous head the records are the head's float records ``(B, R)`` (zeros
        for greedy actions, which nothing scores) and ``uniforms`` ``(B, noise_width)`` become
        the head's standard normals by the inverse normal CDF.

        Raises:
            ValueError: ``temperature <= 0`` when sampling.
        """
        if self.head is not None:
            return self._act_continuous(obs, deterministic, temperature, uniforms)
        logits = self.logits(obs)
        if deterministic:
            tokens = logits.argmax(dim=-1)
        else:
            if temperature <= 0:
                raise ValueError(
                    f"temperature={temperature} must be > 0 when sampling; use deterministic=True"
                )
            tokens = sample_tokens(logits / temperature, uniforms)
        actions = tokens_to_actions(tokens, self.config.num_bins)
        return tokens, actions.view(len(tokens), self.config.chunk_size, self.config.action_dim)

    def _act_continuous(self, obs, deterministic, temperature, uniforms):
        features = self.features(obs)
        if deterministic:
            actions = self.head.greedy(features)
            return features.new_zeros((len(actions), self.head.record_dim)), actions
        if temperature <= 0:
            raise ValueError(
                f"temperature={temperature} must be > 0 when sampling; use deterministic=True")
        noise = None
        if uniforms is not None:  # inverse normal CDF; the clamp keeps u = 0 finite
            tiny = torch.finfo(torch.float32).eps
            noise = torch.special.ndtri(uniforms.double().clamp(tiny, 1.0 - tiny)).float()
        decision = self.head.sample(features, temperature, noise=noise)
        return decision.record, decision.actions

    def log_prob(self, obs: Mapping[str, torch.Tensor], tokens: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """Per-unit log-probabilities ``(B, U)`` of the decision records ``tokens``: for
        tokens, each token's ``(B, chunk_size * action_dim)`` under the categorical of ``logits
        / temperature`` (the one :meth:`act` samples from); for a continuous head, its
        :meth:`~harness.policies.head_base.ActionHead.unit_log_probs` at ``temperature``."""
        if self.head is not None:
            return self.head.unit_log_probs(self.features(obs), tokens, temperature)
        log_probs = F.log_softmax(self.logits(obs) / temperature, dim=-1)
        return log_probs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)

    def executed_mask(self, executed: torch.Tensor) -> torch.Tensor:
        """Which entries of :meth:`log_prob` count for decisions that played ``executed``
        ``(B,)`` control steps: the units of those steps, ``(B, U)`` (every unit of a head
        whose one unit is the whole decision)."""
        if self.head is not None and self.head.units_per_step() == 0:
            return torch.ones((len(executed), 1), dtype=torch.bool,
                              device=torch.as_tensor(executed).device)
        return executed_token_mask(executed, self.units_per_decision, self.config.action_dim)

    @property
    def continuous(self) -> bool:
        """Whether the actions come from a continuous head (float records, a head's BC loss)
        rather than tokens."""
        return self.head is not None

    @property
    def units_per_decision(self) -> int:
        """``U``: entries of :meth:`log_prob` per decision."""
        if self.head is None:
            return self.chunk_tokens
        per_step = self.head.units_per_step()
        return 1 if per_step == 0 else per_step * self.config.chunk_size

    def max_units(self, max_episode_steps: int) -> int:
        """Most units an attempt of ``max_episode_steps`` control steps can count (Dr. GRPO's
        constant ``T_max``)."""
        if self.head is not None and self.head.units_per_step() == 0:
            return math.ceil(max_episode_steps / self.config.steps_per_decision)
        return max_episode_steps * self.config.action_dim

    @property
    def noise_width(self) -> int:
        """Random numbers one sampled decision reads (the ``uniforms`` of :meth:`act`)."""
        return self.chunk_tokens if self.head is None else self.head.noise_dim

    def bc_loss(self, obs: Mapping[str, torch.Tensor], target_chunks: torch.Tensor,
                valid: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """A continuous head's behaviour-cloning loss of demonstrated chunks ``(B, H, A)``
        over the steps ``valid`` ``(B, H)`` marks (:meth:`~harness.policies.head_base.
        ActionHead.bc_loss`); token policies train by :func:`harness.bc.token_cross_entropy`.

        Raises:
            TypeError: A token policy.
        """
        if self.head is None:
            raise TypeError("bc_loss is the continuous heads' loss; token policies use "
                            "harness.bc.token_cross_entropy on their logits")
        return self.head.bc_loss(self.features(obs), target_chunks, generator, valid)

    def decision_log_prob(self, obs: Mapping[str, torch.Tensor], tokens: torch.Tensor,
                          executed: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """Log-probability ``(B,)`` of each decision: the sum over the tokens of the steps it
        played (:func:`harness.policies.chunks.decision_log_prob`)."""
        return decision_log_prob(self.log_prob(obs, tokens, temperature), executed,
                                 self.config.action_dim)

    def entropy(self, obs: Mapping[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
        """Entropy of each token's categorical at ``temperature``, ``(B, chunk_size *
        action_dim)``, in ``[0, log K]``; with a continuous head, its
        :meth:`~harness.policies.head_base.ActionHead.unit_entropy` ``(B, U)`` (Monte-Carlo
        parts drawn from a fixed seed, so the figure repeats)."""
        if self.head is not None:
            generator = torch.Generator(device=next(self.parameters()).device)
            generator.manual_seed(self.ENTROPY_SEED)
            return self.head.unit_entropy(self.features(obs), temperature, generator)
        log_probs = F.log_softmax(self.logits(obs) / temperature, dim=-1)
        return -(log_probs.exp() * log_probs).sum(dim=-1)

    def value(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Value estimate ``(B,)``, for a critic baseline on ``V(s0)``."""
        return self.value_head(self.features(obs)).squeeze(-1)

    @property
    def chunk_tokens(self) -> int:
        """Tokens per decision: ``chunk_size * action_dim``."""
        return self.config.chunk_size * self.config.action_dim

    @property
    def feature_dim(self) -> int:
        """Width of :meth:`features`."""
        return self.config.hidden

    def frozen_reference(self):
        """The policy as it is now, frozen: the KL reference of group fine-tuning. It answers
        ``log_prob``, ``state_dict`` and ``load_state_dict``; here a deep copy in eval mode
        (``hf_vla`` with LoRA returns itself with the adapters switched off instead)."""
        reference = copy.deepcopy(self).eval()
        for parameter in reference.parameters():
            parameter.requires_grad_(False)
        return reference


# Filled by the modules that define policies (harness.policies.encoders: mlp and tiny_vla;
# harness.policies.hf_vla), which the package imports.
_POLICIES: dict[str, type[TokenPolicy]] = {}
_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {}


def register_policy(kind: str, policy_class: type[TokenPolicy],
                    required_keys: tuple[str, ...]) -> None:
    """Make :func:`build_policy` build ``policy_class`` for ``kind`` (a module of this package
    that must not be imported from here, such as ``hf_vla``, registers itself)."""
    _POLICIES[kind] = policy_class
    _REQUIRED_KEYS[kind] = required_keys


def build_policy(config: TokenPolicyConfig, obs_shapes: ObsShapes) -> TokenPolicy:
    """Build the policy ``config.kind`` names for observations of the given shapes.

    Args:
        config: The policy configuration.
        obs_shapes: Shape of one observation per key, without the batch dimension.

    Returns:
        A freshly initialised :class:`TokenPolicy`.

    Raises:
        ValueError: The observations lack a key the policy needs, or a shape is malformed.
    """
    missing = [key for key in _REQUIRED_KEYS[config.kind] if key not in obs_shapes]
    if missing:
        raise ValueError(
            f"policy kind {config.kind!r} needs observation keys {missing}, but the observation"
            f" has only {sorted(obs_shapes)}"
        )
    for key in ("state", "proprio", "instruction"):
        if key in obs_shapes and len(obs_shapes[key]) != 1:
            raise ValueError(f"observation {key!r} must be 1-D, got shape {obs_shapes[key]}")
    if "pixels" in obs_shapes and (len(obs_shapes["pixels"]) != 3 or obs_shapes["pixels"][-1] != 3):
        raise ValueError(f"observation 'pixels' must be (H, W, 3), got {obs_shapes['pixels']}")
    return _POLICIES[config.kind](config, obs_shapes)
