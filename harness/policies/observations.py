"""Observation batches: what every policy reads.

Observations are dicts of batched tensors with some of the keys ``state`` float ``(B, D)``,
``pixels`` uint8 ``(B, H, W, 3)``, ``proprio`` float ``(B, P)`` and ``instruction`` int64
``(B, L)`` token ids padded with :data:`tasks.language.PAD`. Use :func:`obs_to_batch` to turn
numpy observations from an environment into such a dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from gymnasium import spaces

ObsShapes = dict[str, tuple[int, ...]]


def obs_to_batch(
    obs: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
    device: torch.device | str | None = None,
    batched: bool = False,
) -> dict[str, torch.Tensor]:
    """Numpy observation dict(s) to a dict of batched tensors.

    Args:
        obs: One observation dict, a list of them, or (with ``batched``) one dict whose arrays
            already have a leading batch dimension, as a vector environment returns.
        device: Where the tensors go.
        batched: ``obs`` is a single dict that is already batched.

    Returns:
        Tensors with a leading batch dim: ``pixels`` stays uint8, ``instruction`` int64, the
        rest float32.
    """
    if isinstance(obs, Mapping):
        arrays = {k: np.asarray(v) if batched else np.asarray(v)[None] for k, v in obs.items()}
    else:
        arrays = {k: np.stack([np.asarray(o[k]) for o in obs]) for k in obs[0]}
    batch = {}
    for key, array in arrays.items():
        if key == "pixels":
            tensor = torch.as_tensor(array, dtype=torch.uint8)
        elif key == "instruction":
            tensor = torch.as_tensor(array, dtype=torch.int64)
        else:
            tensor = torch.as_tensor(array, dtype=torch.float32)
        batch[key] = tensor.to(device) if device is not None else tensor
    return batch


def obs_shapes_from_space(observation_space: spaces.Dict) -> ObsShapes:
    """Per-key observation shapes of a gymnasium ``Dict`` space.

    Raises:
        TypeError: ``observation_space`` is not a ``Dict`` of ``Box`` spaces.
    """
    if not isinstance(observation_space, spaces.Dict):
        raise TypeError(
            f"policies take a gymnasium Dict observation space, got {observation_space}"
        )
    shapes = {}
    for key, space in observation_space.spaces.items():
        if not isinstance(space, spaces.Box):
            raise TypeError(f"observation {key!r} must be a Box space, got {space}")
        shapes[key] = tuple(int(d) for d in space.shape)
    return shapes




def check_obs_shapes(kind: str, reads: str, obs_shapes: ObsShapes) -> None:
    """Refuse observations a policy of ``kind`` cannot read: without its key ``reads``, or with a
    malformed shape.

    Raises:
        ValueError: Naming the key and the shapes.
    """
    if reads not in obs_shapes:
        raise ValueError(f"policy kind {kind!r} needs observation keys {[reads]}, but the "
                         f"observation has only {sorted(obs_shapes)}")
    for key in ("state", "proprio", "instruction"):
        if key in obs_shapes and len(obs_shapes[key]) != 1:
            raise ValueError(f"observation {key!r} must be 1-D, got shape {obs_shapes[key]}")
    if "pixels" in obs_shapes and (len(obs_shapes["pixels"]) != 3 or obs_shapes["pixels"][-1] != 3):
        raise ValueError(f"observation 'pixels' must be (H, W, 3), got {obs_shapes['pixels']}")
