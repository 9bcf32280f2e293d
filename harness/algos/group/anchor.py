"""The behaviour-cloning anchor of group fine-tuning (``algo.bc_coef``).

Each gradient step of the clipped surrogate adds ``bc_coef`` times the policy's own
behaviour-cloning loss (:meth:`harness.policies.Policy.bc_loss`) on a random batch of the
demonstrations the start was cloned on: the policy may move where the verifier rewards it, but
pays for forgetting what the demos showed (the "auxiliary BC" of DAPG, Rajeswaran et al. 2018;
the BC regulariser of RL fine-tuning of VLAs). Pixels get the clone's random shifts.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.demos import Demos
from harness.policies import Policy
from harness.start_policy.bc import bc_targets, policy_inputs, random_shift


class BCAnchor:
    """Batches of demonstrated decisions and their behaviour-cloning loss.

    Args:
        policy: The policy being fine-tuned (its observation keys and chunks pick the inputs
            and the targets).
        demos: The start's demonstrations.
        device: Where the batches live.
        batch: Demonstrated decisions per loss.
        seed: The batches' and shifts' stream (saved with the trainer, so a resume repeats).
        shift_pad: Largest random shift of a pixel batch (the clone's ``bc.shift_pad``).
    """

    def __init__(self, policy: Policy, demos: Demos, device: torch.device, batch: int,
                 seed: int, shift_pad: int = 0) -> None:
        self.obs = policy_inputs(policy, demos, device)
        self.chunks, self.valid = bc_targets(policy, demos, device)
        self.batch, self.shift_pad = int(batch), int(shift_pad)
        self.size = len(self.chunks)
        self.generator = torch.Generator()
        self.generator.manual_seed(int(seed))

    def loss(self, policy: Policy) -> torch.Tensor:
        """The policy's behaviour-cloning loss on a fresh random batch."""
        index = torch.randint(self.size, (min(self.batch, self.size),),
                              generator=self.generator).to(self.chunks.device)
        obs = {key: value[index] for key, value in self.obs.items()}
        if "pixels" in obs and self.shift_pad:
            obs["pixels"] = random_shift(obs["pixels"], self.shift_pad, self.generator)
        valid = None if self.valid is None else self.valid[index]
        return policy.bc_loss(obs, self.chunks[index], valid, self.generator)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
