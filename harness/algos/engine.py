"""A rollout worker's engine: the environments of one process and a copy of the policy
(:class:`RolloutEngine`), and :class:`LocalHost`, an :class:`~harness.algos.rollouts.EnvHost` of
the calling process behind the remote hosts' surface (:mod:`harness.algos.rollouts` has the
jobs, the seeding and the lock-step loop)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from harness.algos.rollouts import EnvHost, PolicyActor, RolloutBatch, play
from harness.policies import build_policy


class LocalHost:
    """An :class:`EnvHost` of this process behind the ``send_*``/``receive`` surface."""

    def __init__(self, host: EnvHost) -> None:
        self.host = host
        self._answer = None

    def send_begin(self, jobs, indices) -> None:
        self._answer = self.host.begin(jobs, indices)

    def send_step(self, actions) -> None:
        self._answer = self.host.step(actions)

    def receive(self):
        answer, self._answer = self._answer, None
        return answer

    def env_time_total(self) -> float:
        return self.host.env_time


class RolloutEngine:
    """Runs attempts from snapshots in ``num_envs`` environments of one process, in lock-step,
    with its own copy of the policy (a rollout worker of the ``per_worker`` mode).

    Args:
        task: Task name.
        task_options: Options of ``tasks.make``.
        policy_spec: ``(TokenPolicyConfig, obs_shapes)`` to build the local policy copy.
        num_envs: Environments stepped together (one batched policy call per step).
        verifier_view: ``(camera, size)`` of the frame an image detector reads, or ``None``.
        capture_every: See :class:`EnvHost`.
        image_features: Return the frozen encoder's features in place of the pixels
            (:class:`PolicyActor`).
        device: Where the local policy copy runs.
    """

    def __init__(self, task: str, task_options: dict[str, Any], policy_spec: tuple,
                 num_envs: int, verifier_view: tuple[str, int] | None = None,
                 capture_every: int = 0, image_features: bool = False,
                 device: str = "cpu") -> None:
        torch.set_flush_denormal(True)  # see harness.algos.group.train
        self.host = EnvHost(task, task_options, num_envs, verifier_view, capture_every)
        self.policy = build_policy(*policy_spec).to(torch.device(device))
        self.policy.eval()
        self.image_features = bool(image_features)

    def run(self, state_dict: dict[str, torch.Tensor] | None, jobs: list[tuple],
            temperature: float, seed: int | Sequence[int],
            indices: Sequence[int] | None = None) -> RolloutBatch:
        """Play every job ``(snapshot, group, difficulty)`` once; attempts return in job order.

        Args:
            state_dict: Policy weights to load first; ``None`` keeps the loaded ones.
            jobs: The attempts to play.
            temperature: Sampling temperature.
            seed: The call's seed; with ``indices`` it seeds each attempt's generator.
            indices: Index of each job among all the jobs of the call (a pool sends each
                worker a slice); default ``0, 1, ...``.
        """
        if state_dict is not None:
            self.policy.load_state_dict(state_dict)
        actor = PolicyActor(self.policy, temperature, seed, keys=indices,
                            image_features=self.image_features)
        return play(actor, [LocalHost(self.host)], [range(len(jobs))], jobs,
                    self.host.verifier_view is not None, self.host.capture_every > 0)

    def close(self) -> None:
        self.host.close()
