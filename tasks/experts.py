"""Scripted experts: privileged controllers that read the simulator state.

They produce demonstrations and detector training data. Every task's ``expert_action`` steers with
:func:`move_towards`. Noise comes from the expert's own generator so that adding noise never
changes the environment's random stream.
"""

from __future__ import annotations

import numpy as np

from tasks.base import MAX_DELTA


def move_towards(ee: np.ndarray, target: np.ndarray, gain: float = 1.0) -> np.ndarray:
    """Proportional end-effector command towards ``target``, saturated at the action bounds."""
    return np.clip(gain * (np.asarray(target) - ee) / MAX_DELTA, -1.0, 1.0)


class ScriptedExpert:
    """The task's scripted controller with optional Gaussian action noise.

    Args:
        env: A task environment (wrappers are looked through).
        noise: Standard deviation of Gaussian noise added to every action dimension.
        seed: Seed of the noise generator.
    """

    def __init__(self, env, noise: float = 0.0, seed: int | None = None) -> None:
        if noise < 0:
            raise ValueError(f"noise={noise}; expected a standard deviation >= 0")
        self.env = env.unwrapped
        self.noise = float(noise)
        self.rng = np.random.default_rng(seed)

    def __call__(self, observation=None) -> np.ndarray:
        """The action to execute: the expert's, plus its noise, clipped to the action bounds."""
        return self.act()[1]

    def act(self) -> tuple[np.ndarray, np.ndarray]:
        """``(expert, executed)``: the noise-free expert action and the noisy one to execute,
        both clipped to the action bounds. With noise, recording the first while executing the
        second labels the states the noise leads to with the expert's corrections (DART, Laskey
        et al. 2017)."""
        expert = self.env.expert_action()
        executed = expert
        if self.noise > 0:
            executed = expert + self.rng.normal(0.0, self.noise, expert.shape)
        return (np.clip(expert, -1.0, 1.0).astype(np.float32),
                np.clip(executed, -1.0, 1.0).astype(np.float32))
