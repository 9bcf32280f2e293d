"""Portable kernels: meant to give a seed the same numbers on any x86-64 processor type
(checked on an Intel Xeon with the libraries cut down to AVX2; not yet on an AMD processor).

PyTorch, MKL, NumPy and Mesa's llvmpipe pick their floating-point kernels by the processor's
vector instructions (AVX-512 on one machine, AVX2 on another), and the kernels round
differently in the last bits; a policy trained for minutes carries those bits into every later
weight, so one seed trains other policies on an Intel Xeon and on an AMD EPYC
(docs/results.md, "Reproducing a figure"). With ``HARNESS_KERNELS=portable`` in the
environment every process of a run uses the same kernels whatever the processor:

- PyTorch's ATen kernels at its ``default`` capability (``ATEN_CPU_CAPABILITY=default``) and
  its convolutions without oneDNN or NNPACK (``torch.backends.mkldnn.enabled = False``,
  ``torch.backends.nnpack.set_flags(False)``: both choose code and blocking by the processor;
  MKL's matrix products instead), set by :func:`apply_torch` when ``harness`` or
  ``success_detectors`` is imported;
- MKL in its conditional-numerical-reproducibility mode for all x86 processors
  (``MKL_CBWR=COMPATIBLE``);
- NumPy without the SIMD paths it dispatches at run time (``NPY_DISABLE_CPU_FEATURES``), so
  ``np.exp``, ``np.sin``... take the baseline ones;
- llvmpipe at 128-bit vectors (``LP_NATIVE_VECTOR_WIDTH=128``).

These variables are read when the libraries load, so :func:`ensure_portable` starts the same
command again (``os.execve``, the same process id) with them set when the first import of
``harness`` or ``success_detectors`` finds ``HARNESS_KERNELS=portable`` without them. Worker
processes (spawned rollout workers, Ray, Hydra's launchers) inherit the variables. The cost is
speed: convolutions and the vectorised kernels run several times slower (docs/results.md).

``HARNESS_KERNELS`` unset or ``native`` changes nothing.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "HARNESS_KERNELS"
MODES = ("native", "portable")
# Set with the others, so that a started-again process never starts again.
APPLIED = "HARNESS_KERNELS_APPLIED"
FIXED = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "LP_NATIVE_VECTOR_WIDTH": "128",
}


def mode(environ=None) -> str:
    """``"native"`` or ``"portable"``, from ``HARNESS_KERNELS``.

    Raises:
        ValueError: Another value, named.
    """
    value = (os.environ if environ is None else environ).get(VARIABLE, "") or "native"
    if value not in MODES:
        raise ValueError(f"{VARIABLE}={value!r}; expected one of {MODES} (unset: native)")
    return value


def numpy_dispatched_features() -> list[str]:
    """The SIMD features NumPy dispatches to at run time on this machine (``X86_V3``,
    ``AVX512_SKX``...), which ``NPY_DISABLE_CPU_FEATURES`` turns off."""
    from numpy._core import _multiarray_umath as umath  # what NumPy itself reports

    supported = getattr(umath, "__cpu_features__", {})
    return [name for name in getattr(umath, "__cpu_dispatch__", []) if supported.get(name)]


def portable_environment() -> dict[str, str]:
    """The variables a portable process needs (``FIXED``, NumPy's disabled features, the
    marker), to be added to the environment."""
    disabled = " ".join(numpy_dispatched_features())
    return {**FIXED, "NPY_DISABLE_CPU_FEATURES": disabled, VARIABLE: "portable", APPLIED: "1"}


def is_applied(environ=None) -> bool:
    """Whether the portable variables are in ``environ`` (as this process started)."""
    environ = os.environ if environ is None else environ
    return environ.get(APPLIED) == "1" and all(environ.get(k) == v for k, v in FIXED.items())


def ensure_portable() -> None:
    """Start this command again with the portable variables when ``HARNESS_KERNELS=portable``
    asks for them and they are missing; otherwise do nothing.

    Raises:
        ValueError: A bad ``HARNESS_KERNELS``.
        RuntimeError: The variables are missing in an interactive session (a REPL, a notebook),
            which cannot be started again: names them and how to set them.
    """
    if mode() != "portable" or is_applied():
        return
    if os.environ.get(APPLIED) == "1":  # started again, but something changed them since
        raise RuntimeError(f"{VARIABLE}=portable: the variables {sorted(FIXED)} were changed "
                           "after the start; unset them or set them as documented")
    added = portable_environment()
    argv = list(getattr(sys, "orig_argv", []) or [])
    interactive = (len(argv) < 2 or sys.flags.interactive or "ipykernel" in sys.modules
                   or argv[1:] == ["-"])
    if interactive:
        settings = " ".join(f"{k}='{v}'" for k, v in added.items())
        raise RuntimeError(f"{VARIABLE}=portable needs its variables before Python starts, and "
                           f"this session cannot be started again: start it with {settings}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], {**os.environ, **added})


def apply_torch() -> None:
    """In a portable process, turn oneDNN and NNPACK off for PyTorch's convolutions and check
    that ATen runs its default kernels; in a native one, do nothing.

    Raises:
        RuntimeError: ATen picked another capability (PyTorch was loaded before the variables
            were set), named.
    """
    if mode() != "portable":
        return
    import torch

    torch.backends.mkldnn.enabled = False
    torch.backends.nnpack.set_flags(False)
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "DEFAULT":
        raise RuntimeError(f"{VARIABLE}=portable, but PyTorch runs its {capability!r} kernels: "
                           "it was loaded before ATEN_CPU_CAPABILITY=default was set")


def activate() -> None:
    """What ``harness`` and ``success_detectors`` run on import: :func:`ensure_portable`, then
    :func:`apply_torch`."""
    ensure_portable()
    apply_torch()


def describe() -> dict[str, object]:
    """What ``summary.json``'s ``machine`` records of the kernels: the mode, and in a portable
    process the variables it runs with."""
    if mode() != "portable":
        return {"kernels": "native"}
    return {"kernels": "portable",
            "kernel_settings": {k: os.environ.get(k) for k in
                                (*FIXED, "NPY_DISABLE_CPU_FEATURES")}}
