"""Portable kernels (``HARNESS_KERNELS=portable``, :mod:`harness_common.kernels`): the process
starts again in place with the variables set, PyTorch, NumPy and llvmpipe then run the same kernels
whatever the instruction set, and real training runs (state; pixels with ``-m slow``) give the
same metrics to the last bit when the instruction sets the libraries may use are cut down to
AVX2, as on a processor without AVX-512; bad values and sessions that cannot start again are
refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness_common import kernels
from harness_common.files import read_metrics

ROOT = Path(__file__).resolve().parent.parent
# What a processor without AVX-512 gives the libraries, imitated on one that has it (the last
# test shows that the native kernels then round differently).
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2", "LP_NATIVE_VECTOR_WIDTH": "256",
             "NPY_DISABLE_CPU_FEATURES": "X86_V4"}
COMMON = ["algo=grpo", "algo.group_size=2", "algo.num_start_states=2", "algo.minibatch_size=4",
          "algo.iterations=2", "eval.final_episodes=2", "eval.every_steps=0", "torch_threads=2",
          "logger.tensorboard=false", "logger.videos=false", "logger.progress_bar=false"]
RUNS = {
    "state": ["task=reach", "policy=mlp", "task.max_episode_steps=10", *COMMON],
    "pixels": ["task=reach", "task.obs_mode=pixels", "task.image_size=32", "policy=tiny_vla",
               "task.max_episode_steps=6", "algo.workers=2", *COMMON],
}
TIMES = ("time/", "seconds", "_s", "per_s")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any kernel variable, plus ``extra``."""
    names = {kernels.VARIABLE, kernels.APPLIED, *kernels.FIXED, *AVX2_ONLY}
    return {**{k: v for k, v in os.environ.items() if k not in names}, **extra}


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_mode_is_read_from_the_environment_and_a_bad_value_is_named():
    assert kernels.mode({}) == "native"
    assert kernels.mode({kernels.VARIABLE: ""}) == "native"
    assert kernels.mode({kernels.VARIABLE: "portable"}) == "portable"
    with pytest.raises(ValueError, match="HARNESS_KERNELS='fast'.*native.*portable"):
        kernels.mode({kernels.VARIABLE: "fast"})


def test_the_portable_environment_pins_every_library():
    added = kernels.portable_environment()
    assert added["ATEN_CPU_CAPABILITY"] == "default" and added["MKL_CBWR"] == "COMPATIBLE"
    assert added["LP_NATIVE_VECTOR_WIDTH"] == "128"
    from numpy._core import _multiarray_umath as umath

    disabled = added["NPY_DISABLE_CPU_FEATURES"].split()
    assert set(disabled) <= set(umath.__cpu_dispatch__)
    assert all(umath.__cpu_features__[name] for name in disabled)
    assert kernels.is_applied(added) and not kernels.is_applied({})
    assert not kernels.is_applied({**added, "MKL_CBWR": "AVX2"})


def test_a_portable_process_starts_again_in_place_with_pinned_kernels():
    code = ("import os, sys; print('pid', os.getpid(), flush=True); import harness, torch, json; "
            "import numpy._core._multiarray_umath as u; "
            "from harness.provenance import machine_info; "
            "print(json.dumps({'pid': os.getpid(), 'capability': "
            "torch.backends.cpu.get_cpu_capability(), 'mkldnn': torch.backends.mkldnn.enabled, "
            "'nnpack': torch._C._get_nnpack_enabled(), "
            "'numpy_on': [f for f in u.__cpu_dispatch__ if u.__cpu_features__[f]], "
            "'machine': machine_info()}))")
    done = run_python(code, clean_env(HARNESS_KERNELS="portable"))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    # the first process printed its pid, started again (the same pid) and printed it again
    assert lines[0] == lines[1] and lines[0].startswith("pid ")
    report = json.loads(lines[2])
    assert report["pid"] == int(lines[0].split()[1])
    assert report["capability"] == "DEFAULT"
    assert report["mkldnn"] is False and report["nnpack"] is False
    assert report["numpy_on"] == []  # NumPy's run-time SIMD paths are all off
    assert report["machine"]["kernels"] == "portable"
    assert report["machine"]["kernel_settings"]["MKL_CBWR"] == "COMPATIBLE"
    native = run_python("import harness, torch; from harness.provenance import machine_info; "
                        "print(machine_info()['kernels'], torch.backends.mkldnn.enabled)",
                        clean_env())
    assert native.returncode == 0, native.stderr[-2000:]
    assert native.stdout.split() == ["native", "True"]


def test_a_session_that_cannot_start_again_is_refused_with_the_settings(monkeypatch):
    monkeypatch.setenv(kernels.VARIABLE, "portable")
    monkeypatch.delenv(kernels.APPLIED, raising=False)
    monkeypatch.setattr(sys, "orig_argv", [sys.executable])  # a bare interactive interpreter
    monkeypatch.setattr(os, "execve", lambda *args: pytest.fail("must not start again"))
    with pytest.raises(RuntimeError, match="cannot be started again.*MKL_CBWR='COMPATIBLE'"):
        kernels.ensure_portable()
    # started again, but a pinned variable was changed since: refused, naming them
    monkeypatch.setenv(kernels.APPLIED, "1")
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    with pytest.raises(RuntimeError, match="changed after the start"):
        kernels.ensure_portable()
    monkeypatch.setenv(kernels.VARIABLE, "native")  # native never starts again
    kernels.ensure_portable()


def train(run_dir: Path, overrides: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "scripts/train.py", *overrides,
                           f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(run_dir / "metrics.csv")
    return {key: value for key, value in metrics.items()
            if not any(part in key for part in TIMES)}


@pytest.mark.parametrize("kind", ["state", pytest.param("pixels", marks=pytest.mark.slow)])
def test_portable_runs_give_the_same_metrics_with_avx2_only_kernels(tmp_path, kind):
    full = train(tmp_path / "full", RUNS[kind], clean_env(HARNESS_KERNELS="portable"))
    cut = train(tmp_path / "cut", RUNS[kind],
                clean_env(HARNESS_KERNELS="portable", **AVX2_ONLY))
    assert len(full) > 10 and any(key.startswith("train/") for key in full)
    assert full == cut
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["machine"]["kernels"] == "portable"
    assert summary["machine"]["cpu_capability"] == "DEFAULT"
    assert summary["task"] == "reach" and summary["task_version"] == 2


@pytest.mark.slow  # a property of the processor, 16 s: the portable runs' equality stays
def test_native_runs_differ_with_avx2_only_kernels_on_an_avx512_machine(tmp_path):
    """What the test above takes away: on a processor with AVX-512, the native kernels cut
    down to AVX2 round differently (here the entropy of the state run's updates)."""
    import torch

    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("needs a processor with AVX-512 to compare against AVX2-only kernels")
    full = train(tmp_path / "full", RUNS["state"], clean_env())
    cut = train(tmp_path / "cut", RUNS["state"], clean_env(**AVX2_ONLY))
    assert full.keys() == cut.keys()
    assert full != cut
