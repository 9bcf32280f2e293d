"""Inference throughput of success detectors on one CPU core, and a trained one's error rates
under a policy.

usage: python benchmarks/bench_detectors.py
           [--checkpoint "outputs/detectors/push_goal+goal_side.pt"]
           [--batch-sizes 1 32 256] [--seconds 3] [--threads 1]
           [--audit-episodes 30] [--out outputs/bench_detectors.json]

Times ``CNNDetector.predict_proba`` (input checks included) on batches of random 84x84 frames;
without ``--checkpoint`` it uses an untrained network of the default architecture, which costs the
same. Also times the scripted detector (one simulator state per call). Target: >= 1,000 images/s.

With ``--checkpoint``, the detector then verifies ``--audit-episodes`` fresh episodes of a noisy
expert (noise 0.3, difficulty uniform in [0, 1], seeds no collection used) through
``VerifierWrapper``, on every step and on the final step, and reports its ``detector/`` rates.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

import tasks
from harness_common.files import atomic_write_text
from success_detectors import CNNDetector, ScriptedDetector, VerifierWrapper, load_detector
from success_detectors.cnn import SuccessCNN


def images_per_second(detector, batch: dict, seconds: float) -> float:
    """Calls of ``detector.predict_proba(batch)`` for ``seconds`` after a warm-up; rows/s."""
    for _ in range(3):
        detector.predict_proba(batch)
    rows = len(batch["pixels"]) if "pixels" in batch else len(batch["env"])
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        detector.predict_proba(batch)
        calls += 1
    return rows * calls / (time.perf_counter() - start)


def audit(detector, episodes: int, seed: int = 10_000_000) -> dict[str, dict[str, float]]:
    """Error rates of ``detector`` against the scripted truth on noisy-expert episodes."""
    env = tasks.make(detector.task, terminate_on_success=False)
    every_step = VerifierWrapper(env, detector, when="every_step", mode="add")
    final = VerifierWrapper(every_step, detector, when="final", mode="add")
    rng = np.random.default_rng(seed)
    for episode in range(episodes):
        final.reset(seed=seed + episode, options={"difficulty": float(rng.uniform())})
        expert = tasks.ScriptedExpert(final, noise=0.3, seed=seed + episode)
        done = False
        while not done:
            _, _, terminated, truncated, _ = final.step(expert())
            done = terminated or truncated
    env.close()
    return {"every_step": every_step.error_rates(), "final": final.error_rates()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--image-size", type=int, default=84)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--audit-episodes", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_detectors.json"))
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    if args.checkpoint is not None:
        detector = load_detector(args.checkpoint)
    else:
        detector = CNNDetector(SuccessCNN(), task="push", camera="front",
                               image_size=args.image_size)
    size = detector.image_size
    rng = np.random.default_rng(0)
    results: dict = {
        "threads": args.threads, "image_size": size, "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "checkpoint": None if args.checkpoint is None else str(args.checkpoint),
        "cnn_images_per_second": {},
    }
    views = detector.model.architecture.views  # a multi-view frame counts as one image
    for batch_size in args.batch_sizes:
        pixels = rng.integers(0, 256, (batch_size, size, views * size, 3), dtype=np.uint8)
        rate = images_per_second(detector, {"pixels": pixels}, args.seconds)
        results["cnn_images_per_second"][str(batch_size)] = round(rate, 1)
        print(f"cnn      batch {batch_size:>4}: {rate:8.0f} images/s ({args.threads} thread, "
              f"{views} view(s) of {size}x{size})")

    env = tasks.make(detector.task)
    env.reset(seed=0)
    rate = images_per_second(ScriptedDetector(), {"env": [env]}, args.seconds)
    results["scripted_states_per_second"] = round(rate, 1)
    print(f"scripted one state  : {rate:8.0f} states/s")
    env.close()

    if args.checkpoint is not None and args.audit_episodes > 0:
        results["audit"] = audit(detector, args.audit_episodes)
        for when, rates in results["audit"].items():
            print(f"audit {when:>10}: " + ", ".join(
                f"{key.split('/')[1]} {rates[key]:.3f}" for key in (
                    "detector/evaluations", "detector/accuracy", "detector/precision",
                    "detector/false_positive_rate", "detector/false_negative_rate")))

    best = max(results["cnn_images_per_second"].values())
    results["target_images_per_second"] = 1000
    results["meets_target"] = best >= 1000
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(results, indent=2))
    print(f"best batched rate {best:.0f} images/s (target >= 1,000); wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
