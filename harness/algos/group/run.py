"""Group-relative fine-tuning of the harness's policies: GRPO, Dr. GRPO, RLOO, critic baseline,
REINFORCE.

:class:`GroupRun` is one run of the group trainer. Its :meth:`~GroupRun.iteration` follows the
papers (Shao et al. 2024; Liu et al. 2025):

1. draw B start states (difficulty from the curriculum, reset through its ``reset_options``)
   and snapshot them;
2. roll out G attempts from each by restoring its snapshot (:mod:`harness.algos.rollout.core`);
3. score every attempt with the verifier (``reward=verifier``: the scripted predicate, or a
   learned detector on the last frame) -> one binary reward per attempt;
4. advantages per group by the estimator (:class:`~harness.algos.group.update.GroupTrainer`);
   groups whose advantages are all zero carry no signal and are counted, and kept, dropped or
   re-sampled (``algo.zero_signal``);
5. ``num_iterations`` epochs of minibatch updates of the clipped surrogate
   (``harness.objectives.policy_loss``) against the sampling policy, with an optional k3 KL
   penalty to a frozen copy of the starting policy.

Evaluation: the start policy and the final policy play the same test seeds (``eval.seed``),
greedy and sampled, and the summary gives the paired difference with its interval and exact
McNemar p-value, against the start's greedy decoding and against its better decoding, chosen on
the validation seeds (:mod:`harness.algos.group.summary`); periodic evaluations and the ``best``
checkpoint use the validation seeds (``eval.validation_seed``).

An attempt's tokens are every action dimension of every step it played (with action chunks, the
executed steps of each decision), so successful attempts that terminate early are shorter: that
is where GRPO's per-attempt length normalisation and Dr. GRPO's constant normaliser differ.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import torch
from tqdm import tqdm

import tasks
from harness import curriculum as curricula
from harness.algos.group import checkpoints
from harness.algos.group import summary as group_summary
from harness.algos.group.anchor import BCAnchor
from harness.algos.group.collect import (
    build_detector,
    build_refresher,
    collect_groups,
    evaluate_in_pool,
    rollout_metrics,
)
from harness.algos.group.start_states import StartStates, demo_start_file
from harness.algos.group.update import GroupTrainer
from harness.algos.hooks import Schedule, TimeGuard, better, release_free_memory, score
from harness.algos.rollout import pools, ray_cluster
from harness.algos.rollout.records import EngineSpec
from harness.config import TrainConfig
from harness.demos import load_demo_snapshots
from harness.evaluation import EvaluationResult, evaluate
from harness.policies import Policy, resolve_device
from harness.policies.heads import noise_bounded
from harness.policies.residual.model import residual_of
from harness.policies.saving import policy_record
from harness.runs import Run
from harness.start_policy import StartPolicy, prepare_torch
from harness.start_policy.cloning import start_demonstrations

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("validation", "test")


class GroupRun:
    """One run of a group-relative algorithm (``cfg.algo.name`` in ``GROUP_ALGOS``).

    Building it builds everything the run needs around its start policy, in this order: the
    update rule (whose KL reference the start is), the curriculum, the start-state sources, the
    verifier and the rollout pool. Its state (:meth:`state_dict`) is the checkpoint.

    Args:
        cfg: A validated ``harness.config.TrainConfig`` whose ``algo`` is a group algorithm.
        run: The ``harness.runs.Run`` to write metrics, checkpoints and videos into.
        start: The start policy (:func:`harness.start_policy.build_start_policy`, which the
            training app runs first); ``None`` resumes from the latest checkpoint
            (``run.resume_metadata``).
    """

    takes_start_policy: ClassVar[bool] = True  # the app builds it first (harness.start_policy)

    has_reference_policy: ClassVar[bool] = True  # checkpoints also hold the frozen start policy

    def __init__(self, cfg: TrainConfig, run: Run, start: StartPolicy | None = None) -> None:
        self.cfg, self.run = cfg, run
        algo, seeds = cfg.algo, cfg.seeds
        self.device = resolve_device(cfg.device)
        if start is None:  # a resume: the checkpoint's networks are built as the start's were
            torch.manual_seed(seeds.generator)
        prepare_torch(cfg)
        self.task_options = cfg.task.env_options()
        self.probe = tasks.make(cfg.task.name, **self.task_options)
        self.starts_env = tasks.make(cfg.task.name, **{**self.task_options, "obs_mode": "state"})
        self.adr = curricula.make_adr(cfg.adr, seeds.generator)  # ADR of reset starts, or None
        if self.adr is not None:
            self.starts_env = curricula.NextResetOptions(self.starts_env)  # ADR's ranges reach
        self.iterations_done = self.env_steps = self.start_counter = 0
        self.best: dict[str, float] | None = None
        self.evaluation = Schedule(cfg.eval.every_steps)
        self.checkpointing = Schedule(cfg.checkpoint_every_steps)
        self.start: dict[str, Any] = {}
        self.baseline = group_summary.StartBaseline()  # the start's outcomes, paired later
        state = None
        if start is None:  # the checkpoint holds the weights and reference
            state = checkpoints.read_checkpoint(run.checkpoints_dir / "latest.pt")
            self.policy = checkpoints.policy_from_state(state)
        else:
            self.policy = start.policy
            self.start = {**start.metrics, "start_policy": start.file}
        # The start as cloned, when algo.residual or algo.exploration changes what trains.
        self.clone = None if start is None else self._prepare_start()
        self.trainer = GroupTrainer(cfg, self.policy, self.device)
        self.trainer.set_episode_limit(self.probe.max_episode_steps)
        if algo.bc_coef > 0:
            demos = start_demonstrations(cfg.task.name, self.task_options, algo.start_policy,
                                         seeds, progress=cfg.logger.progress_bar)
            self.trainer.anchor = BCAnchor(self.policy, demos, self.device, algo.bc_batch,
                                           seeds.bc_anchor, algo.start_policy.bc.shift_pad)
        self.curriculum = curricula.make(cfg.curriculum.name, seed=seeds.generator,
                                         **cfg.curriculum_params())
        demos = None
        if algo.starts.shares["demo"] > 0:
            demos = load_demo_snapshots(demo_start_file(cfg, progress=cfg.logger.progress_bar))
        self.starts = StartStates(cfg, self.curriculum, self.starts_env, demos)
        self.detector = build_detector(cfg, self.probe)
        self.refresher = build_refresher(cfg, self.detector, run.dir / "detector_refresh")
        if state is not None:
            self.load_state_dict(state)
            log.info("resumed at iteration %d, %d env steps", self.iterations_done,
                     self.env_steps)
        self.pool = self._make_pool()
        self.eval_difficulties = list(cfg.eval.difficulties) or [cfg.task.difficulty]
        self.guard = TimeGuard(run, cfg.max_minutes)

    # -------------------------------------------------------------------------- building
    @staticmethod
    def preflight(cfg: TrainConfig) -> None:
        """Checks that need more than the config, before the run directory is touched: the Ray
        cluster of ``algo.rollout.backend=ray`` joined and large enough (when an address is
        given), the device's dtypes."""
        ray_cluster.preflight(cfg.algo.rollout, cfg.algo.workers)
        cfg.policy.check_device(resolve_device(cfg.device))
        own_head = cfg.policy.head_name is not None  # hf_vla's and smolvla's heads are their own
        if cfg.algo.residual.scale > 0 and not own_head:
            raise ValueError(f"algo.residual puts a residual head on an mlp or tiny_vla start; "
                             f"policy={cfg.policy.name} has no head of the harness's own")
        head = "gaussian" if cfg.algo.residual.scale > 0 else cfg.policy.head_name  # what trains
        if cfg.algo.exploration.active and not (own_head and noise_bounded(head)):
            raise ValueError(f"algo.exploration bounds the noise scale of a gaussian or flow "
                             f"head; policy={cfg.policy.name} with head {head!r} has none "
                             "that it can bound (a tokens head explores by algo.temperature)")

    def _prepare_start(self) -> Policy | None:
        """Put a residual head on the frozen start (``algo.residual``), then bound (or fix)
        the trained head's noise scale (``algo.exploration``); the start as it was, whose own
        sampled decoding the start evaluation measures, is returned (``None``: unchanged)."""
        algo, clone = self.cfg.algo, None
        if algo.residual.scale > 0:
            clone = self.policy
            self.policy = residual_of(self.policy, algo.residual.scale,
                                      {"name": "gaussian",
                                       "log_std_init": algo.residual.log_std_init})
            log.info("algo.residual: a residual head of scale %g on the frozen start",
                     algo.residual.scale)
        if not algo.exploration.active:
            return clone
        bounds = algo.exploration
        clone = copy.deepcopy(self.policy) if clone is None else clone
        before = self.policy.exploration()
        self.policy.bound_exploration(bounds.low, bounds.high, bounds.fixed)
        after = self.policy.exploration()
        log.info("algo.exploration: noise scale %s -> %s", before, after)
        self.start.update({f"start_exploration/{k}": v for k, v in before.items()})
        self.start.update({f"bounded_exploration/{k}": v for k, v in after.items()})
        return clone

    def _make_pool(self):
        """The rollout workers: one env per attempt of an iteration, spread over the workers."""
        algo = self.cfg.algo
        attempts = algo.num_start_states * algo.group_size
        detector = self.detector
        verifier_view = (detector.camera, int(detector.image_size)) if detector else None
        return pools.make_pool(algo.rollout, algo.workers, EngineSpec(
            self.cfg.task.name, self.task_options, policy_record(self.policy),
            max(1, math.ceil(attempts / algo.workers)), verifier_view,
            algo.starts.replay_every if self.starts.replay_wanted else 0,
            self.trainer.freeze_encoder),
            preferred=self.policy.spec.rollout_mode)

    # ------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs (:mod:`harness.algos.group.checkpoints` has the format)."""
        record = policy_record(self.policy)
        return {
            "format": checkpoints.CHECKPOINT_FORMAT, "policy_config": record["config"],
            "policy_format": record["format"], "plugins": record["plugins"],
            "obs_shapes": record["obs_shapes"],
            "trainer": self.trainer.state_dict(), "curriculum": self.curriculum.state_dict(),
            "starts": self.starts.state_dict(),
            "adr": self.adr.state_dict() if self.adr is not None else None,
            "detector_refresh": (self.refresher.state_dict() if self.refresher is not None
                                 else None),
            "iteration": self.iterations_done, "env_steps": self.env_steps, "best": self.best,
            "start": self.start, **self.baseline.state_dict(),
            "start_counter": self.start_counter, "temperature": self.cfg.algo.temperature,
            "schedules": {"evaluation": self.evaluation.state_dict(),
                          "checkpoint": self.checkpointing.state_dict()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (:meth:`state_dict`, or an older format after
        :func:`~harness.algos.group.checkpoints.migrate`).

        Raises:
            harness.runs.CheckpointError: A field a resume reads is missing.
        """
        checkpoints.check_resumable(state, self.run.checkpoints_dir / "latest.pt")
        self.trainer.load_state_dict(state["trainer"])
        self.curriculum.load_state_dict(state["curriculum"])
        self.starts.load_state_dict(state["starts"])
        if self.adr is not None:
            self.adr.load_state_dict(state["adr"])
        if self.refresher is not None and state["detector_refresh"] is not None:
            self.refresher.load_state_dict(state["detector_refresh"])
        self.iterations_done, self.env_steps = state["iteration"], state["env_steps"]
        self.best, self.start = state["best"], state["start"]
        self.baseline.load_state_dict(state)
        self.start_counter = state["start_counter"]
        self.evaluation.load_state_dict(state["schedules"].get("evaluation"))
        self.checkpointing.load_state_dict(state["schedules"].get("checkpoint"))

    def save(self, name: str, result: EvaluationResult | None = None) -> Path:
        """Write checkpoint ``name`` (``latest`` or ``best``, the validation ``result`` that
        chose it in the metadata), crash-safe; ``hf_vla`` also as a transformers folder."""
        extra: dict[str, Any] = {
            "iteration": self.iterations_done,
            "evaluation": {"difficulties": self.eval_difficulties, "seed": self.cfg.eval.seed,
                           "validation_seed": self.cfg.eval.validation_seed,
                           "max_episode_steps": self.cfg.eval.max_episode_steps}}
        if result is not None:
            extra["validation_success_rate"] = result.success_rate
        write = partial(checkpoints.write_state, self.state_dict())
        path = self.run.save_checkpoint(name, ".pt", write,
                                        self.run.checkpoint_metadata(self.env_steps, **extra))
        if not self.policy.spec.single_file:  # hf_vla: a transformers folder beside it
            self.policy.save_pretrained(self.run.checkpoints_dir / f"{name}_pretrained")
        return path

    validate_checkpoint = staticmethod(checkpoints.validate_checkpoint)

    load_policy = staticmethod(checkpoints.load_policy)

    # ------------------------------------------------------------------------- evaluation
    def _play(self, which: Policy, seed: int, episodes: int, sampled: bool = False,
              videos: int = 0, temperature: float | None = None) -> EvaluationResult:
        """Evaluate ``which`` on ``episodes`` seeds from ``seed``: greedy through the rollout
        pool, sampled (seeded by ``seed``, the training RNG untouched; at ``temperature``, else
        ``algo.temperature``) or filmed in this process, one episode after the other."""
        cfg = self.cfg
        which.eval()
        if not sampled and not videos:
            result = evaluate_in_pool(self.pool, which, self.probe, episodes,
                                      self.eval_difficulties, seed, cfg.eval.max_episode_steps)
        else:
            make_env = partial(tasks.make, cfg.task.name,
                               render_mode="rgb_array" if videos > 0 else None,
                               **self.task_options)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                temperature = cfg.algo.temperature if temperature is None else temperature
                result = evaluate(checkpoints.policy_fn(which, sampled, temperature),
                                  make_env, episodes, self.eval_difficulties, seed, videos,
                                  cfg.eval.max_episode_steps)
        which.train()
        return result

    def evaluate(self, split: str, sampled: bool = False, videos: int = 0,
                 start: bool = False) -> EvaluationResult:
        """The current policy on the ``validation`` seeds (``eval.episodes`` of them, which
        choose ``best``) or the ``test`` seeds (``eval.final_episodes``, the reported figure),
        greedy or ``sampled``. With ``start``, sampled is the start as it was cloned: its own
        noise (before ``algo.exploration``) at temperature 1, the clone's own distribution.

        Raises:
            ValueError: An unknown split.
        """
        if split not in SPLITS:
            raise ValueError(f"split={split!r}; choose one of {SPLITS}")
        ev = self.cfg.eval
        seed, episodes = ((ev.validation_seed, ev.episodes) if split == "validation"
                          else (ev.seed, ev.final_episodes))
        if start and sampled:
            clone = self.clone if self.clone is not None else self.policy
            return self._play(clone, seed, episodes, True, videos, 1.0)
        return self._play(self.policy, seed, episodes, sampled, videos)

    def _test_both(self, prefix: str, videos: int = 0,
                   start: bool = False) -> tuple[EvaluationResult, ...]:
        """Greedy and sampled (the start's own, with ``start``) on the test seeds, logged as
        ``prefix`` and ``prefix_sampled``."""
        greedy = self.evaluate("test", videos=videos)
        sampled = self.evaluate("test", sampled=True, start=start)
        self.run.log({**greedy.metrics(prefix), **sampled.metrics(f"{prefix}_sampled")},
                     self.env_steps)
        return greedy, sampled

    def _consider_best(self, result: EvaluationResult) -> None:
        if better(result, self.best):
            self.best = score(result)
            self.save("best", result)

    # --------------------------------------------------------------------------- the loop
    def iteration(self) -> dict[str, float]:
        """One iteration: collect and score the groups, update the policy; its metrics."""
        t0 = time.perf_counter()
        collected, self.start_counter = collect_groups(
            self.cfg, self.pool, self.trainer, self.starts, self.detector, self.iterations_done,
            self.start_counter, adr=self.adr)
        self.env_steps += int(collected.rollout.lengths.sum())
        rollout_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        metrics = self.trainer.update(collected.rollout, collected.rewards,
                                      collected.advantages, collected.keep)
        self.iterations_done += 1
        metrics.update({
            **rollout_metrics(collected, self.policy.spec.action_dim),
            "time/rollout_s": rollout_s, "time/update_s": time.perf_counter() - t1,
            "time/iteration": float(self.iterations_done),
            "rollout/worker_restarts": float(self.pool.restarts),
            **self.curriculum.metrics(), **self.starts.metrics(),
            **(self.adr.metrics() if self.adr is not None else {}),
        })
        if self.refresher is not None:  # label the scored frames; now and then, fine-tune
            rollout = collected.rollout
            metrics.update(self.refresher.observe(rollout.final_frames, collected.probabilities,
                                                  rollout.success, rollout.final_margin))
            if self.refresher.due(self.iterations_done):
                metrics.update(self.refresher.refresh())
        return metrics

    def _validate_if_due(self) -> dict[str, float]:
        if not self.evaluation.due(self.env_steps):
            return {}
        result = self.evaluate("validation")
        self.evaluation.advance(self.env_steps)
        self._consider_best(result)
        return result.metrics("eval")

    def _budget_left(self) -> bool:
        return (self.iterations_done < self.cfg.algo.iterations
                and not self.guard.expired(self.env_steps))

    def _evaluate_start(self) -> None:
        """The starting policy (the BC policy in the main job), greedy and sampled, on the
        validation seeds, which choose its better decoding, and on the test seeds of the final
        evaluation: what RL adds is measured against these, episode by episode."""
        validation = self.evaluate("validation")
        validation_sampled = self.evaluate("validation", sampled=True, start=True)
        self.run.log({**validation.metrics("start_validation"),
                      **validation_sampled.metrics("start_validation_sampled")}, 0)
        self.baseline.choose_decoding(validation, validation_sampled)
        before, before_sampled = self._test_both("start", start=True)
        self.baseline.keep_test(before, before_sampled)
        self.clone = None  # measured: the bounded policy is the one that trains
        self.start.update({"start_success_rate": before.success_rate,
                           "start_success_interval": list(before.success_interval),
                           "start_sampled_success_rate": before_sampled.success_rate})
        self.run.log({k: v for k, v in self.start.items() if isinstance(v, (int, float))}, 0)
        self.save("latest")

    def train(self) -> dict[str, Any]:
        """Evaluate the start, iterate until the budget is spent, choose ``best`` on the
        validation seeds, evaluate on the test seeds; the run's summary."""
        try:
            if self.run.resume_metadata is None:
                self._evaluate_start()
            with tqdm(total=self.cfg.algo.iterations, initial=self.iterations_done, unit="it",
                      desc=f"{self.cfg.algo.name} {self.cfg.task.name}", dynamic_ncols=True,
                      disable=not self.cfg.logger.progress_bar) as bar:
                while self._budget_left():
                    metrics = self.iteration()
                    metrics.update(self._validate_if_due())
                    self.run.log(metrics, self.env_steps)
                    if self.checkpointing.due(self.env_steps):
                        self.checkpointing.advance(self.env_steps)
                        self.save("latest")
                    release_free_memory()  # the iteration's batches leave holes glibc keeps
                    bar.update(1)
                    bar.set_postfix(success=f"{metrics['rollout/success_rate']:.2f}",
                                    signal=f"{metrics['rollout/signal_fraction']:.2f}",
                                    minutes=f"{self.run.elapsed() / 60:.1f}")
                self.save("latest")
            # ``best`` is chosen on validation seeds only; without periodic evaluations there is
            # no validation, and the last policy is the best one.
            if self.cfg.eval.every_steps:
                validation = self.evaluate("validation")
                self.run.log(validation.metrics("eval"), self.env_steps)
                self._consider_best(validation)
            else:
                self.save("best")
            videos = self.cfg.eval.video_episodes if self.cfg.logger.videos else 0
            final = self._test_both("final", videos)
        finally:  # the final evaluations play in the pool too
            self.close()
        return self._summary(*final)

    def _summary(self, final: EvaluationResult, final_sampled: EvaluationResult
                 ) -> dict[str, Any]:
        for i, frames in enumerate(final.videos):
            self.run.write_video(f"final_eval_{i}", frames)
        paired = self.baseline.gains(final)
        if paired:  # pairs need the same test seeds
            self.run.log({f"final/{key}": paired[key] for key in group_summary.LOGGED
                          if key in paired}, self.env_steps)
        algo = self.cfg.algo
        return {
            **final.summary(), "sampled_success_rate": final_sampled.success_rate,
            "sampled_success_interval": list(final_sampled.success_interval),
            **self.start, **paired, "env_steps": self.env_steps,
            "iterations": self.iterations_done,
            "time_limit_reached": self.guard.reached,
            "seed_ranges": self.cfg.seed_ranges(), "device": str(self.device),
            "best_eval": self.best,
            "start_states": {"sources": algo.starts.source, "weights": algo.starts.shares},
        }

    def close(self) -> None:
        """Stop the rollout workers and close the environments."""
        self.pool.close()
        self.probe.close()
        self.starts_env.close()
