"""Benchmark the exported TinyVLA per control step on one thread, against the control period.

The TinyVLA of ``conf/experiment/push_easy_pixels.yaml`` (``conf/policy/tiny_vla.yaml`` on pixel
push at 84 x 84; the main job until 2026-12-05, with which docs/export.md's figures were measured)
with fresh weights (latency does not depend on their values),
exported as ``scripts/export_policy.py`` does (parity-checked on 32 env observations). Prints,
measured in one run, p50/p99/max per control step of:
- the exported policy in onnxruntime with one thread (``harness.deploy.ExportedPolicy``:
  observation dict in, action out), and beside it the torch policy with one thread, greedy
  ``act`` on ``obs_to_batch`` (the trainer's path), called alternately on the same real env
  observations: their ratio is the in-run reference, steadier than either figure on a shared
  machine;
- full control steps of deployment episodes (``harness.deploy.deploy``): the exported policy,
  then ``env.step`` with its physics and camera.
Target: p99 of the exported policy <= 10 ms of the 40 ms control period.

usage: python benchmarks/bench_export.py [--calls 2000] [--episodes 20]
           [--out bench_results/export.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

import tasks  # noqa: E402  (headless GL backend before MuJoCo loads)
from harness import config as harness_config  # noqa: E402
from harness.deploy import ExportedPolicy, deploy, latency_ms  # noqa: E402
from harness.export import export_onnx, sample_observations  # noqa: E402
from harness.policies import make as make_policy  # noqa: E402
from harness.policies import obs_to_batch  # noqa: E402
from harness_common.files import atomic_write, atomic_write_text, to_json  # noqa: E402

TARGET_P99_MS = 10.0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls of each policy")
    parser.add_argument("--episodes", type=int, default=20, help="deployment episodes")
    parser.add_argument("--out", type=Path, default=Path("bench_results/export.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    config = harness_config.compose(["+experiment=push_easy_pixels"])
    task, options = config.task.name, config.task.env_options()
    env = tasks.make(task, **options)
    policy = make_policy(config.policy, env.observation_space).eval()
    observations = sample_observations(env, 256, seed=0)
    env.close()
    model, info = export_onnx(policy, {"task": task, "task_options": options},
                              observations[:32])
    size = options["image_size"]
    print(f"TinyVLA ({policy.config.conv_channels} channels, {policy.config.image_features}), "
          f"{task} pixels {size}x{size}, {len(model) / 1024:.0f} KiB ONNX, parity max |logit "
          f"diff| {info['parity']['max_abs_logit_diff']:.1e}")

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "policy.onnx"
        atomic_write(path, lambda file: file.write(model))
        exported = ExportedPolicy(path, threads=1)
        exported.inference_seconds.clear()
        torch_seconds = []
        with torch.no_grad():
            policy.act(obs_to_batch(observations[0]), deterministic=True)  # warm
            for i in range(args.calls):
                obs = observations[i % len(observations)]
                exported(obs)
                start = time.perf_counter()
                _, actions = policy.act(obs_to_batch(obs), deterministic=True)
                actions[0].numpy()
                torch_seconds.append(time.perf_counter() - start)
        onnx_ms, torch_ms = latency_ms(exported.inference_seconds), latency_ms(torch_seconds)
        deployed = deploy(exported, args.episodes)
    period_ms = deployed.control_period_s * 1e3
    step_ms = latency_ms(deployed.step_s)
    rows = [("onnxruntime policy, 1 thread", onnx_ms), ("torch policy, 1 thread", torch_ms),
            ("full step: onnxruntime policy + env.step", step_ms)]
    print(f"per control step, control period {period_ms:.0f} ms "
          f"({args.calls} policy calls; {len(deployed.step_s)} deployment steps):")
    print("| | p50 ms | p99 ms | max ms | p99 / period |\n|---|---:|---:|---:|---:|")
    for label, ms in rows:
        print(f"| {label} | {ms['p50']:.2f} | {ms['p99']:.2f} | {ms['max']:.2f} | "
              f"{ms['p99'] / period_ms:.1%} |")
    ratio = torch_ms["p50"] / onnx_ms["p50"]
    met = onnx_ms["p99"] <= TARGET_P99_MS
    print(f"torch / onnxruntime at p50: {ratio:.2f}x; target p99 <= {TARGET_P99_MS:g} ms: "
          f"{'met' if met else 'NOT met'} ({onnx_ms['p99']:.2f} ms)")
    results = {"date": date.today().isoformat(), "cpus": os.cpu_count(),
               "machine": platform.processor() or platform.machine(), "task": task,
               "image_size": size,
               "policy": info["policy"], "control_period_ms": period_ms,
               "onnxruntime_ms": onnx_ms, "torch_ms": torch_ms, "full_step_ms": step_ms,
               "torch_over_onnxruntime_p50": ratio, "target_p99_ms": TARGET_P99_MS,
               "target_met": met, "versions": info["exporter"]}
    atomic_write_text(args.out, to_json(results))
    print(f"results: {args.out}")
    return results


if __name__ == "__main__":
    main()
