"""Provenance of a result: the packages, the processor and the commit it was computed with
(``summary.json``'s ``versions``, ``machine`` and ``git``)."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from harness_common import kernels

VERSIONED_PACKAGES = (
    "vla-rl-harness", "numpy", "torch", "gymnasium", "mujoco", "stable-baselines3", "sb3-contrib",
    "hydra-core", "omegaconf",
)


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a result depends on, plus Python's."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def machine_info() -> dict[str, Any]:
    """The processor a result was computed on: its model, the vector instructions PyTorch's
    CPU kernels use (``AVX2``, ``AVX512``...), its cores, and the operating system.

    Floating-point kernels differ with the instruction set, so the same seed can train other
    weights on another processor type (docs/results.md, "Reproducing a figure"); the summary
    names the machine so that two runs can be told apart, and whether the run used the
    portable kernels (``kernels``, :mod:`harness_common.kernels`), which take that difference away.
    """
    import torch

    model = platform.processor() or None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": os.cpu_count(), "platform": platform.platform(), **kernels.describe()}


def git_commit() -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout holding this package."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            result = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                    text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout.strip() if result.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}
