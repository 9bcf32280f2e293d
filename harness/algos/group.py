"""Group-relative fine-tuning of token policies: GRPO, Dr. GRPO, RLOO, critic baseline, REINFORCE.

One iteration, in the order of the papers (Shao et al. 2024; Liu et al. 2025):

1. draw B start states (difficulty from the curriculum, reset through its ``reset_options``)
   and snapshot them;
2. roll out G attempts from each by restoring its snapshot (:mod:`harness.algos.rollouts`);
3. score every attempt with the verifier (``reward=verifier``: the scripted predicate, or a
   learned detector on the last frame) -> one binary reward per attempt;
4. advantages per group by the estimator (:class:`~harness.algos.group_update.GroupTrainer`);
   groups whose advantages are all zero carry no signal and are counted, and kept, dropped or
   re-sampled (``algo.zero_signal``);
5. ``num_iterations`` epochs of minibatch updates of the clipped surrogate
   (``harness.objectives.policy_loss``) against the sampling policy, with an optional k3 KL
   penalty to a frozen copy of the starting policy.

Evaluation: the start policy and the final policy play the same test seeds (``eval.seed``),
greedy and sampled, and the summary gives the paired difference with its interval and exact
McNemar p-value; periodic evaluations and the ``best`` checkpoint use the validation seeds
(``eval.validation_seed``).

An attempt's tokens are every action dimension of every step until it ends, so successful attempts
that terminate early are shorter: that is where GRPO's per-attempt length normalisation and
Dr. GRPO's constant normaliser differ.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import time
from typing import Any

import torch
from tqdm import tqdm

import tasks
from harness import curriculum as curricula
from harness.algos import pools, ray_cluster
from harness.algos.collect import (
    build_detector,
    build_refresher,
    collect_groups,
    evaluate_in_pool,
    rollout_metrics,
)
from harness.algos.group_checkpoints import (  # noqa: F401 - the trainer module's interface
    _policy_fn,
    _policy_from_checkpoint,
    load_policy,
    read_checkpoint,
    validate_checkpoint,
)
from harness.algos.group_update import GroupTrainer
from harness.algos.hooks import Schedule, TimeGuard, better, release_free_memory, score
from harness.algos.start_states import StartStates, demo_start_file
from harness.config import MAX_RESAMPLE_ROUNDS
from harness.demos import load_demo_snapshots
from harness.evaluation import evaluate
from harness.policies import (
    TokenPolicy,
    resolve_device,
)
from harness.policies import load_policy as load_token_policy
from harness.policies import make as make_policy
from harness.start_policy import cloned_start_policy, keep_start_policy
from harness_common.stats import paired_summary

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ policies
HAS_REFERENCE_POLICY = True  # checkpoints also hold the frozen start policy


def _initial_policy(cfg, observation_space, device) -> tuple[TokenPolicy, dict[str, Any]]:
    """The starting policy: ``algo.init_policy``, else BC on ``algo.bc_demos`` demos or on the
    ``algo.bc_dataset`` folder, else fresh."""
    algo = cfg.algo
    if algo.init_policy:
        policy = load_token_policy(algo.init_policy, observation_space)
        if policy.config.kind != cfg.policy.name:
            raise ValueError(f"algo.init_policy={algo.init_policy} holds a "
                             f"{policy.config.kind!r} policy; this run's policy is "
                             f"{cfg.policy.name!r}")
        return policy, {}
    if algo.bc_demos > 0 or algo.bc_dataset:
        return cloned_start_policy(
            cfg.task.name, cfg.task.env_options(), cfg.policy.token_policy_config(),
            algo.bc_demos, algo.bc_epochs,
            cfg.task.difficulty if algo.bc_difficulty is None else algo.bc_difficulty,
            seed=cfg.seed,
            progress=cfg.logger.progress_bar,
            state_pretrain_episodes=algo.state_pretrain_episodes,
            state_pretrain_epochs=algo.state_pretrain_epochs,
            state_pretrain_shift_pad=algo.state_pretrain_shift_pad,
            bc_shift_pad=algo.bc_shift_pad,
            bc_lr=algo.bc_lr,
            bc_keep=algo.bc_keep,
            device=str(device),
            dataset=algo.bc_dataset,
            noise=algo.bc_noise,
        )
    config = cfg.policy.token_policy_config()
    if config.normalize_state:
        log.warning("policy.normalize_state=true, but no behaviour cloning fits its statistics "
                    "(algo.bc_demos=0, no algo.bc_dataset): the state stays unscaled")
    return make_policy(config, observation_space), {}


# ------------------------------------------------------------------------------- the loop
def preflight(cfg) -> None:
    """Checks that need more than the config, before the run directory is touched: the Ray
    cluster of ``algo.rollout.backend=ray`` joined and large enough (when an address is given),
    the device's dtypes."""
    ray_cluster.preflight(cfg.algo.rollout, cfg.algo.workers)
    if hasattr(cfg.policy, "check_device"):  # hf_vla: bfloat16 only where the device has it
        cfg.policy.check_device(resolve_device(cfg.device))


def train(cfg, run) -> dict[str, Any]:
    """Fine-tune a token policy with the group-relative algorithm ``cfg.algo.name``.

    Args:
        cfg: A validated ``harness.config.TrainConfig`` whose ``algo`` is a group algorithm.
        run: The ``harness.runs.Run`` to write metrics, checkpoints and videos into.

    Returns:
        The final evaluation's summary (``success_rate`` greedy, ``sampled_success_rate``,
        ``success_interval``...), the start policy's on the same test seeds, the paired
        ``improvement`` with its interval and p-value, ``env_steps``, ``iterations`` and
        ``time_limit_reached``.
    """
    algo = cfg.algo
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.torch_threads)
    # Subnormal floats appear in the CNN's activations and gradients as fine-tuning goes on and
    # make x86 CPUs crawl: one fine-tuned TinyVLA's forward+backward took 0.59 s per 128 frames
    # with them and 0.21 s flushed to zero. Flushing costs no accuracy at these magnitudes.
    torch.set_flush_denormal(True)
    task_options = cfg.task.env_options()
    probe = tasks.make(cfg.task.name, **task_options)
    starts_env = tasks.make(cfg.task.name, **{**task_options, "obs_mode": "state"})
    adr = curricula.make_adr(cfg.adr, cfg.seed)  # ADR of reset starts, or None
    if adr is not None:
        starts_env = curricula.NextResetOptions(starts_env)  # ADR's ranges reach its resets
    iteration = env_steps = start_counter = 0
    best: dict[str, float] | None = None
    evaluation = Schedule(cfg.eval.every_steps)
    checkpointing = Schedule(cfg.checkpoint_every_steps)
    start: dict[str, Any] = {}
    start_outcomes: list[bool] = []
    resume_state = None
    if run.resume_metadata is not None:  # the checkpoint holds the weights and the reference
        resume_state = read_checkpoint(run.checkpoints_dir / "latest.pt")
        policy = _policy_from_checkpoint(resume_state)
    else:
        policy, start = _initial_policy(cfg, probe.observation_space, device)
        start["start_policy"] = keep_start_policy(policy, run.dir, algo.init_policy)
    trainer = GroupTrainer(cfg, policy, device)
    trainer.max_tokens = probe.max_episode_steps * policy.config.action_dim
    curriculum = curricula.make(cfg.curriculum.name, seed=cfg.seed, **cfg.curriculum_params())
    demos = None
    if algo.start_weights["demo"] > 0:
        demos = load_demo_snapshots(demo_start_file(cfg, progress=cfg.logger.progress_bar))
    starts = StartStates(cfg, curriculum, starts_env, demos)
    detector = build_detector(cfg, probe)
    verifier_view = (detector.camera, int(detector.image_size)) if detector is not None else None
    refresher = build_refresher(cfg, detector, run.dir / "detector_refresh")

    if resume_state is not None:
        trainer.load_state_dict(resume_state["trainer"])
        curriculum.load_state_dict(resume_state["curriculum"])
        if "starts" in resume_state:
            starts.load_state_dict(resume_state["starts"])
        if adr is not None:
            adr.load_state_dict(resume_state["adr"])
        if refresher is not None and resume_state.get("detector_refresh") is not None:
            refresher.load_state_dict(resume_state["detector_refresh"])
        iteration, env_steps = resume_state["iteration"], resume_state["env_steps"]
        best, start = resume_state["best"], resume_state["start"]
        if isinstance(best, float):  # checkpoints that kept the success rate alone
            best = None if best < 0 else {"success_rate": best, "mean_return": -math.inf}
        start_outcomes = list(resume_state.get("start_outcomes", []))
        start_counter = resume_state.get(
            "start_counter", iteration * algo.num_start_states * MAX_RESAMPLE_ROUNDS)
        schedules = resume_state.get("schedules", {})
        evaluation.load_state_dict(schedules.get("evaluation"))
        checkpointing.load_state_dict(schedules.get("checkpoint"))
        log.info("resumed at iteration %d, %d env steps", iteration, env_steps)

    attempts_per_iteration = algo.num_start_states * algo.group_size
    envs_per_worker = max(1, math.ceil(attempts_per_iteration / algo.workers))
    pool = pools.make_pool(algo.rollout, algo.workers,
                           (cfg.task.name, task_options, (policy.config, policy.obs_shapes),
                            envs_per_worker, verifier_view,
                            algo.replay_every if starts.replay_wanted else 0,
                            trainer.freeze_encoder))
    eval_difficulties = list(cfg.eval.difficulties) or [cfg.task.difficulty]

    def env_factory(render: bool = False):
        return lambda: tasks.make(cfg.task.name, render_mode="rgb_array" if render else None,
                                  **task_options)

    def save(name: str, result=None) -> None:
        state = {
            "policy_config": dataclasses.asdict(policy.config),
            "obs_shapes": {k: list(v) for k, v in policy.obs_shapes.items()},
            "trainer": trainer.state_dict(), "curriculum": curriculum.state_dict(),
            "starts": starts.state_dict(),
            "adr": adr.state_dict() if adr is not None else None,
            "detector_refresh": refresher.state_dict() if refresher is not None else None,
            "iteration": iteration, "env_steps": env_steps, "best": best, "start": start,
            "start_outcomes": start_outcomes, "start_counter": start_counter,
            "temperature": algo.temperature,
            "schedules": {"evaluation": evaluation.state_dict(),
                          "checkpoint": checkpointing.state_dict()},
        }

        def write(handle) -> None:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            handle.write(buffer.getvalue())

        extra = {"iteration": iteration,
                 "evaluation": {"difficulties": eval_difficulties, "seed": cfg.eval.seed,
                                "validation_seed": cfg.eval.validation_seed,
                                "max_episode_steps": cfg.eval.max_episode_steps}}
        if result is not None:
            extra["validation_success_rate"] = result.success_rate
        run.save_checkpoint(name, ".pt", write, run.checkpoint_metadata(env_steps, **extra))
        if hasattr(policy, "save_pretrained"):  # hf_vla: also a transformers folder (safetensors)
            policy.save_pretrained(run.checkpoints_dir / f"{name}_pretrained")

    def play(which: TokenPolicy, seed: int, episodes: int, sampled: bool = False,
             videos: int = 0):
        """Evaluate ``which`` on ``episodes`` seeds from ``seed``: greedy through the rollout
        pool, sampled (seeded by ``seed``, the training RNG untouched) or filmed in this
        process, one episode after the other."""
        which.eval()
        if not sampled and not videos:
            result = evaluate_in_pool(pool, which, probe, episodes, eval_difficulties, seed,
                                      cfg.eval.max_episode_steps)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                result = evaluate(_policy_fn(which, sampled, algo.temperature),
                                  env_factory(render=videos > 0), episodes, eval_difficulties,
                                  seed, videos, cfg.eval.max_episode_steps)
        which.train()
        return result

    def test_both(which: TokenPolicy, prefix: str, videos: int = 0):
        greedy = play(which, cfg.eval.seed, cfg.eval.final_episodes, videos=videos)
        sampled = play(which, cfg.eval.seed, cfg.eval.final_episodes, sampled=True)
        run.log({**greedy.metrics(prefix), **sampled.metrics(f"{prefix}_sampled")}, env_steps)
        return greedy, sampled

    if resume_state is None:
        # The starting policy on the test seeds of the final evaluation: what RL adds is
        # measured against this, episode by episode (the BC policy in the main job).
        before, before_sampled = test_both(policy, "start")
        start.update({"start_success_rate": before.success_rate,
                      "start_success_interval": list(before.success_interval),
                      "start_sampled_success_rate": before_sampled.success_rate})
        start_outcomes = [e.success for e in before.episodes]
        run.log({k: v for k, v in start.items() if isinstance(v, (int, float))}, 0)
        save("latest")
    guard = TimeGuard(run, cfg.max_minutes)
    bar = tqdm(total=algo.iterations, initial=iteration, unit="it",
               desc=f"{algo.name} {cfg.task.name}", disable=not cfg.logger.progress_bar,
               dynamic_ncols=True)
    try:
        try:
            while iteration < algo.iterations:
                if guard.expired(env_steps):
                    break
                t0 = time.perf_counter()
                collected, start_counter = collect_groups(cfg, pool, trainer, starts, detector,
                                                          iteration, start_counter, adr=adr)
                env_steps += int(collected.rollout.lengths.sum())
                rollout_s = time.perf_counter() - t0

                t1 = time.perf_counter()
                metrics = trainer.update(collected.rollout, collected.rewards, collected.advantages,
                                         collected.keep)
                iteration += 1
                metrics.update({
                    **rollout_metrics(collected, policy.config.action_dim),
                    "time/rollout_s": rollout_s, "time/update_s": time.perf_counter() - t1,
                    "time/iteration": float(iteration),
                    "rollout/worker_restarts": float(pool.restarts),
                    **curriculum.metrics(),
                    **starts.metrics(),
                    **(adr.metrics() if adr is not None else {}),
                })
                # label the scored frames; now and then, fine-tune on them
                if refresher is not None:
                    rollout = collected.rollout
                    metrics.update(refresher.observe(rollout.final_frames, collected.probabilities,
                                                     rollout.success, rollout.final_margin))
                    if refresher.due(iteration):
                        metrics.update(refresher.refresh())
                if evaluation.due(env_steps):
                    result = play(policy, cfg.eval.validation_seed, cfg.eval.episodes)
                    metrics.update(result.metrics("eval"))
                    evaluation.advance(env_steps)
                    if better(result, best):
                        best = score(result)
                        save("best", result)
                run.log(metrics, env_steps)
                if checkpointing.due(env_steps):
                    checkpointing.advance(env_steps)
                    save("latest")
                release_free_memory()  # the iteration's batches leave holes glibc would keep
                bar.update(1)
                bar.set_postfix(success=f"{metrics['rollout/success_rate']:.2f}",
                                signal=f"{metrics['rollout/signal_fraction']:.2f}",
                                minutes=f"{run.elapsed() / 60:.1f}")
            save("latest")
        finally:
            bar.close()
        # The best checkpoint is chosen on validation seeds only; without periodic evaluations
        # there is no validation, and the last policy is the best one.
        if cfg.eval.every_steps:
            validation = play(policy, cfg.eval.validation_seed, cfg.eval.episodes)
            run.log(validation.metrics("eval"), env_steps)
            if better(validation, best):
                best = score(validation)
                save("best", validation)
        else:
            save("best")
        final, final_sampled = test_both(
            policy, "final", cfg.eval.video_episodes if cfg.logger.videos else 0)
        if cfg.logger.videos and final.videos:
            for i, frames in enumerate(final.videos):
                run.write_video(f"final_eval_{i}", frames)
    finally:  # the final evaluations play in the pool too
        pool.close()
        probe.close()
        starts_env.close()
    final_outcomes = [e.success for e in final.episodes]
    paired: dict[str, Any] = {}
    if len(start_outcomes) == len(final_outcomes):  # checkpoints from before the pairing lack it
        paired = paired_summary(start_outcomes, final_outcomes)
        run.log({"final/improvement": paired["improvement"],
                 "final/improvement_p_value": paired["improvement_p_value"]}, env_steps)
    return {
        **final.summary(), "sampled_success_rate": final_sampled.success_rate,
        "sampled_success_interval": list(final_sampled.success_interval),
        **start, **paired, "env_steps": env_steps, "iterations": iteration,
        "time_limit_reached": guard.reached,
        "seed_ranges": cfg.seed_ranges(), "device": str(device), "best_eval": best,
        "start_states": {"sources": algo.start_states, "weights": dict(algo.start_weights)},
    }
