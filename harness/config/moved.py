"""Keys that moved inside the training config, with where they live now.

An override of an old key is refused before Hydra composes, naming the key to write instead
(:func:`harness_common.cli.refuse_moved` for the apps, :func:`check_moved` for
:func:`harness.config.compose`). A ``/`` in the new key marks a config group whose value chooses
one of its files. Keys that another choice still has (``policy.num_bins`` of ``hf_vla``,
``policy.flow_steps`` of ``smolvla``) are not listed: Hydra names them as unknown to the chosen
policy, whose head takes them now (``policy.head.num_bins``, ``policy.head.steps``).
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.config.errors import ConfigError
from harness_common.cli import moved_spelling

MOVED: dict[str, str] = {
    # 2026-12-07: the action head is a config group of its own, its options below it.
    "policy.action_head": "policy/head",
    "policy.flow_noise": "policy.head.noise",
    "policy.state_dependent_std": "policy.head.state_dependent_std",
    # 2026-12-07: the start policy and the start states are nested blocks of the algorithm.
    "algo.init_policy": "algo.start_policy.file",
    "algo.bc_dataset": "algo.start_policy.dataset",
    "algo.bc_demos": "algo.start_policy.bc.demos",
    "algo.bc_epochs": "algo.start_policy.bc.epochs",
    "algo.bc_lr": "algo.start_policy.bc.lr",
    "algo.bc_noise": "algo.start_policy.bc.noise",
    "algo.bc_difficulty": "algo.start_policy.bc.difficulty",
    "algo.bc_shift_pad": "algo.start_policy.bc.shift_pad",
    "algo.bc_keep": "algo.start_policy.bc.keep",
    "algo.state_pretrain_episodes": "algo.start_policy.state_pretrain.episodes",
    "algo.state_pretrain_epochs": "algo.start_policy.state_pretrain.epochs",
    "algo.state_pretrain_shift_pad": "algo.start_policy.state_pretrain.shift_pad",
    "algo.start_states": "algo.starts.source",
    "algo.start_weights": "algo.starts.weights",
    "algo.start_demos": "algo.starts.demos",
    "algo.demo_curriculum": "algo.starts.curriculum",
    "algo.replay_buffer": "algo.starts.replay_buffer",
    "algo.replay_every": "algo.starts.replay_every",
    "algo.critic=": "algo.critic.network",  # "=": the key itself only (its block stays)
}


def check_moved(overrides: Iterable[str]) -> None:
    """Raises: ConfigError: An override of a moved key, naming the new spelling."""
    for override in overrides:
        spelling = moved_spelling(override, MOVED)
        if spelling is not None:
            raise ConfigError(f"{override}: {spelling}")
