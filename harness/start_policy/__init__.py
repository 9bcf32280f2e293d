"""The start-policy step: what group fine-tuning starts from, built before the run.

demos -> state-feature pretraining -> behaviour cloning -> the start policy, as
``algo.start_policy`` (:class:`harness.config.StartPolicyConfig`) says:

* ``file``: a saved policy (another run's ``start_policy.pt``), checked to fit this run;
* ``bc.demos > 0`` or ``dataset``: a clone (:func:`~harness.start_policy.cloning.
  cloned_start_policy`: :mod:`~harness.start_policy.state_pretraining`, then
  :mod:`~harness.start_policy.bc`);
* otherwise fresh weights.

The training app calls :func:`build_start_policy` and hands the result to the trainer
(:class:`harness.algos.group.run.GroupRun`), which keeps it as its KL reference; the start is saved
as
``<run dir>/start_policy.pt`` so that the arms of an ablation can share it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

import torch

import tasks
from harness.config import TrainConfig
from harness.policies import Policy, load_policy, resolve_device
from harness.policies import make as make_policy
from harness.start_policy.cloning import (
    START_POLICY_FILE,
    check_start_policy,
    cloned_start_policy,
    demo_file,
    keep_start_policy,
)

__all__ = ["START_POLICY_FILE", "StartPolicy", "build_start_policy", "check_start_policy",
           "cloned_start_policy", "demo_file", "keep_start_policy", "prepare_torch"]

log = logging.getLogger(__name__)


class StartPolicy(NamedTuple):
    """The start of a run.

    Attributes:
        policy: The policy, on the run's device.
        metrics: What made it (the clone's ``bc/...`` and ``pretrain/...`` figures).
        file: Where it can be loaded from by another run's ``algo.start_policy.file`` (``None``
            for a policy that lives in a model folder).
    """

    policy: Policy
    metrics: dict[str, Any]
    file: str | None


def prepare_torch(cfg: TrainConfig) -> None:
    """The run's torch settings, before any network is built or trained: its threads, and
    subnormal floats flushed to zero. Subnormals appear in a CNN's activations and gradients as
    fine-tuning goes on and make x86 CPUs crawl (one fine-tuned TinyVLA's forward+backward took
    0.59 s per 128 frames with them and 0.21 s flushed to zero); flushing costs no accuracy
    here."""
    torch.set_num_threads(cfg.torch_threads)
    torch.set_flush_denormal(True)


def build_start_policy(cfg: TrainConfig, run_dir: str | Path) -> StartPolicy:
    """The start policy ``cfg.algo.start_policy`` describes, saved as
    ``<run_dir>/start_policy.pt`` (or named, when it was loaded from a file).

    Args:
        cfg: A validated config of a group algorithm.
        run_dir: The run directory.

    Raises:
        ValueError: A saved policy of other observations, another kind or other chunks, or a
            demo or dataset problem (see :func:`cloned_start_policy`).
    """
    start, seeds = cfg.algo.start_policy, cfg.seeds
    torch.manual_seed(seeds.generator)  # fresh weights, and whatever a loaded kind builds
    prepare_torch(cfg)
    options = cfg.task.env_options()
    device = resolve_device(cfg.device)
    metrics: dict[str, Any] = {}
    if start.file:
        env = tasks.make(cfg.task.name, **options)
        policy = load_policy(start.file, env.observation_space)
        env.close()
        check_start_policy(policy, cfg.policy, start.file)
    elif start.clones:
        policy, metrics = cloned_start_policy(cfg.task.name, options, cfg.policy, start, seeds,
                                              device=str(device),
                                              progress=cfg.logger.progress_bar)
    else:
        warning = cfg.policy.unfitted_warning()
        if warning:
            log.warning("%s", warning)
        env = tasks.make(cfg.task.name, **options)
        policy = make_policy(cfg.policy, env.observation_space)
        env.close()
    file = keep_start_policy(policy, run_dir, start.file)
    return StartPolicy(policy.to(device), metrics, file)
