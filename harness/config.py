"""Typed configuration of the training app, registered in Hydra's ConfigStore.

Hydra composes ``conf/train.yaml`` and the group files (``task/``, ``algo/``, ``policy/``,
``curriculum/``, ``detector/``, ``logger/``) over the dataclasses below, so a typo in a file or
on the command line (``task.obs_mod=pixels``) fails at composition, naming the key, before any
environment exists. :func:`load` then converts the ``DictConfig`` once into a :class:`TrainConfig`
(running every ``__post_init__``), and the library only ever sees these objects.

The ``algo`` and ``curriculum`` groups hold a different dataclass per choice; each group file
names its schema in its defaults list (``/schema/algo@_here_: ppo``), so the node is typed by the
choice. Schemas live in the ``schema/`` group so that they never show up as choices of a group.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
SB3_ALGOS: tuple[str, ...] = ("ppo", "a2c", "trpo")
GROUP_ALGOS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo", "critic", "reinforce")
POLICIES: tuple[str, ...] = ("mlp", "cnn", "tiny_vla")
# Which policies each algorithm family can train, and which observation key each policy reads.
POLICIES_BY_FAMILY: dict[str, tuple[str, ...]] = {
    "sb3": ("mlp", "cnn"),
    "group": ("mlp", "tiny_vla"),
}
POLICY_OBS_KEY: dict[str, str] = {"mlp": "state", "cnn": "pixels", "tiny_vla": "pixels"}
OBS_MODE_KEYS: dict[str, tuple[str, ...]] = {
    "state": ("state",),
    "pixels": ("pixels", "proprio"),
    "pixels_state": ("state", "pixels", "proprio"),
}
REWARDS: tuple[str, ...] = ("auto", "dense", "verifier")
# Seeds of the start states of group-trainer iterations: (seed + 1) * TRAIN_SEED_STRIDE + counter.
TRAIN_SEED_STRIDE = 10_000_000
MAX_RESAMPLE_ROUNDS = 4  # rounds of zero_signal=resample per iteration
# The success band weighs bins by 1 - p^G - (1-p)^G; SB3 plays single episodes, not groups.
SB3_BAND_GROUP_SIZE = 8
STATE_PRETRAIN_SEED = 3_000_000  # noisy-expert episodes of harness.bc.pretrain_state_features
ACTIVATIONS: tuple[str, ...] = ("tanh", "relu", "elu")
ZERO_SIGNAL: tuple[str, ...] = ("keep", "drop", "resample")


class ConfigError(ValueError):
    """A configuration value or combination of values that cannot run; the message names them."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


# ------------------------------------------------------------------------------------- task
@dataclass
class TaskOptions:
    """The ``task`` group: which task, and the options of ``tasks.make`` (see ``tasks.TaskConfig``).

    Attributes:
        name: One of ``tasks.TASKS``.
        obs_mode: ``state``, ``pixels`` or ``pixels_state``.
        camera: Camera of pixel observations.
        image_size: Side of the square pixel observation.
        render_quality: ``fast`` or ``high`` for pixel observations.
        max_episode_steps: Episode length; ``None`` keeps the task's own.
        terminate_on_success: End episodes on success.
        difficulty: Difficulty of resets that get none (evaluation's default).
        reward_weights: Overrides of the task's reward-term weights.
        randomization: Fields of ``tasks.RandomizationConfig``.
    """

    name: str = "reach"
    obs_mode: str = "state"
    camera: str = "front"
    image_size: int = 84
    render_quality: str = "fast"
    max_episode_steps: int | None = None
    terminate_on_success: bool = True
    difficulty: float = 1.0
    reward_weights: dict[str, float] = field(default_factory=dict)
    randomization: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import tasks  # MuJoCo is imported here, not when the module loads

        _check(self.name in tasks.TASKS,
               f"task.name={self.name!r} is unknown; choose one of {sorted(tasks.TASKS)}")
        try:
            tasks.TaskConfig.from_options(self.name, self.env_options())
        except TypeError as error:  # an unknown randomization field
            raise ConfigError(f"task.randomization: {error}") from None
        except ValueError as error:
            raise ConfigError(f"task: {error}") from None
        terms = tasks.TASKS[self.name].reward_weights
        unknown = sorted(set(self.reward_weights) - set(terms))
        _check(not unknown, f"task.reward_weights: {unknown} unknown for task {self.name!r}; "
                            f"its terms are {sorted(terms)}")

    def env_options(self) -> dict[str, Any]:
        """Keyword options for ``tasks.make(self.name, **options)``."""
        options = dataclasses.asdict(self)
        del options["name"]
        if options["max_episode_steps"] is None:
            del options["max_episode_steps"]
        return options


# ------------------------------------------------------------------------------------- algos
@dataclass
class AlgoConfig:
    """Base of the ``algo`` group; ``name`` picks the trainer in ``harness.runs.ALGORITHMS``."""

    name: str = MISSING

    @property
    def family(self) -> str:
        """``"sb3"`` or ``"group"``."""
        return "sb3" if self.name in SB3_ALGOS else "group"

    def __post_init__(self) -> None:
        known = SB3_ALGOS + GROUP_ALGOS
        _check(self.name in known, f"algo.name={self.name!r} is unknown; choose one of {known}")


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
        _check(self.learning_rate > 0, f"algo.learning_rate={self.learning_rate}; must be > 0")
        _check(self.n_steps >= 1, f"algo.n_steps={self.n_steps}; must be >= 1")
        _check(0 < self.gamma <= 1, f"algo.gamma={self.gamma}; must be in (0, 1]")
        _check(0 <= self.gae_lambda <= 1, f"algo.gae_lambda={self.gae_lambda}; must be in [0, 1]")
        _check(self.log_interval >= 0, f"algo.log_interval={self.log_interval}; must be >= 0")

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
        _check(self.batch_size >= 2, f"algo.batch_size={self.batch_size}; must be >= 2")
        _check(self.n_epochs >= 1, f"algo.n_epochs={self.n_epochs}; must be >= 1")
        _check(self.clip_range > 0, f"algo.clip_range={self.clip_range}; must be > 0")


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
        _check(self.batch_size >= 2, f"algo.batch_size={self.batch_size}; must be >= 2")
        _check(self.target_kl > 0, f"algo.target_kl={self.target_kl}; must be > 0")


@dataclass
class GroupAlgoConfig(AlgoConfig):
    """Knobs of the group-relative fine-tuner (``harness.algos.group``); the name picks the
    advantage estimator (``harness.algos.objectives.ESTIMATORS``).

    Attributes:
        group_size: G, attempts from each start state.
        num_start_states: B, snapshotted start states per iteration.
        temperature: Sampling temperature of the action tokens.
        clip_low: Lower PPO-style ratio clip (1 - clip_low).
        clip_high: Upper ratio clip (1 + clip_high); above ``clip_low`` is DAPO's clip-higher.
        beta: Weight of the k3 KL penalty to the frozen reference policy (0 disables it).
        aggregation: One of ``harness.algos.objectives.AGGREGATIONS``.
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
            (``harness.bc.pretrain_state_features``); 0 skips it.
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
        from harness.algos.objectives import AGGREGATIONS

        super().__post_init__()
        _check(self.name in GROUP_ALGOS,
               f"algo.name={self.name!r} with the group schema; choose one of {GROUP_ALGOS}")
        for key in ("group_size", "num_start_states", "num_iterations", "minibatch_size",
                    "iterations", "workers"):
            _check(getattr(self, key) >= 1, f"algo.{key}={getattr(self, key)}; must be >= 1")
        _check(self.temperature > 0, f"algo.temperature={self.temperature}; must be > 0")
        _check(self.clip_low >= 0 and self.clip_high >= 0,
               f"algo.clip_low={self.clip_low}, algo.clip_high={self.clip_high}; must be >= 0")
        _check(self.beta >= 0, f"algo.beta={self.beta}; must be >= 0")
        _check(self.aggregation in AGGREGATIONS,
               f"algo.aggregation={self.aggregation!r}; choose one of {AGGREGATIONS}")
        _check(self.zero_signal in ZERO_SIGNAL,
               f"algo.zero_signal={self.zero_signal!r}; choose one of {ZERO_SIGNAL}")
        for key in ("bc_demos", "state_pretrain_episodes"):
            _check(getattr(self, key) >= 0, f"algo.{key}={getattr(self, key)}; must be >= 0")
        for key in ("bc_epochs", "state_pretrain_epochs"):
            _check(getattr(self, key) >= 1, f"algo.{key}={getattr(self, key)}; must be >= 1")
        _check(self.bc_difficulty is None or 0.0 <= self.bc_difficulty <= 1.0,
               f"algo.bc_difficulty={self.bc_difficulty}; must be in [0, 1] or null")


# ------------------------------------------------------------------------------------ policy
@dataclass
class PolicyConfig:
    """The ``policy`` group: network of the SB3 baselines or of the group trainer's token policy.

    Attributes:
        name: ``mlp`` (reads ``state``), ``cnn`` (SB3 ``MultiInputPolicy`` with NatureCNN on
            ``pixels``, plus ``proprio``/``state``) or ``tiny_vla`` (token policy on ``pixels``).
        net_arch: SB3: hidden sizes of the policy and value MLPs.
        activation: SB3: ``tanh``, ``relu`` or ``elu``.
        log_std_init: SB3: initial log standard deviation of the Gaussian actions.
        features_dim: SB3 ``cnn``: width of the CNN's output.
        use_instruction: Also feed the instruction tokens (SB3: as a flat vector).
        num_bins: Token policies: K tokens per action dimension.
        hidden: Token policies: width of the fused feature and MLP layers.
        embed_dim: Token policies: instruction embedding and proprio encoder width.
        conv_channels: Token policies: channels of the image encoder's convolutions.
        pooled_size: Token policies: side of the pooled feature map (``avg_pool`` only).
        image_features: Token policies: ``spatial_softmax`` (keypoints, the default) or
            ``avg_pool`` (``harness.policies.TokenPolicyConfig.image_features``).
    """

    name: str = "mlp"
    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    log_std_init: float = 0.0
    features_dim: int = 128
    use_instruction: bool = False
    num_bins: int = 11
    hidden: int = 128
    embed_dim: int = 32
    conv_channels: list[int] = field(default_factory=lambda: [16, 32, 32])
    pooled_size: int = 4
    image_features: str = "spatial_softmax"

    def __post_init__(self) -> None:
        from harness.policies.token_policy import IMAGE_FEATURES

        _check(self.name in POLICIES,
               f"policy.name={self.name!r} is unknown; choose one of {POLICIES}")
        _check(self.activation in ACTIVATIONS,
               f"policy.activation={self.activation!r}; choose one of {ACTIVATIONS}")
        _check(all(int(n) >= 1 for n in self.net_arch),
               f"policy.net_arch={list(self.net_arch)}; sizes must be >= 1")
        _check(self.features_dim >= 1, f"policy.features_dim={self.features_dim}; must be >= 1")
        _check(self.image_features in IMAGE_FEATURES,
               f"policy.image_features={self.image_features!r}; choose one of {IMAGE_FEATURES}")

    def token_policy_config(self):
        """The ``harness.policies.TokenPolicyConfig`` of ``mlp`` / ``tiny_vla`` (group trainer)."""
        from harness.policies import TokenPolicyConfig

        return TokenPolicyConfig(
            kind=self.name, num_bins=self.num_bins, hidden=self.hidden, embed_dim=self.embed_dim,
            conv_channels=tuple(self.conv_channels), pooled_size=self.pooled_size,
            use_instruction=self.use_instruction, image_features=self.image_features,
        )


# -------------------------------------------------------------------------------- curriculum
@dataclass
class CurriculumConfig:
    """Base of the ``curriculum`` group (``harness.curriculum.make(name, **params)``).

    Attributes:
        name: ``fixed``, ``uniform``, ``linear`` or ``success_band``.
        num_bins: Bins of the per-difficulty success table.
        adr_key: Optional task level parameter that the difficulty drives alone.
    """

    name: str = MISSING
    num_bins: int = 10
    adr_key: str | None = None

    def params(self, task_difficulty: float, group_size: int) -> dict[str, Any]:
        """Keyword parameters of ``harness.curriculum.make`` (without ``seed``); ``group_size``
        is the trainer's G (read by the curricula that weigh bins by group signal)."""
        params = dataclasses.asdict(self)
        del params["name"]
        return params


@dataclass
class FixedCurriculumConfig(CurriculumConfig):
    """Always ``difficulty``; ``None`` plays the task's own ``task.difficulty``."""

    name: str = "fixed"
    difficulty: float | None = None

    def params(self, task_difficulty: float, group_size: int) -> dict[str, Any]:
        params = super().params(task_difficulty, group_size)
        if params["difficulty"] is None:
            params["difficulty"] = task_difficulty
        return params


@dataclass
class UniformCurriculumConfig(CurriculumConfig):
    """Uniform in [low, high]."""

    name: str = "uniform"
    low: float = 0.0
    high: float = 1.0


@dataclass
class LinearCurriculumConfig(CurriculumConfig):
    """From ``start`` to ``end`` over ``steps`` episodes."""

    name: str = "linear"
    start: float = 0.0
    end: float = 1.0
    steps: int = 1000


@dataclass
class SuccessBandCurriculumConfig(CurriculumConfig):
    """Favours difficulties whose success lies in [low, high] (see ``harness.curriculum``); its
    G is the trainer's ``algo.group_size``."""

    name: str = "success_band"
    low: float = 0.2
    high: float = 0.8
    explore: float = 0.1
    min_obs: int = 16
    initial_frontier: int = 0
    prior: float = 1.0
    decay: float = 0.98
    signal: str = "bernoulli"

    def params(self, task_difficulty: float, group_size: int) -> dict[str, Any]:
        return {**super().params(task_difficulty, group_size), "group_size": group_size}


# ------------------------------------------------------------------------ logger, eval, ...
@dataclass
class LoggerConfig:
    """The ``logger`` group. ``metrics.csv`` and ``summary.json`` are always written.

    Attributes:
        tensorboard: Write TensorBoard events under ``tensorboard/``.
        progress_bar: Show a progress bar.
        videos: Record evaluation episodes under ``videos/``.
        console: Print SB3's table of metrics after each log dump.
    """

    tensorboard: bool = True
    progress_bar: bool = True
    videos: bool = True
    console: bool = False


@dataclass
class EvalConfig:
    """Deterministic evaluation on held-out seeds, in two disjoint ranges.

    Periodic evaluations (and so the choice of the ``best`` checkpoint) play the validation
    seeds ``validation_seed, validation_seed + 1, ...``; the final evaluation, and the start
    policy's evaluation it is compared with, play the test seeds ``seed, seed + 1, ...``.
    :meth:`TrainConfig.seed_ranges` lists every range a run uses and refuses overlaps.

    Attributes:
        every_steps: Environment steps between periodic evaluations (0: only the final one).
        episodes: Episodes per difficulty in a periodic evaluation (validation seeds).
        final_episodes: Episodes per difficulty in the final evaluation (test seeds).
        difficulties: Difficulties to evaluate; empty means ``[task.difficulty]``.
        seed: First test seed.
        validation_seed: First validation seed.
        video_episodes: Episodes recorded to mp4 per evaluation (when the logger records videos).
    """

    every_steps: int = 10_000
    episodes: int = 20
    final_episodes: int = 100
    difficulties: list[float] = field(default_factory=list)
    seed: int = 1_000_000
    validation_seed: int = 2_000_000
    video_episodes: int = 1

    def __post_init__(self) -> None:
        for key in ("seed", "validation_seed"):
            _check(getattr(self, key) >= 0, f"eval.{key}={getattr(self, key)}; must be >= 0")
        for key in ("every_steps", "video_episodes"):
            _check(getattr(self, key) >= 0, f"eval.{key}={getattr(self, key)}; must be >= 0")
        for key in ("episodes", "final_episodes"):
            _check(getattr(self, key) >= 1, f"eval.{key}={getattr(self, key)}; must be >= 1")
        bad = [d for d in self.difficulties if not 0.0 <= d <= 1.0]
        _check(not bad, f"eval.difficulties={list(self.difficulties)}; {bad} outside [0, 1]")


@dataclass
class VerifierConfig:
    """How the detector's verdict becomes the reward when ``reward=verifier``.

    Attributes:
        when: ``final`` (score the last step of an episode) or ``every_step``.
        mode: ``replace`` the dense reward (sparse reward) or ``add`` to it.
        terminate_on_detection: End the episode when the detector fires.
    """

    when: str = "final"
    mode: str = "replace"
    terminate_on_detection: bool = False

    def __post_init__(self) -> None:
        _check(self.when in ("final", "every_step"),
               f"verifier.when={self.when!r}; choose one of ('final', 'every_step')")
        _check(self.mode in ("replace", "add"),
               f"verifier.mode={self.mode!r}; choose one of ('replace', 'add')")


@dataclass
class TrainConfig:
    """Everything one training run needs (the primary config, ``conf/train.yaml``).

    Attributes:
        task: Task and its environment options.
        algo: Algorithm and its hyper-parameters.
        policy: Network.
        curriculum: Difficulty sampler of training episodes.
        detector: The detector group (``success_detectors.make``); used when ``reward=verifier``.
        logger: Outputs.
        eval: Periodic and final evaluation.
        verifier: How the detector gives the reward.
        seed: Seed of the algorithm, the networks and the training environments.
        total_timesteps: Environment steps to train for (a resumed run counts from its start).
        max_minutes: Stop training after this wall-clock time (``None``: no limit).
        n_envs: Parallel training environments (subprocesses when > 1).
        checkpoint_every_steps: Steps between ``checkpoints/latest`` saves (also saved at the end).
        resume: Continue the run in this run directory from ``checkpoints/latest``.
        reward: ``dense`` (the task's reward terms) or ``verifier`` (the detector's verdict);
            ``auto`` resolves to ``dense`` for SB3 and ``verifier`` for the group algorithms,
            which score each attempt by the verifier's binary verdict and refuse ``dense``.
        device: Torch device of the networks: ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or
            ``auto`` (the first available of cuda, mps, cpu).
        torch_threads: Torch threads of the main process (workers always use one).
    """

    task: TaskOptions = field(default_factory=TaskOptions)
    algo: AlgoConfig = MISSING
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    curriculum: CurriculumConfig = MISSING
    detector: dict[str, Any] = field(default_factory=dict)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    seed: int = 0
    total_timesteps: int = 100_000
    max_minutes: float | None = None
    n_envs: int = 1
    checkpoint_every_steps: int = 10_000
    resume: bool = False
    reward: str = "auto"
    device: str = "cpu"
    torch_threads: int = 1

    def __post_init__(self) -> None:
        _check(self.total_timesteps >= 1, f"total_timesteps={self.total_timesteps}; must be >= 1")
        _check(self.n_envs >= 1, f"n_envs={self.n_envs}; must be >= 1")
        _check(self.torch_threads >= 1, f"torch_threads={self.torch_threads}; must be >= 1")
        _check(self.checkpoint_every_steps >= 1,
               f"checkpoint_every_steps={self.checkpoint_every_steps}; must be >= 1")
        _check(self.max_minutes is None or self.max_minutes > 0,
               f"max_minutes={self.max_minutes}; must be > 0 or null")
        _check(self.seed >= 0, f"seed={self.seed}; must be >= 0")
        _check(self.reward in REWARDS, f"reward={self.reward!r}; choose one of {REWARDS}")
        _check(self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps"),
               f"device={self.device!r}; expected cpu, cuda, cuda:N, mps or auto")
        from harness.policies import resolve_device

        try:
            resolve_device(self.device)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if self.reward == "auto":
            self.reward = "verifier" if self.algo.family == "group" else "dense"
        _check(self.reward == "verifier" or self.algo.family == "sb3",
               f"reward={self.reward!r} with algo={self.algo.name!r}: group algorithms score "
               "each attempt by the verifier's binary verdict; use reward=verifier (their "
               "default) with detector=scripted (ground truth) or detector=cnn")
        learned = (self.detector or {}).get("name", "scripted") != "scripted"
        _check(not learned or self.reward == "verifier",
               f"detector={self.detector.get('name')!r} is only read with reward=verifier; "
               f"reward={self.reward!r} would ignore it")
        if self.reward == "verifier":
            self._check_detector()
        if self.algo.family == "group":
            default = VerifierConfig()
            _check(self.verifier == default,
                   f"verifier={dataclasses.asdict(self.verifier)} with algo={self.algo.name!r}: "
                   "the group trainer scores the last frame of each attempt (verifier.when="
                   "final) and the verdict is the reward (verifier.mode=replace), without "
                   "ending episodes on a detection; these verifier options are SB3's")
        self._check_policy()
        self._check_batch()
        self._check_curriculum()
        self._check_seed_ranges()

    def _check_detector(self) -> None:
        _check(bool(self.detector.get("name")),
               f"reward=verifier needs a detector with a name (e.g. detector=scripted); "
               f"got detector={self.detector}")
        # The scripted predicate would pick the frame the learned detector then scores.
        _check(self.detector["name"] == "scripted" or not self.task.terminate_on_success,
               f"task.terminate_on_success=true with detector={self.detector['name']!r}: the "
               "episode would end on the simulator's ground-truth success, so the frame the "
               "learned detector scores is chosen by the ground truth it replaces; set "
               "task.terminate_on_success=false (SB3 can end episodes on the detector with "
               "verifier.when=every_step verifier.terminate_on_detection=true)")
        import success_detectors  # only a verifier reward needs them

        try:
            success_detectors.make(dict(self.detector), task=self.task.name)
        except (ValueError, FileNotFoundError) as error:
            raise ConfigError(f"detector: {error}") from None

    def _check_policy(self) -> None:
        family, policy, obs_mode = self.algo.family, self.policy.name, self.task.obs_mode
        allowed = POLICIES_BY_FAMILY[family]
        _check(policy in allowed,
               f"policy={policy!r} cannot be trained by algo={self.algo.name!r}; "
               f"{family} algorithms take policy in {allowed}")
        needed = POLICY_OBS_KEY[policy]
        _check(needed in OBS_MODE_KEYS[obs_mode],
               f"policy={policy!r} reads {needed!r} observations, which task.obs_mode="
               f"{obs_mode!r} does not give; use task.obs_mode in "
               f"{[m for m, keys in OBS_MODE_KEYS.items() if needed in keys]}")

    def _check_batch(self) -> None:
        rollout = getattr(self.algo, "n_steps", 0) * self.n_envs
        batch_size = getattr(self.algo, "batch_size", None)
        if self.algo.name in ("ppo", "trpo"):
            _check(batch_size <= rollout,
                   f"algo.batch_size={batch_size} exceeds a rollout of algo.n_steps="
                   f"{self.algo.n_steps} x n_envs={self.n_envs} = {rollout} steps")

    def _check_curriculum(self) -> None:
        from harness import curriculum

        try:
            curriculum.make(self.curriculum.name, **self.curriculum_params())
        except ValueError as error:
            raise ConfigError(f"curriculum: {error}") from None

    def curriculum_params(self) -> dict[str, Any]:
        """Keyword parameters of ``harness.curriculum.make`` (without ``seed``): the group file's
        fields, with the success band's G taken from ``algo.group_size`` (one value, so the
        band weighs bins by the groups the trainer really plays)."""
        group_size = getattr(self.algo, "group_size", SB3_BAND_GROUP_SIZE)
        return self.curriculum.params(self.task.difficulty, group_size)

    def seed_ranges(self) -> dict[str, list[int]]:
        """Every range of ``reset`` seeds this run plays, as ``{name: [first, stop)}``.

        ``train``: start states of training (group trainer: one seed per snapshotted start
        state; SB3: the first reset of each environment, later resets continue its RNG, and
        ``train_resumed`` the reseeding of a resumed run);
        ``demo``: scripted-expert demos of ``algo.bc_demos`` (at most ``MAX_TRIES_PER_DEMO``
        attempts per demo); ``state_pretrain``: noisy-expert episodes of the state-feature
        pretraining; ``validation``: periodic evaluations; ``test``: the final evaluation and the
        start policy's. :meth:`_check_seed_ranges` refuses any overlap.
        """
        algo, ranges = self.algo, {}
        if algo.family == "group":
            first = (self.seed + 1) * TRAIN_SEED_STRIDE
            by_iterations = algo.iterations * algo.num_start_states * MAX_RESAMPLE_ROUNDS
            by_steps = -(-self.total_timesteps // algo.group_size) + \
                algo.num_start_states * MAX_RESAMPLE_ROUNDS
            ranges["train"] = [first, first + min(by_iterations, by_steps)]
            if not algo.init_policy and algo.bc_demos > 0:
                from harness.demos import MAX_TRIES_PER_DEMO

                ranges["demo"] = [0, MAX_TRIES_PER_DEMO * algo.bc_demos]
                if algo.state_pretrain_episodes > 0 and self.task.obs_mode != "state":
                    first = STATE_PRETRAIN_SEED + self.seed * 10_000
                    ranges["state_pretrain"] = [first, first + algo.state_pretrain_episodes]
        else:
            ranges["train"] = [self.seed, self.seed + self.n_envs]
            first = (self.seed + 1) * TRAIN_SEED_STRIDE  # a resumed run reseeds its envs here
            ranges["train_resumed"] = [first, first + self.total_timesteps + self.n_envs]
        if self.eval.every_steps:
            ranges["validation"] = [self.eval.validation_seed,
                                    self.eval.validation_seed + self.eval.episodes]
        ranges["test"] = [self.eval.seed, self.eval.seed + self.eval.final_episodes]
        return ranges

    def _check_seed_ranges(self) -> None:
        ranges = sorted(self.seed_ranges().items(), key=lambda item: item[1][0])
        for (name_a, (_, stop_a)), (name_b, (first_b, _)) in zip(ranges, ranges[1:],
                                                                  strict=False):
            _check(stop_a <= first_b,
                   f"seed ranges overlap: {name_a} plays reset seeds "
                   f"{dict(ranges)[name_a]} (first, stop) and {name_b} plays "
                   f"{dict(ranges)[name_b]}; a start state must not be both trained on and "
                   "evaluated on: change seed, eval.seed or eval.validation_seed")


# ------------------------------------------------------------------------------ registration
ALGO_SCHEMAS: dict[str, type[AlgoConfig]] = {
    "ppo": PPOConfig,
    "a2c": A2CConfig,
    "trpo": TRPOConfig,
    "group": GroupAlgoConfig,
}
CURRICULUM_SCHEMAS: dict[str, type[CurriculumConfig]] = {
    "fixed": FixedCurriculumConfig,
    "uniform": UniformCurriculumConfig,
    "linear": LinearCurriculumConfig,
    "success_band": SuccessBandCurriculumConfig,
}


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent): ``train_schema`` for the primary
    config, ``schema/algo/*`` and ``schema/curriculum/*`` for the group files."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for name, schema in ALGO_SCHEMAS.items():
        store.store(group="schema/algo", name=name, node=schema)
    for name, schema in CURRICULUM_SCHEMAS.items():
        store.store(group="schema/curriculum", name=name, node=schema)


def load(cfg: DictConfig) -> TrainConfig:
    """Convert a composed ``DictConfig`` into a validated :class:`TrainConfig`, once.

    Raises:
        ConfigError: A value is missing, has the wrong type, or breaks a rule; names the key.
    """
    unknown = _unknown_keys(cfg)
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown}; check the spelling (added with '+'?)")
    try:
        config = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except OmegaConfBaseException as error:
        cause = error.__cause__ if isinstance(error.__cause__, ConfigError) else None
        if cause is not None:
            raise cause from None
        raise ConfigError(str(error)) from None
    if not isinstance(config, TrainConfig):
        raise ConfigError(f"expected a TrainConfig, composed a {type(config).__name__}")
    return config


def _unknown_keys(node: Any, path: str = "") -> list[str]:
    """Keys of typed nodes that their dataclass lacks (``+key=value`` slips past Hydra's check,
    and ``OmegaConf.to_object`` would drop them silently)."""
    if not isinstance(node, DictConfig):
        return []
    schema = OmegaConf.get_type(node)
    typed = dataclasses.is_dataclass(schema)
    names = {f.name for f in dataclasses.fields(schema)} if typed else None
    unknown = []
    for key in node.keys():
        dotted = f"{path}{key}"
        if names is not None and key not in names:
            unknown.append(dotted)
        elif names is not None:
            unknown += _unknown_keys(node._get_node(key), f"{dotted}.")
    return unknown


def compose(overrides: list[str] | None = None, config_dir: str | Path = CONF_DIR) -> TrainConfig:
    """Compose ``conf/train.yaml`` with command-line style overrides, outside ``@hydra.main``
    (tests, notebooks, sweeps driven from Python).

    Raises:
        ConfigError: As :func:`load`; Hydra's own errors (unknown group choice, unknown key) pass
            through unchanged since they already list the choices or name the key.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=list(overrides or []))
    return load(cfg)


def to_yaml(config: TrainConfig) -> str:
    """The resolved configuration as YAML (what ``config.yaml`` in a run dir holds)."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))

