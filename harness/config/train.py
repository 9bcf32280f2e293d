"""The primary config, :class:`TrainConfig`, with its blocks ``logger``, ``eval`` and ``verifier``
and the checks that span groups (policy against algorithm and observations, budgets, options of
one algorithm family only, seed ranges, ...). Schema and checks only: the trainers build the
objects (curriculum, ADR, detector) from it."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from harness.config.adr import AdrConfig
from harness.config.algos import AlgoConfig
from harness.config.blocks import (
    DetectorRefreshConfig,
    EvalConfig,
    LoggerConfig,
    VerifierConfig,
)
from harness.config.bounds import MAX_SEED, MAX_TIMESTEPS, check_count, max_processes
from harness.config.curriculum import CurriculumConfig
from harness.config.errors import ConfigError, check
from harness.config.policy import PolicyConfig
from harness.config.seeds import Seeds
from harness.config.task import OBS_MODE_KEYS, TaskOptions
from harness.demos import MAX_TRIES_PER_DEMO

REWARDS: tuple[str, ...] = ("auto", "dense", "verifier")
SB3_DEFAULT_TIMESTEPS = 100_000  # SB3's budget when total_timesteps is null
MAX_RESAMPLE_ROUNDS = 4  # rounds of zero_signal=resample per iteration
# The success band weighs bins by 1 - p^G - (1-p)^G; SB3 plays single episodes, not groups.
SB3_BAND_GROUP_SIZE = 8
# Ranges of seeds that evaluate (validation chooses, test reports): they overlap no other range.
# Training ranges may share seeds: BC demos and demo-start demos are both recorded from the
# run's demo seed.
HELD_OUT_RANGES: tuple[str, ...] = ("validation", "test")


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
        detector_refresh: In-run hard-negative mining of a learned verifier (group trainer).
        adr: Automatic domain randomisation of training episodes (off by default; never
            evaluation's).
        seed: Seed of the algorithm, the networks and the training environments, in
            [0, 2^32 - 1].
        total_timesteps: SB3's budget: environment steps to train for (a resumed run counts
            from its start; at most 10^12); ``None``: ``SB3_DEFAULT_TIMESTEPS``, resolved here.
            Group algorithms count their budget in ``algo.iterations`` and refuse it.
        max_minutes: A guard, not a budget: stop training after this wall-clock time
            (``None``: no limit).
        n_envs: SB3's parallel training environments (subprocesses when > 1; at most 8 per
            CPU of this machine, ``harness.config.bounds.PROCESSES_PER_CPU``); ``None``: 1,
            resolved here. Group algorithms refuse it (their rollouts run on
            ``algo.workers``).
        checkpoint_every_steps: Steps between ``checkpoints/latest`` saves (also saved at the
            end); at most 10^12.
        resume: Continue the run in this run directory from ``checkpoints/latest``.
        overwrite: Start afresh in a run directory that holds an earlier run which cannot be
            resumed (no ``checkpoints/latest``): its files are moved to
            ``replaced/<time>/`` inside it first, never deleted. Without it such a directory
            is refused.
        reward: ``dense`` (the task's reward terms) or ``verifier`` (the detector's verdict);
            ``auto`` resolves to ``dense`` for SB3 and ``verifier`` for the group algorithms,
            which score each attempt by the verifier's binary verdict and refuse ``dense``.
        device: Torch device of the networks: ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or
            ``auto`` (the first available of cuda, mps, cpu).
        torch_threads: Torch threads of the main process (workers always use one); at most
            8 per CPU of this machine.
        plugins: Modules imported before the config is checked, which register their own
            policy kinds, action heads or tasks (``harness.policies.register_head``...); the
            rollout workers import them too, and a saved policy names the ones it needs.
    """

    task: TaskOptions = field(default_factory=TaskOptions)
    algo: AlgoConfig = MISSING
    policy: PolicyConfig = MISSING
    curriculum: CurriculumConfig = MISSING
    detector: dict[str, Any] = field(default_factory=dict)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    detector_refresh: DetectorRefreshConfig = field(default_factory=DetectorRefreshConfig)
    adr: AdrConfig = field(default_factory=AdrConfig)
    seed: int = 0
    total_timesteps: int | None = None
    max_minutes: float | None = None
    n_envs: int | None = None
    checkpoint_every_steps: int = 10_000
    resume: bool = False
    overwrite: bool = False
    reward: str = "auto"
    device: str = "cpu"
    torch_threads: int = 1
    plugins: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from harness.policies import resolve_device  # imports torch: here, not at import
        for name, value in _numbers(self):
            check(math.isfinite(value), f"{name}={value}; must be a finite number")
        self._check_family_options()
        check_count("torch_threads", self.torch_threads, 1, max_processes())
        check_count("checkpoint_every_steps", self.checkpoint_every_steps, 1, MAX_TIMESTEPS)
        check(self.max_minutes is None or self.max_minutes > 0,
              f"max_minutes={self.max_minutes}; must be > 0 or null")
        check_count("seed", self.seed, 0, MAX_SEED)
        check(self.reward in REWARDS, f"reward={self.reward!r}; choose one of {REWARDS}")
        check(self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps"),
              f"device={self.device!r}; expected cpu, cuda, cuda:N, mps or auto")
        try:
            resolve_device(self.device)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if self.reward == "auto":
            self.reward = "verifier" if self.algo.family == "group" else "dense"
        check(self.reward == "verifier" or self.algo.family == "sb3",
              f"reward={self.reward!r} with algo={self.algo.name!r}: group algorithms score "
              "each attempt by the verifier's binary verdict; use reward=verifier (their "
              "default) with detector=scripted (ground truth) or detector=cnn")
        learned = (self.detector or {}).get("name", "scripted") != "scripted"
        check(not learned or self.reward == "verifier",
              f"detector={self.detector.get('name')!r} is only read with reward=verifier; "
              f"reward={self.reward!r} would ignore it")
        if self.reward == "verifier":
            self._check_detector()
        if self.algo.family == "group":
            default = VerifierConfig()
            check(self.verifier == default,
                  f"verifier={dataclasses.asdict(self.verifier)} with algo={self.algo.name!r}: "
                  "the group trainer scores the last frame of each attempt (verifier.when="
                  "final) and the verdict is the reward (verifier.mode=replace), without "
                  "ending episodes on a detection; these verifier options are SB3's")
        check(self.detector_refresh.every == 0 or (
                  self.algo.family == "group" and self.reward == "verifier"
                  and (self.detector or {}).get("name") == "cnn"),
              f"detector_refresh.every={self.detector_refresh.every} refreshes a learned "
              f"verifier during a group-trainer run; this run has algo={self.algo.name!r}, "
              f"reward={self.reward!r}, detector={(self.detector or {}).get('name')!r} (use a "
              "group algorithm with reward=verifier detector=cnn, or detector_refresh.every=0)")
        self._check_policy()
        self._check_batch()
        self._check_curriculum()
        self._check_seed_ranges()
        self.adr.check(self.task.name, self.task.imperfections)

    def _check_family_options(self) -> None:
        """Refuse, by name, the top-level options the chosen algorithm family would ignore,
        and resolve SB3's defaults (``total_timesteps``, ``n_envs``) so that they are ints."""
        if self.algo.family == "sb3":
            if self.total_timesteps is None:
                self.total_timesteps = SB3_DEFAULT_TIMESTEPS
            if self.n_envs is None:
                self.n_envs = 1
            check_count("total_timesteps", self.total_timesteps, 1, MAX_TIMESTEPS)
            check_count("n_envs", self.n_envs, 1, max_processes())
            return
        check(self.total_timesteps is None,
              f"total_timesteps={self.total_timesteps} with algo={self.algo.name!r}: group "
              "algorithms count their budget in algo.iterations; remove total_timesteps="
              f"{self.total_timesteps} and set algo.iterations (now {self.algo.iterations}) "
              "instead")
        check(self.n_envs is None,
              f"n_envs={self.n_envs} with algo={self.algo.name!r}: group algorithms play "
              "their attempts on algo.workers rollout workers and ignore n_envs; remove "
              f"n_envs={self.n_envs} (set algo.workers instead)")

    def _check_detector(self) -> None:
        import success_detectors  # imports torch: here, not at import
        check(bool(self.detector.get("name")),
              f"reward=verifier needs a detector with a name (e.g. detector=scripted); "
              f"got detector={self.detector}")
        # The scripted predicate would pick the frame the learned detector then scores.
        check(self.detector["name"] == "scripted" or not self.task.terminate_on_success,
              f"task.terminate_on_success=true with detector={self.detector['name']!r}: the "
              "episode would end on the simulator's ground-truth success, so the frame the "
              "learned detector scores is chosen by the ground truth it replaces; set "
              "task.terminate_on_success=false (SB3 can end episodes on the detector with "
              "verifier.when=every_step verifier.terminate_on_detection=true)")
        try:
            success_detectors.make(dict(self.detector), task=self.task.name)
        except (ValueError, FileNotFoundError) as error:
            raise ConfigError(f"detector: {error}") from None

    def _check_policy(self) -> None:
        policy, obs_mode = self.policy.name, self.task.obs_mode
        self.policy.check_family(self.algo.family, self.algo.name)
        needed = type(self.policy).reads
        check(needed in OBS_MODE_KEYS[obs_mode],
              f"policy={policy!r} reads {needed!r} observations, which task.obs_mode="
              f"{obs_mode!r} does not give; use task.obs_mode in "
              f"{[m for m, keys in OBS_MODE_KEYS.items() if needed in keys]}")

    def _check_batch(self) -> None:
        if self.algo.name in ("ppo", "trpo"):
            rollout = self.algo.n_steps * self.n_envs
            batch_size = self.algo.batch_size
            check(batch_size <= rollout,
                  f"algo.batch_size={batch_size} exceeds a rollout of algo.n_steps="
                  f"{self.algo.n_steps} x n_envs={self.n_envs} = {rollout} steps")

    def _check_curriculum(self) -> None:
        group_size = self.curriculum_params().get("group_size")
        check(group_size is None or group_size >= 2,
              f"curriculum={self.curriculum.name!r} weighs bins by the signal of groups of "
              f"algo.group_size={group_size} attempts; it needs algo.group_size >= 2")

    def curriculum_params(self) -> dict[str, Any]:
        """Keyword parameters of ``harness.curriculum.make`` (without ``seed``): the group file's
        fields, with the success band's G taken from ``algo.group_size`` (one value, so the
        band weighs bins by the groups the trainer really plays)."""
        group_size = getattr(self.algo, "group_size", SB3_BAND_GROUP_SIZE)
        return self.curriculum.params(self.task.difficulty, group_size)

    @property
    def seeds(self) -> Seeds:
        """Every stream of random numbers the run draws (:class:`harness.config.seeds.Seeds`);
        nothing else reads ``seed``."""
        demo_seed = self.algo.demo_seed if self.algo.family == "group" else None
        return Seeds(self.seed, demo_seed)

    def seed_ranges(self) -> dict[str, list[int]]:
        """Every range of ``reset`` seeds this run plays, as ``{name: [first, stop)}``.

        ``train``: start states of training (group trainer: one seed per snapshotted start
        state; SB3: the first reset of each environment, later resets continue its RNG, and
        ``train_resumed`` the reseeding of a resumed run);
        ``demo``: scripted-expert demos of ``algo.start_policy.bc.demos`` (at most
        ``MAX_TRIES_PER_DEMO`` attempts per demo, from :attr:`Seeds.demos
        <harness.config.seeds.Seeds.demos>`); ``start_demo``: the demos of ``demo`` starts
        (``algo.starts.demos``, when ``algo.starts.weights`` gives them a share; recorded from
        the same first seed, ``harness.algos.group.start_states.demo_start_file``);
        ``state_pretrain``: noisy-expert episodes of the state-feature pretraining;
        ``validation``: periodic evaluations and, for group algorithms, the start policy's,
        which choose its better decoding; ``test``: the final evaluation and the start
        policy's.

        With ``algo.start_policy.file`` the ``demo`` and ``state_pretrain`` ranges are listed
        all the same: the other ``algo.start_policy`` options then say how the loaded start was
        cloned (the arms of an experiment share one, ``harness.start_policy.keep_start_policy``),
        and what it was cloned on must stay out of evaluation. :meth:`_check_seed_ranges`
        refuses any overlap with a ``HELD_OUT_RANGES`` range.
        """
        algo, seeds, ranges = self.algo, self.seeds, {}
        if algo.family == "group":
            first = seeds.train_start(0)
            ranges["train"] = [first, first + algo.iterations * algo.num_start_states *
                               MAX_RESAMPLE_ROUNDS]
            start, demos = algo.start_policy, seeds.demos
            if start.bc.demos > 0:
                ranges["demo"] = [demos, demos + MAX_TRIES_PER_DEMO * start.bc.demos]
            if algo.starts.shares["demo"] > 0:
                ranges["start_demo"] = [demos, demos + MAX_TRIES_PER_DEMO * algo.starts.demos]
            episodes = start.state_pretrain.episodes
            if start.clones and episodes > 0 and self.task.obs_mode != "state":
                ranges["state_pretrain"] = [seeds.state_pretrain,
                                            seeds.state_pretrain + episodes]
        else:
            ranges["train"] = [self.seed, self.seed + self.n_envs]
            first = seeds.resumed_envs(0)  # a resumed run reseeds its envs here
            ranges["train_resumed"] = [first, first + self.total_timesteps + self.n_envs]
        if self.eval.every_steps or algo.family == "group":
            ranges["validation"] = [self.eval.validation_seed,
                                    self.eval.validation_seed + self.eval.episodes]
        ranges["test"] = [self.eval.seed, self.eval.seed + self.eval.final_episodes]
        return ranges

    def _check_seed_ranges(self) -> None:
        """Refuse, naming both, a held-out range that shares a seed with any other range."""
        ranges = self.seed_ranges()
        pairs = [(held_out, name) for held_out in HELD_OUT_RANGES if held_out in ranges
                 for name in ranges if name != held_out]
        for pair in pairs:
            (a, (first_a, stop_a)), (b, (first_b, stop_b)) = sorted(
                ((name, ranges[name]) for name in pair), key=lambda item: item[1])
            check(stop_a <= first_b,
                  f"seed ranges overlap: {a} plays reset seeds [{first_a}, {stop_a}) (first, "
                  f"stop) and {b} plays [{first_b}, {stop_b}); a start state must not be both "
                  "trained on (or chosen on) and evaluated on: change seed, eval.seed, "
                  "eval.validation_seed or algo.demo_seed")


def _numbers(node: Any, prefix: str = "") -> list[tuple[str, float]]:
    """Every float of a config tree (dataclasses, dicts, lists) with its dotted name."""
    if dataclasses.is_dataclass(node):
        items = [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]
    elif isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(node)]
    else:
        return [(prefix.rstrip("."), float(node))] if isinstance(node, float) else []
    found = []
    for key, value in items:
        found += _numbers(value, f"{prefix}{key}.")
    return found
