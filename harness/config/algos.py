"""The ``algo`` group: one schema per family, SB3's on-policy baselines and the group trainer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from harness.config.errors import check
from harness.objectives import AGGREGATIONS

SB3_ALGOS: tuple[str, ...] = ("ppo", "a2c", "trpo")
GROUP_ALGOS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo", "critic", "reinforce")
ZERO_SIGNAL: tuple[str, ...] = ("keep", "drop", "resample")


@dataclass
class AlgoConfig:
    """Base of the ``algo`` group; ``name`` picks the trainer in ``harness.trainers.TRAINERS``."""

    name: str = MISSING

    @property
    def family(self) -> str:
        """``"sb3"`` or ``"group"``."""
        return "sb3" if self.name in SB3_ALGOS else "group"

    def __post_init__(self) -> None:
        known = SB3_ALGOS + GROUP_ALGOS
        check(self.name in known, f"algo.name={self.name!r} is unknown; choose one of {known}")


@dataclass
class SB3AlgoConfig(AlgoConfig):
    """Hyper-parameters shared by SB3's on-policy algorithms (passed to them as they are).

    Attributes:
        learning_rate: Adam (RMSprop for A2C) step size.
        n_steps: Steps per environment per rollout.
        gamma: Discount factor.
        gae_lambda: GAE lambda.
        normalize_advantage: Standardise advantages per batch.
        use_sde: State-dependent exploration.
        log_interval: Rollouts between SB3 log dumps; 0 picks about one dump per 2048 steps.
    """

    learning_rate: float = 3e-4
    n_steps: int = 2048
    gamma: float = 0.99
    gae_lambda: float = 0.95
    normalize_advantage: bool = True
    use_sde: bool = False
    log_interval: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.learning_rate > 0, f"algo.learning_rate={self.learning_rate}; must be > 0")
        check(self.n_steps >= 1, f"algo.n_steps={self.n_steps}; must be >= 1")
        check(0 < self.gamma <= 1, f"algo.gamma={self.gamma}; must be in (0, 1]")
        check(0 <= self.gae_lambda <= 1, f"algo.gae_lambda={self.gae_lambda}; must be in [0, 1]")
        check(self.log_interval >= 0, f"algo.log_interval={self.log_interval}; must be >= 0")

    def sb3_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the SB3 algorithm's constructor."""
        kwargs = dataclasses.asdict(self)
        for key in ("name", "log_interval"):
            del kwargs[key]
        return kwargs


@dataclass
class PPOConfig(SB3AlgoConfig):
    """``stable_baselines3.PPO`` (Schulman et al. 2017)."""

    name: str = "ppo"
    batch_size: int = 64
    n_epochs: int = 10
    clip_range: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.batch_size >= 2, f"algo.batch_size={self.batch_size}; must be >= 2")
        check(self.n_epochs >= 1, f"algo.n_epochs={self.n_epochs}; must be >= 1")
        check(self.clip_range > 0, f"algo.clip_range={self.clip_range}; must be > 0")


@dataclass
class A2CConfig(SB3AlgoConfig):
    """``stable_baselines3.A2C`` (Mnih et al. 2016)."""

    name: str = "a2c"
    learning_rate: float = 7e-4
    n_steps: int = 5
    gae_lambda: float = 1.0
    normalize_advantage: bool = False
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    use_rms_prop: bool = True
    rms_prop_eps: float = 1e-5


@dataclass
class TRPOConfig(SB3AlgoConfig):
    """``sb3_contrib.TRPO`` (Schulman et al. 2015)."""

    name: str = "trpo"
    learning_rate: float = 1e-3
    batch_size: int = 128
    cg_max_steps: int = 15
    cg_damping: float = 0.1
    line_search_shrinking_factor: float = 0.8
    line_search_max_iter: int = 10
    n_critic_updates: int = 10
    target_kl: float = 0.01
    sub_sampling_factor: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.batch_size >= 2, f"algo.batch_size={self.batch_size}; must be >= 2")
        check(self.target_kl > 0, f"algo.target_kl={self.target_kl}; must be > 0")


@dataclass
class GroupAlgoConfig(AlgoConfig):
    """Knobs of the group-relative fine-tuner (``harness.algos.group``); the name picks the
    advantage estimator (``harness.objectives.ESTIMATORS``).

    Attributes:
        group_size: G, attempts from each start state.
        num_start_states: B, snapshotted start states per iteration.
        temperature: Sampling temperature of the action tokens.
        clip_low: Lower PPO-style ratio clip (1 - clip_low).
        clip_high: Upper ratio clip (1 + clip_high); above ``clip_low`` is DAPO's clip-higher.
        beta: Weight of the k3 KL penalty to the frozen reference policy (0 disables it).
        aggregation: One of ``harness.objectives.AGGREGATIONS``.
        learning_rate: Adam step size.
        max_grad_norm: Gradient clipping norm.
        num_iterations: Epochs over each batch of groups.
        minibatch_size: Attempts per gradient step.
        zero_signal: What to do with groups whose outcomes are all equal: keep, drop, resample.
        iterations: Outer iterations (sample, score, update); ``total_timesteps`` also stops.
        workers: Processes that roll out attempts.
        init_policy: A ``harness.policies.save_policy`` file (e.g. the BC policy) to start from;
            it is also the KL reference. ``None`` starts from fresh weights (or from BC, below).
        bc_demos: Without ``init_policy``: when > 0, start from a policy behaviour-cloned on this
            many scripted-expert demos at ``task.difficulty`` (demos cached under ``data/demos``).
        bc_epochs: Epochs of that behaviour cloning.
        bc_difficulty: Start-state difficulty of those demos; ``None`` uses ``task.difficulty``.
            A curriculum study can clone on easy starts and evaluate on hard ones.
        state_pretrain_episodes: Pixel policies cloned with ``bc_demos``: first teach their
            features the simulator state on this many noisy-expert episodes
            (``harness.start_policy.pretrain_state_features``); 0 skips it.
        state_pretrain_epochs: Epochs of that pretraining.
        freeze_encoder: Fine-tune only what reads the image features (fusion MLP and heads) of
            a pixel policy, keeping its image encoder as BC left it; the update then encodes
            each frame once per iteration instead of once per epoch and minibatch.
    """

    group_size: int = 8
    num_start_states: int = 8
    temperature: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    beta: float = 0.0
    aggregation: str = "seq_mean_token_mean"
    learning_rate: float = 1e-4
    max_grad_norm: float = 1.0
    num_iterations: int = 2
    minibatch_size: int = 16
    zero_signal: str = "keep"
    iterations: int = 200
    workers: int = 1
    init_policy: str | None = None
    bc_demos: int = 0
    bc_epochs: int = 40
    bc_difficulty: float | None = None
    state_pretrain_episodes: int = 0
    state_pretrain_epochs: int = 15
    freeze_encoder: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.name in GROUP_ALGOS,
              f"algo.name={self.name!r} with the group schema; choose one of {GROUP_ALGOS}")
        for key in ("group_size", "num_start_states", "num_iterations", "minibatch_size",
                    "iterations", "workers"):
            check(getattr(self, key) >= 1, f"algo.{key}={getattr(self, key)}; must be >= 1")
        check(self.temperature > 0, f"algo.temperature={self.temperature}; must be > 0")
        check(self.clip_low >= 0 and self.clip_high >= 0,
              f"algo.clip_low={self.clip_low}, algo.clip_high={self.clip_high}; must be >= 0")
        check(self.beta >= 0, f"algo.beta={self.beta}; must be >= 0")
        check(self.aggregation in AGGREGATIONS,
              f"algo.aggregation={self.aggregation!r}; choose one of {AGGREGATIONS}")
        check(self.zero_signal in ZERO_SIGNAL,
              f"algo.zero_signal={self.zero_signal!r}; choose one of {ZERO_SIGNAL}")
        for key in ("bc_demos", "state_pretrain_episodes"):
            check(getattr(self, key) >= 0, f"algo.{key}={getattr(self, key)}; must be >= 0")
        for key in ("bc_epochs", "state_pretrain_epochs"):
            check(getattr(self, key) >= 1, f"algo.{key}={getattr(self, key)}; must be >= 1")
        check(self.bc_difficulty is None or 0.0 <= self.bc_difficulty <= 1.0,
              f"algo.bc_difficulty={self.bc_difficulty}; must be in [0, 1] or null")



# The schema each ``conf/algo/*.yaml`` names in its defaults list (``/schema/algo@_here_: ppo``).
ALGO_SCHEMAS: dict[str, type[AlgoConfig]] = {
    "ppo": PPOConfig,
    "a2c": A2CConfig,
    "trpo": TRPOConfig,
    "group": GroupAlgoConfig,
}
