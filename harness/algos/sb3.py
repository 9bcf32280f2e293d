"""Stable-Baselines3 baselines (PPO, A2C and sb3-contrib's TRPO), used as they are.

Everything the harness adds goes through SB3's extension points: environment wrappers (observation
selection, the curriculum's difficulty), :class:`~stable_baselines3.common.callbacks.BaseCallback`
subclasses (curriculum, periodic evaluation, checkpoints, verifier error rates, wall-clock limit)
and a logger output that writes SB3's metrics into the run directory.

Observations: ``policy=mlp`` reads the ``state`` vector (plus the instruction tokens when
``policy.use_instruction``), flattened into one ``Box`` for SB3's ``MlpPolicy``; ``policy=cnn``
keeps a ``Dict`` of ``pixels`` (NatureCNN), ``proprio`` and, in ``pixels_state`` mode, ``state``
for ``MultiInputPolicy``.

Success: SB3 turns ``info["is_success"]`` at episode ends into ``rollout/success_rate``; with
``reward=verifier`` the task's ground truth stays in ``info["is_success"]``, the detector's
verdict (``info["verifier_success"]``) is the reward and is what the curriculum learns from.

Evaluation: periodic evaluations (and so the ``best`` checkpoint) play the validation seeds, the
final one the test seeds, greedy (``success_rate``) and sampled (``sampled_success_rate``).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.logger import HumanOutputFormat, KVWriter, Logger
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

import tasks
from harness import curriculum as curricula
from harness.config import OBS_MODE_KEYS, TRAIN_SEED_STRIDE, TrainConfig
from harness.evaluation import EvaluationResult, PolicyFn, evaluate
from harness.runs import CheckpointError, Run

log = logging.getLogger(__name__)

CHECKPOINT_SUFFIX = ".zip"
ACTIVATIONS: dict[str, type[torch.nn.Module]] = {
    "tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "elu": torch.nn.ELU,
}


def algorithm_class(name: str) -> type[BaseAlgorithm]:
    """The SB3 class of ``ppo``, ``a2c`` or ``trpo``."""
    if name == "ppo":
        return PPO
    if name == "a2c":
        return A2C
    if name == "trpo":
        from sb3_contrib import TRPO

        return TRPO
    raise ValueError(f"unknown SB3 algo {name!r}; choose one of ('ppo', 'a2c', 'trpo')")


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
    """

    def __init__(self, env: gym.Env, difficulty: float, options: dict[str, Any]) -> None:
        super().__init__(env)
        self._next = (float(difficulty), dict(options))
        self._current = self._next[0]

    def set_next_episode(self, difficulty: float, options: dict[str, Any]) -> None:
        """Reset options (``curriculum.reset_options(difficulty)``) of the next episode."""
        self._next = (float(difficulty), dict(options))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._current, chosen = self._next
        return self.env.reset(seed=seed, options={**chosen, **(options or {})})

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


# ------------------------------------------------------------------------------------ logging
class RunOutputFormat(KVWriter):
    """SB3 logger output that writes into the run directory (metrics.csv, TensorBoard)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def write(
        self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0
    ) -> None:
        self.run.log(key_values, step)

    def close(self) -> None:
        """The run closes its own files."""


def make_logger(run: Run, console: bool) -> Logger:
    """SB3 logger writing into ``run`` (and a table on stdout with ``console``)."""
    formats: list[KVWriter] = [RunOutputFormat(run)]
    if console:
        formats.append(HumanOutputFormat(sys.stdout))
    return Logger(folder=str(run.dir), output_formats=formats)


# ---------------------------------------------------------------------------------- callbacks
class CurriculumCallback(BaseCallback):
    """Feeds finished episodes to the curriculum and chooses the next difficulty of that env.

    The outcome is the reward's: the verifier's verdict (``info["verifier_success"]``) when a
    verifier gives the reward, else the ground truth ``info["is_success"]``. The vector env has
    already reset the finished env when ``_on_step`` runs, so a choice made here plays from that
    env's following episode: the schedule lags one episode per env.

    Args:
        curriculum: The run's curriculum.
        run: The run (for its metrics).
        outcome_key: The ``info`` key of an episode's outcome.
    """

    def __init__(self, curriculum, run: Run, outcome_key: str = "is_success") -> None:
        super().__init__()
        self.curriculum = curriculum
        self.run = run
        self.outcome_key = outcome_key

    def _on_step(self) -> bool:
        for index, done in enumerate(self.locals["dones"]):
            if not done:
                continue
            info = self.locals["infos"][index]
            if self.outcome_key not in info:
                raise KeyError(f"episode ended without info[{self.outcome_key!r}]; the verifier "
                               "wrapper must score the last step (verifier.when)")
            self.curriculum.update(info["curriculum_difficulty"],
                                   [bool(info[self.outcome_key])])
            difficulty = self.curriculum.sample()
            self.training_env.env_method(
                "set_next_episode", difficulty, self.curriculum.reset_options(difficulty),
                indices=[index],
            )
        return True

    def _on_rollout_end(self) -> None:
        if not isinstance(self.curriculum, curricula.FixedCurriculum):
            self.run.log(self.curriculum.metrics(), self.num_timesteps)


class VerifierMetricsCallback(BaseCallback):
    """Logs the verifier's error rates against the ground truth (``detector/...``) over each
    rollout, from the verdict counts of every environment added up."""

    def __init__(self, run: Run) -> None:
        super().__init__()
        self.run = run

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        from success_detectors.wrappers import DetectorCounts

        counts = sum(self.training_env.get_attr("counts"), DetectorCounts())
        self.training_env.env_method("error_rates", reset=True)  # the next rollout counts afresh
        self.run.log(counts.error_rates(), self.num_timesteps)


class TimeLimitCallback(BaseCallback):
    """Stops training after ``seconds`` of wall-clock time in this process: a guard, since a
    budget in time makes results depend on the machine; ``reached`` says whether it acted."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self._deadline = float("inf")
        self.reached = False

    def _on_training_start(self) -> None:
        self._deadline = time.perf_counter() + self.seconds

    def _on_step(self) -> bool:
        if time.perf_counter() >= self._deadline:
            self.reached = True
            log.warning("max_minutes cut the run short at %d env steps", self.num_timesteps)
        return not self.reached


class EvalCheckpointCallback(BaseCallback):
    """At rollout starts (when every collected step has been trained on): periodic deterministic
    evaluation on held-out seeds (``best`` checkpoint on improvement, a video) and the ``latest``
    checkpoint; both checkpoints carry the curriculum and this callback's state for a resume."""

    def __init__(self, trainer: SB3Trainer) -> None:
        super().__init__()
        self.trainer = trainer

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        steps = self.num_timesteps
        trainer = self.trainer
        if trainer.eval_every and steps >= trainer.next_eval_step:
            trainer.periodic_evaluation(steps)
            trainer.next_eval_step = (steps // trainer.eval_every + 1) * trainer.eval_every
        if steps >= trainer.next_checkpoint_step:
            trainer.save("latest")
            every = trainer.config.checkpoint_every_steps
            trainer.next_checkpoint_step = (steps // every + 1) * every


# ------------------------------------------------------------------------------------ trainer
class SB3Trainer:
    """Builds the algorithm, environments and callbacks of one run, trains and evaluates.

    Args:
        config: The run's configuration (``config.algo`` an SB3 algorithm).
        run: The open run directory (resuming when ``run.resume_metadata`` is set).
    """

    def __init__(self, config: TrainConfig, run: Run) -> None:
        self.config = config
        self.run = run
        self.obs_spec = observation_spec(config.policy.name, config.task.obs_mode,
                                         config.policy.use_instruction)
        self.curriculum = curricula.make(
            config.curriculum.name, seed=config.seed, **config.curriculum_params()
        )
        self.eval_every = config.eval.every_steps
        self.eval_difficulties = list(config.eval.difficulties) or [config.task.difficulty]
        self.next_eval_step = self.eval_every
        self.next_checkpoint_step = config.checkpoint_every_steps
        self.best: dict[str, float] | None = None
        self.time_limit = (TimeLimitCallback(60.0 * config.max_minutes)
                           if config.max_minutes is not None else None)
        resume = run.resume_metadata
        if resume is not None:
            state = resume["trainer_state"]
            self.curriculum.load_state_dict(state["curriculum"])
            self.next_eval_step = int(state["next_eval_step"])
            self.next_checkpoint_step = int(state["next_checkpoint_step"])
            self.best = state["best"]
        self.env = make_vec_env(config, self.curriculum)
        self.model = self._build_model()

    def _build_model(self) -> BaseAlgorithm:
        config, cls = self.config, algorithm_class(self.config.algo.name)
        resume = self.run.resume_metadata
        if resume is not None:
            path = self.run.checkpoints_dir / resume["file"]
            try:
                model = cls.load(path, env=self.env, device=config.device)
            except Exception as error:  # SB3 raises many types for a damaged zip
                raise CheckpointError(f"checkpoint {path} could not be loaded: {error!r}") from None
            # A fresh stream of episodes: same seeds would replay the start of the first session.
            model.set_random_seed((config.seed + 1) * TRAIN_SEED_STRIDE + model.num_timesteps)
            log.info("resuming %s from %s at step %d", config.algo.name, path, model.num_timesteps)
        else:
            policy = config.policy
            policy_kwargs: dict[str, Any] = {
                "net_arch": list(policy.net_arch),
                "activation_fn": ACTIVATIONS[policy.activation],
                "log_std_init": policy.log_std_init,
            }
            if policy.name == "cnn":
                policy_kwargs["features_extractor_kwargs"] = {"cnn_output_dim": policy.features_dim}
            model = cls(
                "MlpPolicy" if self.obs_spec["flatten"] else "MultiInputPolicy",
                self.env,
                seed=config.seed,
                device=config.device,
                verbose=0,
                policy_kwargs=policy_kwargs,
                **config.algo.sb3_kwargs(),
            )
        model.set_logger(make_logger(self.run, self.config.logger.console))
        return model

    # ------------------------------------------------------------------------ policy & eval
    def evaluate(self, episodes: int, video_episodes: int, seed: int,
                 sampled: bool = False) -> EvaluationResult:
        """Greedy (or ``sampled``, seeded by ``seed``) episodes from ``seed`` on."""
        config = self.config
        record = video_episodes if config.logger.videos else 0

        def env_factory() -> gym.Env:
            return tasks.make(config.task.name, render_mode="rgb_array" if record else None,
                              **config.task.env_options())

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return evaluate(make_policy_fn(self.model, self.obs_spec, sampled), env_factory,
                            episodes, self.eval_difficulties, seed, record)

    def periodic_evaluation(self, steps: int) -> EvaluationResult:
        """On the validation seeds, which choose the ``best`` checkpoint."""
        result = self.evaluate(self.config.eval.episodes, self.config.eval.video_episodes,
                               self.config.eval.validation_seed)
        self.run.log(result.metrics(), steps)
        for index, frames in enumerate(result.videos):
            self.run.write_video(f"eval_{steps:09d}_{index}", frames)
        low, high = result.success_interval
        log.info("eval at %d steps: success %.3f [%.3f, %.3f], length %.1f", steps,
                 result.success_rate, low, high, result.mean_length)
        self.consider_best(result)
        return result

    def consider_best(self, result: EvaluationResult) -> None:
        """Save ``best`` when ``result`` beats the best evaluation so far (success, then return)."""
        score = {"success_rate": result.success_rate, "mean_return": result.mean_return}
        if self.best is None or (score["success_rate"], score["mean_return"]) > (
            self.best["success_rate"], self.best["mean_return"]
        ):
            self.best = score
            self.save("best")

    # ------------------------------------------------------------------------- checkpoints
    def save(self, name: str) -> Path:
        """Write checkpoint ``name`` (SB3 zip) with the state a resume needs."""
        metadata = self.run.checkpoint_metadata(
            self.model.num_timesteps,
            observation=self.obs_spec,
            evaluation={"seed": self.config.eval.seed,
                        "validation_seed": self.config.eval.validation_seed,
                        "difficulties": self.eval_difficulties},
            trainer_state={
                "curriculum": self.curriculum.state_dict(),
                "next_eval_step": self.next_eval_step,
                "next_checkpoint_step": self.next_checkpoint_step,
                "best": self.best,
            },
        )
        return self.run.save_checkpoint(name, CHECKPOINT_SUFFIX, self.model.save, metadata)

    # ---------------------------------------------------------------------------- training
    def callbacks(self) -> CallbackList:
        verifier = self.config.reward == "verifier"
        callbacks: list[BaseCallback] = [
            CurriculumCallback(self.curriculum, self.run,
                               "verifier_success" if verifier else "is_success"),
            EvalCheckpointCallback(self),
        ]
        if verifier:
            callbacks.append(VerifierMetricsCallback(self.run))
        if self.time_limit is not None:
            callbacks.append(self.time_limit)
        return CallbackList(callbacks)

    def log_interval(self) -> int:
        algo = self.config.algo
        if algo.log_interval:
            return algo.log_interval
        return max(1, round(2048 / (algo.n_steps * self.config.n_envs)))

    def train(self) -> dict[str, Any]:
        """Train up to ``total_timesteps`` (or the time limit), then the final evaluation."""
        remaining = self.config.total_timesteps - self.model.num_timesteps
        if remaining > 0:
            self.model.learn(
                remaining, callback=self.callbacks(), log_interval=self.log_interval(),
                reset_num_timesteps=self.run.resume_metadata is None,
                progress_bar=self.config.logger.progress_bar,
            )
        self.env.close()
        steps = self.model.num_timesteps
        self.save("latest")  # before the final evaluation: a failure there loses no training
        # ``best`` is chosen on the validation seeds only; without periodic evaluations there
        # is no validation, and the last policy is the best one.
        if self.eval_every:
            self.consider_best(self.periodic_evaluation(steps))
        else:
            self.save("best")
        config = self.config
        final = self.evaluate(config.eval.final_episodes, config.eval.video_episodes,
                              config.eval.seed)
        sampled = self.evaluate(config.eval.final_episodes, 0, config.eval.seed, sampled=True)
        self.run.log({**final.metrics("final"), **sampled.metrics("final_sampled")}, steps)
        for index, frames in enumerate(final.videos):
            self.run.write_video(f"final_{index}", frames)
        log.info("final evaluation at %d steps:\n%s", steps, final.table())
        return {
            **final.summary(),
            "sampled_success_rate": sampled.success_rate,
            "sampled_success_interval": list(sampled.success_interval),
            "env_steps": steps,
            "best_eval": self.best,
            "time_limit_reached": bool(self.time_limit and self.time_limit.reached),
            "seed_ranges": config.seed_ranges(),
            "device": str(self.model.device),
            "checkpoints": {"latest": "checkpoints/latest.zip", "best": "checkpoints/best.zip"},
        }


def train(config: TrainConfig, run: Run) -> dict[str, Any]:
    """Train an SB3 baseline (``harness.runs.ALGORITHMS`` entry of ppo, a2c and trpo)."""
    torch.set_num_threads(config.torch_threads)
    return SB3Trainer(config, run).train()


# -------------------------------------------------------------------------------- evaluation
def make_policy_fn(
    model: BaseAlgorithm, obs_spec: dict[str, Any], sampled: bool = False
) -> PolicyFn:
    """Action of ``model`` for a raw task observation dict: deterministic, or sampled."""
    keys, flatten = list(obs_spec["keys"]), bool(obs_spec["flatten"])

    def act(obs: dict[str, np.ndarray]) -> np.ndarray:
        action, _ = model.predict(select_observation(obs, keys, flatten),
                                  deterministic=not sampled)
        return action

    return act


def load_policy(
    checkpoint: Path, metadata: dict[str, Any], device: str = "cpu", sampled: bool = False
) -> PolicyFn:
    """Policy function of an SB3 checkpoint (the ``harness.evaluation`` loading contract).

    Raises:
        CheckpointError: The zip cannot be loaded.
    """
    cls = algorithm_class(metadata["algo"])
    try:
        model = cls.load(checkpoint, device=device)
    except Exception as error:  # SB3 raises many types for a damaged zip
        raise CheckpointError(f"checkpoint {checkpoint} could not be loaded: {error!r}") from None
    return make_policy_fn(model, metadata["observation"], sampled)
