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
from abc import abstractmethod
from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from harness.policies.chunks import decision_log_prob, executed_token_mask
from harness.policies.layers import InstructionEncoder, InstructionKeypoints, SpatialSoftmax
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
    """A categorical policy over ``num_bins`` tokens per action dimension, plus a value head.

    Subclasses only encode observations into a ``(B, hidden)`` feature (:meth:`features`); the
    action head, value head and the sampling/log-probability surface live here. A decision is
    one chunk of ``chunk_size`` actions (one action by default); its record is its
    ``chunk_size * action_dim`` tokens.

    Args:
        config: The policy configuration.
        obs_shapes: Shape of one observation per key, without the batch dimension.
    """

    def __init__(self, config: TokenPolicyConfig, obs_shapes: ObsShapes) -> None:
        super().__init__()
        self.config = config
        self.obs_shapes = {k: tuple(int(d) for d in v) for k, v in obs_shapes.items()}
        self.action_head = nn.Linear(config.hidden, self.chunk_tokens * config.num_bins)
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
        """
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

        Raises:
            ValueError: ``temperature <= 0`` when sampling.
        """
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

    def log_prob(self, obs: Mapping[str, torch.Tensor], tokens: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
        """Per-token log-probabilities ``(B, chunk_size * action_dim)`` of the decisions
        ``tokens`` (same shape) under the categorical of ``logits / temperature`` (the one
        :meth:`act` samples from)."""
        log_probs = F.log_softmax(self.logits(obs) / temperature, dim=-1)
        return log_probs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)

    def executed_mask(self, executed: torch.Tensor) -> torch.Tensor:
        """Which entries of :meth:`log_prob` count for decisions that played ``executed``
        ``(B,)`` control steps: the tokens of those steps, ``(B, chunk_size * action_dim)``."""
        return executed_token_mask(executed, self.chunk_tokens, self.config.action_dim)

    def decision_log_prob(self, obs: Mapping[str, torch.Tensor], tokens: torch.Tensor,
                          executed: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """Log-probability ``(B,)`` of each decision: the sum over the tokens of the steps it
        played (:func:`harness.policies.chunks.decision_log_prob`)."""
        return decision_log_prob(self.log_prob(obs, tokens, temperature), executed,
                                 self.config.action_dim)

    def entropy(self, obs: Mapping[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
        """Entropy of each token's categorical at ``temperature``, ``(B, chunk_size *
        action_dim)``, in ``[0, log K]``."""
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


class MLPTokenPolicy(TokenPolicy):
    """Two-layer tanh MLP on ``state``, concatenated with the mean instruction embedding.

    With ``normalize_state``, ``state`` is first standardised by the buffers ``state_mean`` and
    ``state_std`` (identity until :meth:`fit_normalizer`). Positions in metres vary by
    centimetres between the states a push expert treats differently; unscaled, they barely move
    a tanh layer's pre-activations.
    """

    MIN_STD = 1e-2  # floor of a dimension's standard deviation (state units: m, rad, m/s)

    def __init__(self, config: TokenPolicyConfig, obs_shapes: ObsShapes) -> None:
        super().__init__(config, obs_shapes)
        self.use_instruction = config.use_instruction and "instruction" in obs_shapes
        in_dim = obs_shapes["state"][0]
        if self.use_instruction:
            self.instruction_encoder = InstructionEncoder(config.embed_dim)
            in_dim += config.embed_dim
        self.trunk = nn.Sequential(
            nn.Linear(in_dim, config.hidden),
            nn.Tanh(),
            nn.Linear(config.hidden, config.hidden),
            nn.Tanh(),
        )
        if config.normalize_state:
            state_dim = obs_shapes["state"][0]
            self.register_buffer("state_mean", torch.zeros(state_dim))
            self.register_buffer("state_std", torch.ones(state_dim))

    def fit_normalizer(self, obs: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """With ``normalize_state``: set ``state_mean`` and ``state_std`` (floored at
        ``MIN_STD``) from ``obs["state"]`` ``(N, state_dim)``."""
        if not self.config.normalize_state:
            return {}
        state = obs["state"].double()
        if len(state) < 2:
            raise ValueError(f"fit_normalizer needs at least 2 states, got {len(state)}")
        self.state_mean.copy_(state.mean(0).to(self.state_mean))
        self.state_std.copy_(state.std(0).clamp_min(self.MIN_STD).to(self.state_std))
        return {"bc/normalizer_states": float(len(state))}

    def features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``state`` (+ instruction) -> ``(B, hidden)``."""
        state = obs["state"].float()
        if self.config.normalize_state:
            state = (state - self.state_mean) / self.state_std
        parts = [state]
        if self.use_instruction:
            parts.append(self.instruction_encoder(obs["instruction"]))
        return self.trunk(torch.cat(parts, dim=-1))


class TinyVLA(TokenPolicy):
    """A tiny vision-language-action model.

    A small CNN encodes ``pixels`` into keypoints (spatial softmax, the default) or a pooled
    grid; the instruction is a mean of token embeddings; ``proprio`` goes through a linear layer.
    The three are concatenated and fused by an MLP into the shared feature read by the
    per-dimension token head. With ``instruction_keypoints`` = Q, Q keypoints chosen by the
    instruction (:class:`~harness.policies.layers.InstructionKeypoints`) are fused too.
    """

    def __init__(self, config: TokenPolicyConfig, obs_shapes: ObsShapes) -> None:
        super().__init__(config, obs_shapes)
        layers: list[nn.Module] = []
        in_channels = obs_shapes["pixels"][-1]
        keypoints = config.image_features == "spatial_softmax"
        last = len(config.conv_channels) - 1
        for i, out_channels in enumerate(config.conv_channels):
            kernel = 5 if i == 0 else 3
            stride = 1 if keypoints and i == last and i > 0 else 2
            layers.append(
                nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2)
            )
            if not (keypoints and i == last):  # keypoint logits stay signed
                layers.append(nn.ReLU())
            in_channels = out_channels
        if keypoints:
            layers.append(SpatialSoftmax())
            fused_dim = 2 * in_channels
        else:
            layers += [nn.AdaptiveAvgPool2d(config.pooled_size), nn.Flatten()]
            fused_dim = in_channels * config.pooled_size**2
        self.image_encoder = nn.Sequential(*layers)

        self.use_instruction = config.use_instruction and "instruction" in obs_shapes
        if self.use_instruction:
            self.instruction_encoder = InstructionEncoder(config.embed_dim)
            fused_dim += config.embed_dim
        self.instruction_keypoints = config.instruction_keypoints
        if self.instruction_keypoints:
            if not (keypoints and self.use_instruction):
                raise ValueError(
                    f"instruction_keypoints={self.instruction_keypoints} needs spatial_softmax "
                    f"features and an instruction (observation keys {sorted(obs_shapes)})")
            self.keypoint_chooser = InstructionKeypoints(config.embed_dim, in_channels,
                                                         self.instruction_keypoints)
            fused_dim += 2 * self.instruction_keypoints
        self.use_proprio = "proprio" in obs_shapes
        if self.use_proprio:
            self.proprio_encoder = nn.Sequential(
                nn.Linear(obs_shapes["proprio"][0], config.embed_dim), nn.Tanh()
            )
            fused_dim += config.embed_dim
        self.fusion = nn.Sequential(
            nn.Linear(fused_dim, config.hidden),
            nn.ReLU(),
            nn.Linear(config.hidden, config.hidden),
            nn.ReLU(),
        )

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 ``pixels`` ``(B, H, W, 3)`` -> image features ``(B, D)`` (keypoints or grid)."""
        if pixels.dtype != torch.uint8:
            raise TypeError(f"pixels must be uint8 (B, H, W, 3), got {pixels.dtype}")
        image = pixels.permute(0, 3, 1, 2).float() / 255.0  # (B, 3, H, W) in [0, 1]
        return self.image_encoder(image)

    def features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``pixels`` (+ instruction, proprio) -> ``(B, hidden)``.

        An ``image_features`` entry (from :meth:`encode_image`) is used instead of ``pixels``
        when present: a frozen encoder's output can be computed once and reused.
        """
        if "image_features" in obs:
            parts = [obs["image_features"]]
        else:
            parts = [self.encode_image(obs["pixels"])]
        if self.use_instruction:
            parts.append(self.instruction_encoder(obs["instruction"]))
            if self.instruction_keypoints:
                parts.append(self.keypoint_chooser(parts[0], parts[1]))
        if self.use_proprio:
            parts.append(self.proprio_encoder(obs["proprio"].float()))
        return self.fusion(torch.cat(parts, dim=-1))


_POLICIES: dict[str, type[TokenPolicy]] = {"mlp": MLPTokenPolicy, "tiny_vla": TinyVLA}
_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {"mlp": ("state",), "tiny_vla": ("pixels",)}


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
