"""Benchmark group rollouts and updates of the group trainer (TinyVLA, pixel push).

Prints and writes JSON:
- attempts/s and env steps/s of group rollouts with 1 and 2 worker processes (their ratio is
  the scaling), the same jobs restored from the same snapshots;
- policy-update tokens/s (one epoch of GRPO minibatch updates on those rollouts), with the
  whole network trained, with the image encoder frozen (``algo.freeze_encoder``), and frozen
  with the image features the rollout workers send (what the trainer does);
- the share of an iteration spent rendering, stepping physics, running the policy and updating.
  Rendering is separated from physics by rolling the same jobs out once more with state
  observations (no camera): rendering = pixel env time - state env time.

usage: python benchmarks/bench_group.py [--groups 8] [--group-size 8]
           [--out bench_results/group.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import tasks  # noqa: F401  (headless GL backend before MuJoCo loads)
from harness import config as harness_config
from harness.algos.group.update import GroupTrainer
from harness.algos.rollout.pools import PerWorkerPool
from harness.algos.rollout.records import EngineSpec, Job
from harness.policies import make as make_policy
from harness.policies.saving import policy_record
from harness_common.files import atomic_write_text


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=8, help="start states B")
    parser.add_argument("--group-size", type=int, default=8, help="attempts per start state G")
    parser.add_argument("--difficulty", type=float, default=0.0)
    parser.add_argument("--out", type=Path, default=Path("bench_results/group.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    common = [f"task.difficulty={args.difficulty}", "task.max_episode_steps=60", "task=push"]
    overrides = [*common, "task.obs_mode=pixels", "policy=tiny_vla", "algo=grpo",
                 f"algo.group_size={args.group_size}", f"algo.num_start_states={args.groups}",
                 "algo.minibatch_size=16", "algo.num_iterations=1", "logger.tensorboard=false"]
    config = harness_config.compose(overrides)
    options = config.task.env_options()
    env = tasks.make("push", **options)
    policy = make_policy(config.policy, env.observation_space)
    starts = tasks.make("push", **{**options, "obs_mode": "state"})
    jobs = []
    for group in range(args.groups):
        starts.reset(seed=group, options={"difficulty": args.difficulty})
        jobs += [Job(starts.snapshot(), group, args.difficulty)] * args.group_size
    attempts = len(jobs)
    results: dict = {"attempts": attempts, "groups": args.groups, "group_size": args.group_size}

    print(f"{attempts} attempts ({args.groups} start states x {args.group_size}), pixel push 84x84")
    rollout = None
    for workers in (1, 2):
        pool = PerWorkerPool(EngineSpec("push", options, policy_record(policy),
                                        -(-attempts // workers)), workers)
        pool.run(policy, jobs[: 2 * workers], 1.0, seed=0)  # warm: renderers, imports
        start = time.perf_counter()
        rollout = pool.run(policy, jobs, 1.0, seed=1)
        seconds = time.perf_counter() - start
        pool.close()
        steps = int(rollout.lengths.sum())
        results[f"workers_{workers}"] = {
            "seconds": seconds, "attempts_per_s": attempts / seconds,
            "env_steps_per_s": steps / seconds, **{f"{k}_s": v for k, v in rollout.timing.items()},
        }
        print(f"  {workers} worker(s): {attempts / seconds:6.1f} attempts/s, "
              f"{steps / seconds:7.0f} env steps/s ({seconds:.1f} s)")
    scaling = results["workers_2"]["env_steps_per_s"] / results["workers_1"]["env_steps_per_s"]
    results["scaling_2_over_1"] = scaling
    print(f"  scaling 2 workers / 1 worker: {scaling:.2f}x")

    # The same jobs without a camera: the difference of env time is rendering.
    state_options = {**options, "obs_mode": "state"}
    state_config = harness_config.compose([*common, "task.obs_mode=state", "policy=mlp"])
    state_policy = make_policy(state_config.policy,
                               starts.observation_space)
    pool = PerWorkerPool(EngineSpec("push", state_options, policy_record(state_policy),
                                    attempts), 1)
    state_rollout = pool.run(state_policy, jobs, 1.0, seed=1)
    pool.close()
    pixel_steps = int(rollout.lengths.sum())
    physics_per_step = state_rollout.timing["env"] / int(state_rollout.lengths.sum())
    one = results["workers_1"]
    physics = physics_per_step * pixel_steps
    rendering = max(0.0, one["env_s"] - physics)

    trainer = GroupTrainer(config, policy)
    trainer.max_tokens = 60 * policy.config.action_dim
    rewards = rollout.success.astype(np.float32)
    keep = np.ones(args.groups, dtype=bool)
    start = time.perf_counter()
    trainer.update(rollout, rewards, trainer.advantages(rollout, rewards), keep)
    update_s = time.perf_counter() - start
    tokens = pixel_steps * policy.config.action_dim
    results["update"] = {"seconds": update_s, "tokens_per_s": tokens / update_s,
                         "tokens": tokens}
    print(f"  update (1 epoch, incl. old/reference log-probs): {tokens / update_s:7.0f} tokens/s")
    # The same update with the image encoder frozen (algo.freeze_encoder, the main job's
    # setting): each frame is encoded once and the epochs reuse the features.
    frozen_config = harness_config.compose([*overrides, "algo.freeze_encoder=true"])
    frozen = GroupTrainer(frozen_config, policy)
    frozen.max_tokens = trainer.max_tokens
    start = time.perf_counter()
    frozen.update(rollout, rewards, frozen.advantages(rollout, rewards), keep)
    frozen_s = time.perf_counter() - start
    results["update_frozen_encoder"] = {"seconds": frozen_s, "tokens_per_s": tokens / frozen_s,
                                        "speedup": update_s / frozen_s}
    print(f"  update with the encoder frozen: {tokens / frozen_s:7.0f} tokens/s "
          f"({update_s / frozen_s:.1f}x)")
    # ... and as the trainer runs it: the workers send the features they sampled from, so the
    # update encodes nothing (the same attempts and the same update, to the last bit).
    pool = PerWorkerPool(EngineSpec("push", options, policy_record(policy),
                                    -(-attempts // 2), image_features=True), 2)
    featured = pool.run(policy, jobs, 1.0, seed=1)
    pool.close()
    sent = GroupTrainer(frozen_config, policy)
    sent.max_tokens = trainer.max_tokens
    start = time.perf_counter()
    sent.update(featured, rewards, sent.advantages(featured, rewards), keep)
    sent_s = time.perf_counter() - start
    results["update_frozen_encoder_features_sent"] = {
        "seconds": sent_s, "tokens_per_s": tokens / sent_s, "speedup": update_s / sent_s}
    print(f"  ... with the workers' features: {tokens / sent_s:7.0f} tokens/s "
          f"({update_s / sent_s:.1f}x)")

    total = one["env_s"] + one["policy_s"] + update_s
    shares = {"rendering": rendering / total, "physics_and_env": physics / total,
              "policy": one["policy_s"] / total, "update": update_s / total}
    results["iteration_share"] = shares
    print("  share of an iteration (1 worker): " + ", ".join(
        f"{k} {v:.0%}" for k, v in shares.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
