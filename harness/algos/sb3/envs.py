"""The environments SB3 trains on: task, verifier reward, observation selection, curriculum.

``policy=mlp`` reads the ``state`` vector (plus the instruction tokens when
``policy.use_instruction``), flattened into one ``Box`` for SB3's ``MlpPolicy``; ``policy=cnn``
keeps a ``Dict`` of ``pixels`` (NatureCNN), ``proprio`` and, in ``pixels_state`` mode, ``state``
for ``MultiInputPolicy``.
"""


from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

import tasks
from harness.config import OBS_MODE_KEYS, TrainConfig


# ------------------------------------------------------------------------------ observations
def observation_spec(policy: str, obs_mode: str, use_instruction: bool) -> dict[str, Any]:
    """Which observation keys the SB3 policy reads, and whether they are flattened.

    Returns:
        ``{"keys": [...], "flatten": bool}`` (stored in checkpoint metadata).
    """
    keys = ["state"] if policy == "mlp" else list(OBS_MODE_KEYS[obs_mode])
    if use_instruction:
        keys.append("instruction")
    return {"keys": keys, "flatten": policy == "mlp"}


def select_observation(
    obs: dict[str, np.ndarray], keys: list[str], flatten: bool
) -> np.ndarray | dict[str, np.ndarray]:
    """The part of a task observation an SB3 policy reads, in ``keys`` order."""
    if flatten:
        return np.concatenate([np.asarray(obs[k], np.float32).ravel() for k in keys])
    return {k: obs[k] for k in keys}


class SelectObservation(gym.ObservationWrapper):
    """Keeps ``keys`` of the task's ``Dict`` observation; ``flatten`` concatenates them into one
    float32 ``Box`` (for ``MlpPolicy``)."""

    def __init__(self, env: gym.Env, keys: list[str], flatten: bool) -> None:
        super().__init__(env)
        self.keys, self.flatten = list(keys), flatten
        spaces = env.observation_space.spaces
        if flatten:
            low = np.concatenate([np.broadcast_to(spaces[k].low, spaces[k].shape).ravel()
                                  for k in self.keys]).astype(np.float32)
            high = np.concatenate([np.broadcast_to(spaces[k].high, spaces[k].shape).ravel()
                                   for k in self.keys]).astype(np.float32)
            self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)
        else:
            self.observation_space = gym.spaces.Dict({k: spaces[k] for k in self.keys})

    def observation(self, observation: dict[str, np.ndarray]):
        return select_observation(observation, self.keys, self.flatten)


class CurriculumWrapper(gym.Wrapper):
    """Plays the difficulty the curriculum (in the main process) chose for the next episode.

    SB3's vector envs reset finished episodes by themselves inside ``step``, so the main process
    sets the options of the *next* reset ahead of time (``set_next_episode``, through
    ``env_method``); ``info["curriculum_difficulty"]`` reports what the episode played.
    Automatic domain randomisation sets its ranges the same way (``set_next_randomization``).
    """

    def __init__(self, env: gym.Env, difficulty: float, options: dict[str, Any]) -> None:
        super().__init__(env)
        self._next = (float(difficulty), dict(options))
        self._current = self._next[0]
        self._randomization: dict[str, Any] = {}

    def set_next_episode(self, difficulty: float, options: dict[str, Any]) -> None:
        """Reset options (``curriculum.reset_options(difficulty)``) of the next episode."""
        self._next = (float(difficulty), dict(options))

    def set_next_randomization(self, options: dict[str, Any]) -> None:
        """Reset options of ADR's ranges (``adr.reset_options(episode)``: randomisation ranges
        and imperfection scales, which pass down to the imperfection wrappers) from the next
        episode on."""
        self._randomization = dict(options)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._current, chosen = self._next
        return self.env.reset(seed=seed, options={**chosen, **self._randomization,
                                                  **(options or {})})

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["curriculum_difficulty"] = self._current
        return obs, reward, terminated, truncated, info


def make_env_factory(
    config: TrainConfig, difficulty: float, reset_options: dict[str, Any]
) -> Callable[[], gym.Env]:
    """Factory of one training environment: task (+ verifier reward), observation selection,
    curriculum, ``Monitor``. Runs inside a worker process when ``n_envs > 1``."""
    spec = observation_spec(config.policy.name, config.task.obs_mode, config.policy.use_instruction)

    def factory() -> gym.Env:
        torch.set_num_threads(1)  # one torch thread per worker
        env: gym.Env = tasks.make(config.task.name, **config.task.env_options())
        if config.reward == "verifier":
            env = verifier_wrapper(env, config)
        env = SelectObservation(env, spec["keys"], spec["flatten"])
        env = CurriculumWrapper(env, difficulty, reset_options)
        return Monitor(env)

    return factory


def verifier_wrapper(env: gym.Env, config: TrainConfig) -> gym.Env:
    """Wrap ``env`` so that the detector of ``config.detector`` gives the reward."""
    import success_detectors
    from success_detectors.wrappers import VerifierWrapper

    detector = success_detectors.make(dict(config.detector), task=config.task.name)
    verifier = config.verifier
    return VerifierWrapper(env, detector, when=verifier.when, mode=verifier.mode,
                           terminate_on_detection=verifier.terminate_on_detection)


def make_vec_env(config: TrainConfig, curriculum) -> VecEnv:
    """``n_envs`` training environments: subprocesses when more than one."""
    factories = []
    for _ in range(config.n_envs):
        difficulty = curriculum.sample()
        factories.append(make_env_factory(config, difficulty, curriculum.reset_options(difficulty)))
    if config.n_envs == 1:
        return DummyVecEnv(factories)
    return SubprocVecEnv(factories)


