"""Shared test settings: one torch thread, headless rendering chosen by ``tasks``."""

import torch

import tasks  # noqa: F401  (sets MUJOCO_GL before anything imports mujoco)

torch.set_num_threads(1)
