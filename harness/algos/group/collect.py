"""One iteration's groups: start states, rollouts, verifier scores, advantages, what is kept.

:func:`collect_groups` draws the start states from the curriculum (through its
``reset_options``), snapshots them, has the rollout pool play G attempts from each, scores every
attempt with the verifier, computes the estimator's advantages and decides which groups the
update trains on (``algo.zero_signal``); it feeds the curriculum the verifier's verdicts.

Sim-to-real options (docs/sim_to_real.md): with automatic domain randomisation each group that
starts from a reset plays the ranges ADR chose for it (all G attempts share the randomised model,
which the snapshot carries, and the imperfection scales, drawn once from the group's start and
passed with each attempt), and ADR is fed the group's verdicts; with ``algo.reset_noise`` each
attempt starts from its own perturbed copy of the group's snapshot, drawn from a generator
seeded by (run seed, iteration, round, attempt), so the attempts stay reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.algos.group.start_states import Start, StartStates
from harness.algos.group.update import GroupTrainer
from harness.algos.rollout.core import RolloutBatch
from harness.algos.rollout.pools import RolloutPool
from harness.algos.rollout.records import Job
from harness.config import MAX_RESAMPLE_ROUNDS
from harness.evaluation import Episode, EvaluationResult
from tasks.perturb import ResetNoise, perturbed_snapshots
from tasks.wrappers import imperfection_scales


# ---------------------------------------------------------------------------- scoring
def _score(rollout: RolloutBatch, detector
           ) -> tuple[np.ndarray, np.ndarray | None, dict[str, float]]:
    """Binary reward per attempt from the verifier, a learned one's probabilities (else
    ``None``), and its error rates against ground truth."""
    truth = rollout.success
    if detector is None:
        return truth.astype(np.float32), None, {}
    probs = np.asarray(detector.predict_proba({"pixels": rollout.final_frames}))
    verdict = probs >= detector.threshold
    positives, negatives = max(1, int(truth.sum())), max(1, int((~truth).sum()))
    return verdict.astype(np.float32), probs, {
        "detector/false_positive_rate": float((verdict & ~truth).sum() / negatives),
        "detector/false_negative_rate": float((~verdict & truth).sum() / positives),
        "detector/agreement": float((verdict == truth).mean()),
    }


def build_detector(cfg, env):
    """The learned detector of ``reward=verifier``; ``None`` means the scripted predicate, read
    from each attempt's ``info["is_success"]``. The config has already refused a learned
    detector without ``reward=verifier`` or with ``task.terminate_on_success``.

    Args:
        cfg: The run's config.
        env: An env as the rollout workers make them, whose camera mounts the detector's
            checkpoint must record (a checkpoint that records none passes with a warning).

    Raises:
        ValueError: A checkpoint for another task or camera, or one trained on frames of that
            camera mounted elsewhere.
    """
    name = (cfg.detector or {}).get("name", "scripted")
    if name == "scripted":
        return None
    import success_detectors

    detector = success_detectors.make(cfg.detector, task=cfg.task.name)
    detector.check_camera_mounts(env.unwrapped.camera_mounts(detector.camera))
    return detector


def build_refresher(cfg, detector, out_dir):
    """The in-run refresh of a learned verifier (``detector_refresh``), or ``None`` when off.
    The config has already refused it without a group algorithm and ``detector=cnn``."""
    if cfg.detector_refresh.every == 0 or detector is None:
        return None
    from success_detectors.refresh import DetectorRefresher

    return DetectorRefresher(detector, cfg.detector_refresh, cfg.seeds.generator, out_dir)


@dataclass
class Collected:
    """The groups of one iteration, scored, with their advantages and what is trained on.

    Attributes:
        rollout: Every attempt played (re-sampling rounds included).
        rewards: ``(A,)`` verifier rewards.
        advantages: ``(A,)`` by the run's estimator.
        keep: ``(groups,)`` bool, groups the update trains on.
        signal_groups: Groups whose advantages are not all zero.
        mixed_groups: Groups whose outcomes are not all equal.
        groups: Groups played.
        verifier: ``detector/...`` error rates of a learned verifier, averaged over rounds.
        probabilities: ``(A,)`` a learned verifier's success probabilities, else ``None``.
    """

    rollout: RolloutBatch
    rewards: np.ndarray
    advantages: torch.Tensor
    keep: np.ndarray
    signal_groups: int
    mixed_groups: int
    groups: int
    verifier: dict[str, float]
    probabilities: np.ndarray | None = None


@dataclass
class _Round:
    """One round's groups: their starts, ADR episodes and jobs, then how they scored."""

    origins: list[Start]
    episodes: list
    jobs: list[Job]
    rollout: RolloutBatch | None = None
    rewards: np.ndarray | None = None
    probabilities: np.ndarray | None = None
    verifier: dict[str, float] | None = None
    advantages: torch.Tensor | None = None
    keep: np.ndarray | None = None


def _group_jobs(cfg, starts: StartStates, start: Start, group: int, first: int, episode,
                options: dict, noise: ResetNoise, iteration: int, round_: int) -> list[Job]:
    """The G jobs of one group from ``start``; ``first`` is its first attempt's index in the
    round, which with (run seed, iteration, round) seeds its attempts' reset noise."""
    attempt_options = {}
    if episode is not None and "imperfections" in options:
        # Drawn here from the group's start, not by each attempt from its own (maybe
        # perturbed) copy of it: the G attempts play the same scales.
        scales = imperfection_scales(start.snapshot, options["imperfections"])
        attempt_options = {"imperfections": {n: (s, s) for n, s in scales.items()}}
    size = cfg.algo.group_size
    if noise.on:  # each attempt its own perturbed start
        generators = [np.random.default_rng(cfg.seeds.reset_noise(iteration, round_, first + a))
                      for a in range(size)]
        snapshots = perturbed_snapshots(starts.env, start.snapshot, noise, generators)
    else:
        snapshots = [start.snapshot] * size
    return [Job(snapshot, group, start.difficulty, attempt_options) for snapshot in snapshots]


def _draw_round(cfg, starts: StartStates, needed: int, noise: ResetNoise, iteration: int,
                round_: int, start_counter: int, adr) -> tuple[_Round, int]:
    """Draw ``needed`` groups' starts (ADR's ranges on the resets) and make their jobs."""
    drawn = _Round([], [], [])
    for group in range(needed):
        episode = adr.sample() if adr is not None else None
        options = adr.reset_options(episode) if episode is not None else {}
        if episode is not None:  # starts.env is a NextResetOptions (harness.algos.group.run)
            starts.env.set_next(options)
        start, start_counter = starts.draw(start_counter)
        if episode is not None:
            starts.env.set_next({})  # a demo or replay start reset nothing: withdraw them
            episode = episode if start.source == "reset" else None
        drawn.origins.append(start)
        drawn.episodes.append(episode)
        drawn.jobs += _group_jobs(cfg, starts, start, group, len(drawn.jobs), episode, options,
                                  noise, iteration, round_)
    return drawn, start_counter


def _score_round(cfg, drawn: _Round, trainer: GroupTrainer, starts: StartStates, detector,
                 adr) -> np.ndarray:
    """Score the round's attempts, weigh them, feed the curricula; its groups' signal."""
    algo = cfg.algo
    rollout = drawn.rollout
    drawn.rewards, drawn.probabilities, drawn.verifier = _score(rollout, detector)
    drawn.advantages = trainer.advantages(rollout, drawn.rewards)
    signal = trainer.group_has_signal(drawn.advantages)
    for group, outcomes in enumerate(drawn.rewards.reshape(-1, algo.group_size)):
        starts.record(drawn.origins[group], outcomes.tolist(), bool(signal[group]))
        if drawn.episodes[group] is not None:
            adr.update(drawn.episodes[group], outcomes.tolist())
    if rollout.closest is not None:
        starts.add_replays(rollout.closest, drawn.rewards > 0, rollout.difficulty)
    drawn.keep = (signal if algo.zero_signal in ("drop", "resample")
                  else np.ones_like(signal))
    return signal


def collect_groups(cfg, pool: RolloutPool, trainer: GroupTrainer, starts: StartStates,
                   detector, iteration: int, start_counter: int, adr=None
                   ) -> tuple[Collected, int]:
    """Roll out, score and weigh one iteration's groups; feed the curricula the verdicts.

    Each group's start comes from ``starts`` (fresh resets at the curriculum's difficulty,
    demonstration states or replays: :mod:`harness.algos.group.start_states`), which is fed the
    verifier's outcomes of the groups it started.

    With ``zero_signal=resample`` groups without signal are replaced by fresh ones, up to
    ``MAX_RESAMPLE_ROUNDS`` rounds, until ``num_start_states`` groups carry signal.

    Args:
        cfg: The run's config.
        pool: The rollout pool (:func:`harness.algos.rollout.pools.make_pool`).
        trainer: Its policy plays the attempts; its estimator weighs them.
        starts: Where each group starts.
        detector: The learned verifier, or ``None`` for the scripted predicate.
        iteration: The iteration (it seeds the attempts and their reset noise).
        start_counter: Start states drawn so far (it seeds the resets).
        adr: Automatic domain randomisation, or ``None``.

    Returns:
        The collected groups and the updated count of start states drawn (it seeds them).
    """
    algo = cfg.algo
    noise = ResetNoise(algo.reset_noise.position_mm / 1000.0, algo.reset_noise.rotation)
    rounds: list[_Round] = []
    signal_total = mixed_total = groups_total = 0
    for round_ in range(MAX_RESAMPLE_ROUNDS if algo.zero_signal == "resample" else 1):
        needed = algo.num_start_states
        if algo.zero_signal == "resample":
            needed -= sum(int(done.keep.sum()) for done in rounds)
        if needed <= 0:
            break
        drawn, start_counter = _draw_round(cfg, starts, needed, noise, iteration, round_,
                                           start_counter, adr)
        # Each attempt samples from its own generator, seeded by (run, iteration, round,
        # attempt): the attempts do not depend on how many workers play them.
        drawn.rollout = pool.run(trainer.policy, drawn.jobs, algo.temperature,
                                 seed=cfg.seeds.attempts(iteration, round_))
        signal = _score_round(cfg, drawn, trainer, starts, detector, adr)
        grouped = drawn.rewards.reshape(-1, algo.group_size)
        signal_total += int(signal.sum())
        mixed_total += int((grouped.max(axis=1) > grouped.min(axis=1)).sum())
        groups_total += len(signal)
        rounds.append(drawn)
    keep = np.concatenate([done.keep for done in rounds])
    if algo.zero_signal == "resample" and keep.sum() > algo.num_start_states:
        keep[np.flatnonzero(keep)[algo.num_start_states:]] = False
    verified = [done for done in rounds if done.verifier]
    collected = Collected(
        rollout=RolloutBatch.concat([done.rollout for done in rounds]),
        rewards=np.concatenate([done.rewards for done in rounds]),
        advantages=torch.cat([done.advantages for done in rounds]),
        keep=keep, signal_groups=signal_total, mixed_groups=mixed_total, groups=groups_total,
        verifier={k: float(np.mean([done.verifier[k] for done in verified]))
                  for k in (verified[0].verifier if verified else {})},
        probabilities=(np.concatenate([done.probabilities for done in verified])
                       if verified else None),
    )
    return collected, start_counter


def rollout_metrics(collected: Collected, action_dim: int) -> dict[str, float]:
    """``rollout/...`` and ``detector/...`` metrics of one iteration.

    With a learned verifier, where its false positives ended: the median and 90th percentile
    of their millimetres outside the success region (``Task.success_margin``), when it made any.
    """
    rollout, groups = collected.rollout, max(1, collected.groups)
    where = {}
    if rollout.final_margin is not None:
        false_positives = (collected.rewards > 0) & ~rollout.success
        if false_positives.any():
            margin_mm = 1000.0 * rollout.final_margin[false_positives]
            where = {"detector/false_positive_margin_mm_median": float(np.median(margin_mm)),
                     "detector/false_positive_margin_mm_p90": float(np.percentile(margin_mm, 90))}
    return {
        "rollout/success_rate": float(rollout.success.mean()),
        "rollout/verifier_success_rate": float(collected.rewards.mean()),
        "rollout/signal_fraction": collected.signal_groups / groups,
        "rollout/zero_signal_fraction": 1.0 - collected.signal_groups / groups,
        "rollout/mixed_outcome_fraction": collected.mixed_groups / groups,
        "rollout/mean_length_steps": float(rollout.lengths.mean()),
        "rollout/mean_length_tokens": float(rollout.lengths.mean() * action_dim),
        "rollout/attempts": float(len(rollout.lengths)),
        "rollout/difficulty_mean": float(rollout.difficulty.mean()),
        "time/env_s": rollout.timing["env"], "time/policy_s": rollout.timing["policy"],
        **collected.verifier, **where,
    }


# ---------------------------------------------------------------------------- evaluation
def evaluate_in_pool(pool: RolloutPool, policy, env, episodes: int, difficulties, seed: int,
                     max_episode_steps: int | None = None) -> EvaluationResult:
    """Greedy evaluation through the rollout pool: :func:`harness.evaluation.evaluate`'s
    episodes, played in lock-step by the pool's workers with batched policy calls.

    Episode ``j`` at difficulty ``d`` starts from the snapshot of ``env.reset(seed=seed + j,
    options={"difficulty": d})`` with imperfection noise key 0, which a restore plays exactly
    as that reset would (docs/tasks.md, tasks/wrappers.py), so the episodes are those of
    ``evaluate`` with a greedy policy function; only the batching of the policy's calls differs
    (its last bits can, in principle, turn a near-tie between two tokens).

    Args:
        pool: A rollout pool (:func:`harness.algos.rollout.pools.make_pool`) of the task ``env`` is.
        policy: The token policy to evaluate (its weights go to the workers).
        env: An environment of the task under the pool's options, used to make the starts.
        episodes: Episodes per difficulty.
        difficulties: Difficulties in [0, 1].
        seed: Seed of the first episode.
        max_episode_steps: Each episode's step limit (a reset option of the workers'
            environments); ``None`` keeps the pool's, the training attempts' limit.

    Returns:
        A :class:`harness.evaluation.EvaluationResult` without videos.

    Raises:
        ValueError: ``episodes`` < 1 or no difficulty.
    """
    if episodes < 1:
        raise ValueError(f"episodes={episodes}; must be >= 1")
    if not difficulties:
        raise ValueError("difficulties is empty; give at least one difficulty in [0, 1]")
    jobs, starts = [], []
    options = {"noise_key": 0}
    if max_episode_steps is not None:
        options["max_episode_steps"] = int(max_episode_steps)
    for difficulty in difficulties:
        for j in range(episodes):
            env.reset(seed=seed + j, options={"difficulty": float(difficulty)})
            jobs.append(Job(env.unwrapped.snapshot(), len(jobs), float(difficulty), options))
            starts.append((float(difficulty), seed + j))
    batch = pool.run(policy, jobs, 0.0, seed)
    return EvaluationResult([
        Episode(difficulty, episode_seed, bool(success), int(length), float(total))
        for (difficulty, episode_seed), success, length, total
        in zip(starts, batch.success, batch.lengths, batch.returns, strict=True)
    ])
