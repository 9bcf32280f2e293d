"""Benchmark the group trainer's rollout backends and modes: attempts/s with 1 and 2 workers,
as worker processes (``algo.rollout.backend=processes``) and as Ray actors (``ray``), each with
its policy copy (``algo.rollout.mode=per_worker``), and with environments in worker processes
driven by one batched policy in the learner (``mode=batched``), on the same jobs.

The same jobs are played by every configuration from the same snapshots with the same seed, so
the script also checks that every backend and worker count returns the very same attempts
(tokens, observations, outcomes). The reference is 1 worker process, measured in the same run;
the figures to read are the ratios.

usage: python benchmarks/bench_rollouts.py [--groups 8] [--group-size 8] [--repeats 3]
           [--obs pixels|state] [--policy auto|hf_vla --model small:paligemma --image-size 64]
           [--device cpu|cuda] [--workers 1 2] [--backends processes ray]
           [--out bench_results/rollouts.json]

``--device cuda`` puts the learner's policy, the one batched mode plays with, on the GPU; the
per-worker copies stay on the workers' CPUs. The first of ``--workers`` is the reference count.
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
from harness.algos.rollout.batched import BatchedPool
from harness.algos.rollout.pools import PerWorkerPool
from harness.algos.rollout.records import EngineSpec, Job
from harness.config.algos import RolloutConfig
from harness.policies import make as make_policy
from harness.policies.saving import policy_record
from harness_common.files import atomic_write_text

# (backend, mode): policy copies in processes (the reference) and in Ray actors; one policy in
# the learner with environments in processes.
CONFIGURATIONS = [("processes", "per_worker"), ("ray", "per_worker"), ("processes", "batched")]


def _same(a, b) -> bool:
    return (np.array_equal(a.decisions, b.decisions) and np.array_equal(a.success, b.success)
            and all(np.array_equal(a.obs[k], b.obs[k]) for k in a.obs))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=8, help="start states B")
    parser.add_argument("--group-size", type=int, default=8, help="attempts per start state G")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per configuration")
    parser.add_argument("--obs", choices=("pixels", "state"), default="pixels")
    parser.add_argument("--policy", choices=("auto", "hf_vla"), default="auto",
                        help="auto: tiny_vla on pixels, mlp on state; hf_vla: a transformers "
                             "VLA (--model), on pixels")
    parser.add_argument("--model", default="small:paligemma", help="policy.model of hf_vla")
    parser.add_argument("--image-size", type=int, default=84)
    parser.add_argument("--device", default="cpu", help="the learner policy's torch device")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                        help="worker counts to measure; the first is the reference")
    parser.add_argument("--backends", nargs="+", choices=("processes", "ray"),
                        default=["processes", "ray"], help="per-worker backends to measure")
    parser.add_argument("--out", type=Path, default=Path("bench_results/rollouts.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    policy_name = "tiny_vla" if args.obs == "pixels" else "mlp"
    extra = []
    if args.policy == "hf_vla":
        policy_name, args.obs = "hf_vla", "pixels"
        extra = [f"policy.model={args.model}", "policy.num_bins=32"]
    config = harness_config.compose(["task=push", "task.difficulty=0.0",
                                     "task.max_episode_steps=60", f"task.obs_mode={args.obs}",
                                     f"task.image_size={args.image_size}",
                                     f"policy={policy_name}", *extra, "algo=grpo", "logger=none"])
    options = config.task.env_options()
    env = tasks.make("push", **options)
    policy = make_policy(config.policy, env.observation_space)
    policy = policy.to(args.device)
    env.close()
    starts = tasks.make("push", **{**options, "obs_mode": "state"})
    jobs = []
    for group in range(args.groups):
        starts.reset(seed=group, options={"difficulty": 0.0})
        jobs += [Job(starts.snapshot(), group, 0.0)] * args.group_size
    starts.close()
    attempts = len(jobs)
    print(f"{attempts} attempts ({args.groups} start states x {args.group_size}), push "
          f"{args.obs}, {policy_name}; best of {args.repeats} calls each")

    def pool_for(backend: str, mode: str, workers: int):
        spec = EngineSpec("push", options, policy_record(policy),
                          -(-attempts // workers))
        settings = RolloutConfig(backend=backend, cpus_per_worker=1)
        if mode == "batched":
            return BatchedPool(spec.host, workers, settings)
        return PerWorkerPool(spec, workers, settings)

    results: dict = {"attempts": attempts, "obs": args.obs, "policy": policy_name,
                     "model": args.model if policy_name == "hf_vla" else None,
                     "device": args.device, "workers": args.workers}
    reference = None
    configurations = [(backend, mode) for backend, mode in CONFIGURATIONS
                      if mode == "batched" or backend in args.backends]
    for backend, mode in configurations:
        for workers in args.workers:
            with pool_for(backend, mode, workers) as pool:
                pool.run(policy, jobs[: 2 * workers], 1.0, seed=0)  # warm: renderers, imports
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    rollout = pool.run(policy, jobs, 1.0, seed=1)
                    times.append(time.perf_counter() - start)
            seconds = min(times)
            reference = reference or rollout
            steps = int(rollout.lengths.sum())
            key = f"{backend}_{mode}_{workers}"
            results[key] = {"seconds": seconds, "attempts_per_s": attempts / seconds,
                            "env_steps_per_s": steps / seconds, "all_seconds": times,
                            "same_attempts_as_reference": _same(rollout, reference)}
            print(f"  {backend:9s} {mode:10s} x{workers}: {attempts / seconds:6.1f} attempts/s, "
                  f"{steps / seconds:7.0f} env steps/s, same attempts: "
                  f"{results[key]['same_attempts_as_reference']}")

    def rate(key: str) -> float:
        return results[key]["attempts_per_s"]

    one, top = args.workers[0], args.workers[-1]
    results["ratios"] = {}
    for backend, mode in configurations:  # e.g. processes_2_over_1, batched_2_over_1
        name = "batched" if mode == "batched" else backend
        if top != one:
            results["ratios"][f"{name}_{top}_over_{one}"] = (
                rate(f"{backend}_{mode}_{top}") / rate(f"{backend}_{mode}_{one}"))
    if "ray" in args.backends and "processes" in args.backends:
        results["ratios"][f"ray_{top}_over_processes_{top}"] = (
            rate(f"ray_per_worker_{top}") / rate(f"processes_per_worker_{top}"))
    if "processes" in args.backends:
        results["ratios"][f"batched_{top}_over_per_worker_{top}"] = (
            rate(f"processes_batched_{top}") / rate(f"processes_per_worker_{top}"))
    for name, value in results["ratios"].items():
        print(f"  {name}: {value:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
