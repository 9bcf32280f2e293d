"""The torch device a run's ``device`` option names."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """The torch device a ``device`` option names, checked to be usable on this machine.

    Args:
        name: ``"auto"`` (CUDA if available, else Apple's MPS if available, else the CPU),
            ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.

    Returns:
        The device.

    Raises:
        ValueError: An unknown name, or a CUDA or MPS device this machine does not have; the
            message names the value.
    """
    mps_available = torch.backends.mps.is_available()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if mps_available else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={name!r}; expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r}, but CUDA is not available here; use 'auto' or 'cpu'")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device={name!r}, but this machine has "
                         f"{torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not mps_available:
        raise ValueError(f"device={name!r}, but MPS is not available here; use 'auto' or 'cpu'")
    return device
