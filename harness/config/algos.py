"""The ``algo`` group: one schema per family, SB3's on-policy baselines and the group trainer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from harness.config.bounds import (
    MAX_CLIP_HIGH,
    MAX_COUNT,
    MAX_SEED,
    MAX_TEMPERATURE,
    check_count,
    check_rate,
    max_processes,
)
from harness.config.errors import check
from harness.config.rollout import ResetNoiseConfig, RolloutConfig
from harness.config.start import StartPolicyConfig, StartsConfig
from harness.objective_names import AGGREGATIONS, RATIO_UNITS

SB3_ALGOS: tuple[str, ...] = ("ppo", "a2c", "trpo")
GROUP_ALGOS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo", "critic", "reinforce", "vla_ppo")
CRITICS: tuple[str, ...] = ("shared", "separate")  # vla_ppo's value network
ZERO_SIGNAL: tuple[str, ...] = ("keep", "drop", "resample")
# Counts of SB3's algorithms, each at most MAX_COUNT (their lower bounds are their own checks).
SB3_COUNTS: tuple[str, ...] = ("batch_size", "n_epochs", "cg_max_steps", "line_search_max_iter",
                               "n_critic_updates", "sub_sampling_factor")


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

    Counts (``n_steps``, ``batch_size``, epochs, ...) are at most ``MAX_COUNT`` (10^6).

    Attributes:
        learning_rate: Adam (RMSprop for A2C) step size, in (0, 1].
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
        check_rate("algo.learning_rate", self.learning_rate)
        check_count("algo.n_steps", self.n_steps)
        check(0 < self.gamma <= 1, f"algo.gamma={self.gamma}; must be in (0, 1]")
        check(0 <= self.gae_lambda <= 1, f"algo.gae_lambda={self.gae_lambda}; must be in [0, 1]")
        check_count("algo.log_interval", self.log_interval, 0)
        names = {f.name for f in dataclasses.fields(self)}  # each algorithm has its own
        if "max_grad_norm" in names:
            check(self.max_grad_norm > 0,
                  f"algo.max_grad_norm={self.max_grad_norm}; must be > 0")
        for key in sorted(names & set(SB3_COUNTS)):
            check_count(f"algo.{key}", getattr(self, key), 0)

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
class CriticConfig:
    """``algo.critic``: ``vla_ppo``'s value network.

    Attributes:
        network: ``shared`` (a value head on the policy's own features, as RL4VLA) or
            ``separate`` (a copy of the start policy's network with its own value head).
        warmup_iterations: First iterations that train the value network alone (the policy
            does not move until its advantages come from a fitted critic; ReinFlow, πRL).
        learning_rate: Adam step size of the value network (the value head of a ``shared``
            critic, the whole copy of a ``separate`` one); ``null``: ``algo.learning_rate``.
    """

    network: str = "shared"
    warmup_iterations: int = 0
    learning_rate: float | None = None

    def __post_init__(self) -> None:
        check(self.network in CRITICS,
              f"algo.critic.network={self.network!r}; choose one of {CRITICS}")
        check_count("algo.critic.warmup_iterations", self.warmup_iterations, 0)
        if self.learning_rate is not None:
            check_rate("algo.critic.learning_rate", self.learning_rate)


@dataclass
class RatioConfig:
    """``algo.ratio``: what one clipped ratio covers (:func:`harness.objectives.ratio_units`).

    Attributes:
        unit: ``native`` (each head's own unit: a token, a Gaussian chunk entry, a whole flow
            chain), ``decision``, ``step`` (a chunk entry's action), ``element`` (one action
            dimension of one chunk entry; a flow chain's steps summed) or ``chain_element`` (a
            flow chain's start and each denoising step of each element apart).
        normalize: Divide each unit's log-probability by the number of parts it sums.
        clamp: ``[low, high]`` bounds of each unit's (normalised) log-probability, or ``null``.
    """

    unit: str = "native"
    normalize: bool = False
    clamp: list[float] | None = None

    def __post_init__(self) -> None:
        check(self.unit in RATIO_UNITS,
              f"algo.ratio.unit={self.unit!r}; choose one of {RATIO_UNITS}")
        check(not (self.unit == "native" and (self.normalize or self.clamp is not None)),
              "algo.ratio.normalize and algo.ratio.clamp cut a decision's log-probability into "
              "units; set algo.ratio.unit to decision, step, element or chain_element")
        if self.clamp is not None:
            bounds = list(self.clamp)
            check(len(bounds) == 2 and all(isinstance(v, (int, float)) for v in bounds)
                  and bounds[0] < bounds[1],
                  f"algo.ratio.clamp={self.clamp!r}; expected [low, high] with low < high")
            self.clamp = [float(v) for v in bounds]


@dataclass
class ResidualOptions:
    """``algo.residual``: fine-tune a small residual head on the frozen start instead of the
    start itself (:mod:`harness.policies.residual`; ResiP, Policy Decorator).

    Attributes:
        scale: The residual's largest size in action units (``a = clip(a_start + scale *
            tanh(u), -1, 1)``); 0 fine-tunes the start itself.
        log_std_init: The residual Gaussian's initial ``log std`` (its mean starts at 0).
    """

    scale: float = 0.0
    log_std_init: float = -1.0

    def __post_init__(self) -> None:
        check(isinstance(self.scale, (int, float)) and 0 <= self.scale <= 2,
              f"algo.residual.scale={self.scale!r}; must be in [0, 2] (0: no residual)")
        check(isinstance(self.log_std_init, (int, float)) and -5 <= self.log_std_init <= 1,
              f"algo.residual.log_std_init={self.log_std_init!r}; must be in [-5, 1]")


@dataclass
class ExplorationConfig:
    """``algo.exploration``: the noise scale of a gaussian (std) or flow (sigma) head during
    fine-tuning, set on the start policy before the first rollout (its start evaluation, the
    clone's own decoding, comes first).

    Attributes:
        low: Smallest noise scale (``null``: the head's own bound).
        high: Largest noise scale (``null``: the head's own bound).
        fixed: Fix the noise scale at this value and stop learning it (``low``/``high``
            unused).
    """

    low: float | None = None
    high: float | None = None
    fixed: float | None = None

    def __post_init__(self) -> None:
        for key in ("low", "high", "fixed"):
            value = getattr(self, key)
            check(value is None or (isinstance(value, (int, float)) and 0 < value <= 10),
                  f"algo.exploration.{key}={value!r}; must be in (0, 10] or null")
        check(self.low is None or self.high is None or self.low <= self.high,
              f"algo.exploration.low={self.low} > algo.exploration.high={self.high}")
        check(self.fixed is None or (self.low is None and self.high is None),
              "algo.exploration.fixed fixes the noise scale; leave low and high null with it")

    @property
    def active(self) -> bool:
        """Whether it changes the start policy's noise."""
        return any(v is not None for v in (self.low, self.high, self.fixed))


@dataclass
class GroupAlgoConfig(AlgoConfig):
    """Knobs of the group-relative fine-tuner (``harness.algos.group.run``); the name picks the
    advantage estimator (``harness.objectives.ESTIMATORS``). Every count is at most
    ``harness.config.bounds.MAX_COUNT`` (10^6). The start policy and the start states are nested
    blocks (``algo.start_policy``, ``algo.starts``, :mod:`harness.config.start`).

    Attributes:
        group_size: G, attempts from each start state.
        num_start_states: B, snapshotted start states per iteration (G x B at most
            ``MAX_COUNT``).
        temperature: Sampling temperature of the action tokens, in (0, 100].
        clip_low: Lower PPO-style ratio clip (1 - clip_low), in (0, 1).
        clip_high: Upper ratio clip (1 + clip_high), in (0, 10]; above ``clip_low`` is DAPO's
            clip-higher.
        beta: Weight of the k3 KL penalty to the frozen reference policy (0 disables it).
        aggregation: One of ``harness.objectives.AGGREGATIONS``.
        learning_rate: Adam step size, in (0, 1].
        max_grad_norm: Gradient clipping norm, > 0.
        num_iterations: Epochs over each batch of groups.
        minibatch_size: Attempts per gradient step.
        zero_signal: What to do with groups whose outcomes are all equal: keep, drop, resample.
        iterations: Outer iterations (sample, score, update): the group algorithms' budget
            (they refuse ``total_timesteps``; ``max_minutes`` stays a guard).
        workers: Rollout workers (processes or Ray actors, ``rollout.backend``): at most
            ``PROCESSES_PER_CPU`` (8) per CPU of this machine, unless they are actors of a
            Ray cluster (``rollout.ray_address`` given).
        rollout: Where the workers run (:class:`RolloutConfig`).
        start_policy: What fine-tuning starts from, and its KL reference: a saved file, a
            behaviour clone on demos or a dataset, or fresh weights
            (:class:`~harness.config.start.StartPolicyConfig`; the step of
            :mod:`harness.start_policy` builds it before the run).
        demo_seed: Reset seed of the first attempt of the scripted-expert demos (behaviour
            cloning's and those of ``demo`` starts); ``None``: from the run's seed
            (:func:`harness.config.seeds.demo_first_seed`), so runs of different seeds clone on
            different demonstrations.
        freeze_encoder: Fine-tune only what reads the image features (fusion MLP and heads) of
            a pixel policy, keeping its image encoder as BC left it; the update then encodes
            each frame once per iteration instead of once per epoch and minibatch.
        starts: Where groups start (:class:`~harness.config.start.StartsConfig`).
        reset_noise: Inexact resets of the attempts (:class:`ResetNoiseConfig`; off at 0).
        gamma: ``vla_ppo``: discount per decision, in [0, 1].
        gae_lambda: ``vla_ppo``: GAE's lambda, in [0, 1].
        vf_coef: ``vla_ppo``: weight of the value loss, >= 0.
        vf_clip: ``vla_ppo``: how far a value may move from the rollout's in one update (PPO2's
            value clipping); ``null`` leaves it unclipped.
        critic: ``vla_ppo``'s value network (:class:`CriticConfig`).
        normalize_advantages: ``vla_ppo``: standardise each update's advantages over its
            decisions.
        ratio: What one clipped ratio covers, normalised and clamped or not
            (:class:`RatioConfig`; ``native`` is each head's own unit).
        exploration: Bounds of a gaussian or flow head's noise during fine-tuning
            (:class:`ExplorationConfig`; off by default).
        residual: Fine-tune a residual head on the frozen start instead
            (:class:`ResidualOptions`; off at ``scale`` 0).
        target_kl: Stop an iteration's epochs once the mean k3 estimate of ``KL(old || new)``
            per unit passes this (ReinFlow's 0.01); ``null``: never.
        bc_coef: Weight of a behaviour-cloning loss on the start's demos added to every
            gradient step (an anchor to the clone); needs a start cloned on demos or a dataset.
        bc_batch: Demonstrated decisions in each step's behaviour-cloning loss.
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
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    start_policy: StartPolicyConfig = field(default_factory=StartPolicyConfig)
    demo_seed: int | None = None
    freeze_encoder: bool = False
    starts: StartsConfig = field(default_factory=StartsConfig)
    reset_noise: ResetNoiseConfig = field(default_factory=ResetNoiseConfig)
    gamma: float = 0.99
    gae_lambda: float = 0.95
    vf_coef: float = 0.5
    vf_clip: float | None = 0.2
    critic: CriticConfig = field(default_factory=CriticConfig)
    normalize_advantages: bool = True
    ratio: RatioConfig = field(default_factory=RatioConfig)
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    residual: ResidualOptions = field(default_factory=ResidualOptions)
    target_kl: float | None = None
    bc_coef: float = 0.0
    bc_batch: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.name in GROUP_ALGOS,
              f"algo.name={self.name!r} with the group schema; choose one of {GROUP_ALGOS}")
        self._check_sizes()
        check(self.beta >= 0, f"algo.beta={self.beta}; must be >= 0")
        for key in ("gamma", "gae_lambda"):
            value = getattr(self, key)
            check(0.0 <= value <= 1.0, f"algo.{key}={value}; must be in [0, 1]")
        check(self.vf_coef >= 0, f"algo.vf_coef={self.vf_coef}; must be >= 0")
        check(self.vf_clip is None or self.vf_clip > 0,
              f"algo.vf_clip={self.vf_clip}; must be > 0, or null for no clipping")
        check(self.aggregation in AGGREGATIONS,
              f"algo.aggregation={self.aggregation!r}; choose one of {AGGREGATIONS}")
        check(self.zero_signal in ZERO_SIGNAL,
              f"algo.zero_signal={self.zero_signal!r}; choose one of {ZERO_SIGNAL}")
        check(self.target_kl is None or self.target_kl > 0,
              f"algo.target_kl={self.target_kl}; must be > 0, or null for no early stop")
        check(self.bc_coef >= 0, f"algo.bc_coef={self.bc_coef}; must be >= 0")
        check_count("algo.bc_batch", self.bc_batch)
        check(self.bc_coef == 0 or self.start_policy.clones,
              f"algo.bc_coef={self.bc_coef} anchors to the demos the start was cloned on; set "
              "algo.start_policy.bc.demos (or a dataset) too")
        valued = self.name in ("critic", "vla_ppo")
        check(valued or (self.critic.warmup_iterations == 0
                         and self.critic.learning_rate is None),
              f"algo.critic.warmup_iterations and algo.critic.learning_rate set the value "
              f"network of the critic and vla_ppo estimators; algo.name={self.name!r} has none")
        check(self.critic.warmup_iterations < self.iterations
              or self.critic.warmup_iterations == 0,
              f"algo.critic.warmup_iterations={self.critic.warmup_iterations} leaves none of "
              f"the {self.iterations} iterations to the policy")

    def _check_sizes(self) -> None:
        """Counts within [1 or 0, ``MAX_COUNT``], workers within what this machine can run,
        rates in (0, 1], the clip range and the temperature within their bounds."""
        for key in ("group_size", "num_start_states", "num_iterations", "minibatch_size",
                    "iterations"):
            check_count(f"algo.{key}", getattr(self, key))
        if self.demo_seed is not None:
            check_count("algo.demo_seed", self.demo_seed, 0, MAX_SEED)
        check_count("algo.group_size x algo.num_start_states",
                    self.group_size * self.num_start_states)
        local = self.rollout.backend == "processes" or self.rollout.ray_address is None
        # A Ray cluster's size is checked when it is joined; this machine's is known now.
        check_count("algo.workers", self.workers, 1, max_processes() if local else MAX_COUNT)
        check_rate("algo.learning_rate", self.learning_rate)
        check(self.max_grad_norm > 0, f"algo.max_grad_norm={self.max_grad_norm}; must be > 0")
        check(0 < self.temperature <= MAX_TEMPERATURE,
              f"algo.temperature={self.temperature}; must be in (0, {MAX_TEMPERATURE}]")
        check(0 < self.clip_low < 1,
              f"algo.clip_low={self.clip_low}; must be in (0, 1) (the ratio's floor is "
              "1 - clip_low)")
        check(0 < self.clip_high <= MAX_CLIP_HIGH,
              f"algo.clip_high={self.clip_high}; must be in (0, {MAX_CLIP_HIGH}]")



# The schema each ``conf/algo/*.yaml`` names in its defaults list (``/schema/algo@_here_: ppo``).
ALGO_SCHEMAS: dict[str, type[AlgoConfig]] = {
    "ppo": PPOConfig,
    "a2c": A2CConfig,
    "trpo": TRPOConfig,
    "group": GroupAlgoConfig,
}
