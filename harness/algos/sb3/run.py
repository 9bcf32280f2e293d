"""Stable-Baselines3 baselines (PPO, A2C and sb3-contrib's TRPO), used as they are.

Everything the harness adds goes through SB3's extension points: environment wrappers (observation
selection, the curriculum's difficulty), :class:`~stable_baselines3.common.callbacks.BaseCallback`
subclasses (curriculum, periodic evaluation, checkpoints, verifier error rates, wall-clock limit)
and a logger output that writes SB3's metrics into the run directory.

Observations and environments: :mod:`harness.algos.sb3.envs`; callbacks and the logger output:
:mod:`harness.algos.sb3.callbacks`.

Success: SB3 turns ``info["is_success"]`` at episode ends into ``rollout/success_rate``; with
``reward=verifier`` the task's ground truth stays in ``info["is_success"]``, the detector's
verdict (``info["verifier_success"]``) is the reward and is what the curriculum learns from.

Evaluation: periodic evaluations (and so the ``best`` checkpoint) play the validation seeds, the
final one the test seeds, greedy (``success_rate``) and sampled (``sampled_success_rate``).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.vec_env import VecEnv

import tasks
from harness import curriculum as curricula
from harness.algos.hooks import Schedule, TimeGuard, better, score
from harness.algos.sb3.callbacks import (
    AdrCallback,
    CurriculumCallback,
    EvalCheckpointCallback,
    LogDumpCallback,
    TimeLimitCallback,
    VerifierMetricsCallback,
    make_logger,
)
from harness.algos.sb3.envs import (
    SelectObservation,
    make_vec_env,
    observation_spec,
    select_observation,
)
from harness.config import TrainConfig
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


def build_model(algo: str, policy: dict[str, Any], env: gym.Env | VecEnv, device: str,
                seed: int | None = None, **algo_kwargs: Any) -> BaseAlgorithm:
    """A fresh SB3 model of ``algo`` with the network the ``policy`` group's fields describe."""
    policy_kwargs: dict[str, Any] = {
        "net_arch": list(policy["net_arch"]),
        "activation_fn": ACTIVATIONS[policy["activation"]],
        "log_std_init": policy["log_std_init"],
    }
    if policy["name"] == "cnn":
        policy_kwargs["features_extractor_kwargs"] = {"cnn_output_dim": policy["features_dim"]}
    flat = isinstance(env.observation_space, gym.spaces.Box)
    return algorithm_class(algo)("MlpPolicy" if flat else "MultiInputPolicy", env, seed=seed,
                                 device=device, verbose=0, policy_kwargs=policy_kwargs,
                                 **algo_kwargs)


def load_weights(model: BaseAlgorithm, checkpoint: Path, device: str) -> None:
    """Load the weights and optimiser state of an SB3 zip into ``model``.

    Only the zip's tensor files are read, with ``torch.load(weights_only=True)``; its ``data``
    entry, which SB3 would unpickle with cloudpickle (and so run any code a crafted file holds),
    is never deserialised: the model is rebuilt from the run's own configuration instead.

    Raises:
        CheckpointError: The zip is damaged or holds other networks than ``model``.
    """
    try:
        model.set_parameters(str(checkpoint), exact_match=True, device=device)
    except Exception as error:  # zipfile, torch and SB3 raise many types for a damaged zip
        raise CheckpointError(f"checkpoint {checkpoint} could not be loaded: {error!r}") from None


def validate_checkpoint(checkpoint: Path, metadata: dict[str, Any]) -> None:
    """Read a checkpoint to resume from, safely, before the run directory is touched: every
    tensor file of the zip loads with ``weights_only=True``.

    Raises:
        CheckpointError: The zip is damaged or holds something else.
    """
    from stable_baselines3.common.save_util import load_from_zip_file

    try:
        _, params, _ = load_from_zip_file(str(checkpoint), load_data=False, device="cpu")
    except Exception as error:  # zipfile, torch and SB3 raise many types for a damaged zip
        raise CheckpointError(f"checkpoint {checkpoint} could not be loaded: {error!r}") from None
    if "policy" not in params:
        raise CheckpointError(f"checkpoint {checkpoint} holds no policy weights "
                              f"(found {sorted(params)})")


def load_policy(
    checkpoint: Path, metadata: dict[str, Any], device: str = "cpu", sampled: bool = False,
    reference: bool = False,
) -> PolicyFn:
    """Policy function of an SB3 checkpoint (the ``harness.checkpoints`` loading contract): the
    network is rebuilt from the metadata's ``policy``, task and observation fields and only its
    weights are read from the zip (:func:`load_weights`).

    Raises:
        CheckpointError: The zip cannot be loaded.
        ValueError: ``reference``: an SB3 checkpoint holds no reference policy.
    """
    if reference:
        raise ValueError(f"reference=true: a {metadata['algo']} checkpoint holds no reference "
                         "policy; only group-trainer checkpoints do")
    spec = metadata["observation"]
    env = SelectObservation(tasks.make(metadata["task"], **metadata["task_options"]),
                            spec["keys"], spec["flatten"])
    try:
        model = build_model(metadata["algo"], metadata["policy"], env, device)
    finally:
        env.close()
    load_weights(model, checkpoint, device)
    return make_policy_fn(model, spec, sampled)


# ------------------------------------------------------------------------------------ trainer
class SB3Run:
    """One run of an SB3 baseline: builds the algorithm, environments and callbacks, trains and
    evaluates (the :class:`harness.trainers.Trainer` protocol).

    SB3's ``learn`` owns the loop (rollout, update, its callbacks); :meth:`iteration` runs one
    rollout and update of it, :meth:`train` the whole budget in one ``learn`` call.

    Args:
        config: The run's configuration (``config.algo`` an SB3 algorithm).
        run: The open run directory (resuming when ``run.resume_metadata`` is set).
    """

    has_reference_policy: ClassVar[bool] = False  # the zip holds the trained policy only
    takes_start_policy: ClassVar[bool] = False  # SB3 builds its own networks

    def __init__(self, config: TrainConfig, run: Run, start: None = None) -> None:
        torch.set_num_threads(config.torch_threads)
        self.config = config
        self.run = run
        self.obs_spec = observation_spec(config.policy.name, config.task.obs_mode,
                                         config.policy.use_instruction)
        self.curriculum = curricula.make(
            config.curriculum.name, seed=config.seeds.generator, **config.curriculum_params()
        )
        self.evaluation = Schedule(config.eval.every_steps)
        self.checkpointing = Schedule(config.checkpoint_every_steps)
        self.eval_difficulties = list(config.eval.difficulties) or [config.task.difficulty]
        self.best: dict[str, float] | None = None
        self.guard = TimeGuard(run, config.max_minutes)
        self.adr = curricula.make_adr(config.adr, config.seeds.generator)  # ADR, or None
        resume = run.resume_metadata
        if resume is not None:
            self.load_state_dict(resume["trainer_state"])
        self.env = make_vec_env(config, self.curriculum)
        self.model = self._build_model()

    def _build_model(self) -> BaseAlgorithm:
        config = self.config
        model = build_model(config.algo.name, dataclasses.asdict(config.policy), self.env,
                            config.device, seed=config.seeds.generator,
                            **config.algo.sb3_kwargs())
        resume = self.run.resume_metadata
        if resume is not None:
            path = self.run.checkpoints_dir / resume["file"]
            load_weights(model, path, config.device)
            model.num_timesteps = int(resume["num_timesteps"])
            # A fresh stream of episodes: same seeds would replay the start of the first session.
            model.set_random_seed(config.seeds.resumed_envs(model.num_timesteps))
            log.info("resuming %s from %s at step %d", config.algo.name, path, model.num_timesteps)
        model.set_logger(make_logger(self.run, self.config.logger.console))
        return model

    @staticmethod
    def preflight(config: TrainConfig) -> None:
        """Nothing beyond the config to check before the run directory is written."""

    validate_checkpoint = staticmethod(validate_checkpoint)
    load_policy = staticmethod(load_policy)

    # ------------------------------------------------------------------------ policy & eval
    def play(self, episodes: int, video_episodes: int, seed: int,
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
                            episodes, self.eval_difficulties, seed, record,
                            config.eval.max_episode_steps)

    def evaluate(self, split: str, sampled: bool = False, videos: int = 0) -> EvaluationResult:
        """The current policy on the ``validation`` seeds (``eval.episodes``, which choose
        ``best``) or the ``test`` seeds (``eval.final_episodes``), greedy or ``sampled``.

        Raises:
            ValueError: An unknown split.
        """
        if split not in ("validation", "test"):
            raise ValueError(f"split={split!r}; choose one of ('validation', 'test')")
        ev = self.config.eval
        if split == "validation":
            return self.play(ev.episodes, videos, ev.validation_seed, sampled)
        return self.play(ev.final_episodes, videos, ev.seed, sampled)

    def periodic_evaluation(self, steps: int) -> EvaluationResult:
        """On the validation seeds, which choose the ``best`` checkpoint."""
        result = self.evaluate("validation", videos=self.config.eval.video_episodes)
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
        if better(result, self.best):
            self.best = score(result)
            self.save("best")

    # ------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What a resume needs besides the zip's weights (the checkpoint's ``trainer_state``)."""
        return {
            "curriculum": self.curriculum.state_dict(),
            "adr": self.adr.state_dict() if self.adr is not None else None,
            "next_eval_step": self.evaluation.next_step,
            "next_checkpoint_step": self.checkpointing.next_step,
            "best": self.best,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the schedules, curriculum, ADR and ``best`` of :meth:`state_dict`."""
        self.curriculum.load_state_dict(state["curriculum"])
        if self.adr is not None:
            self.adr.load_state_dict(state.get("adr"))
        self.evaluation.load_state_dict({"next_step": state["next_eval_step"]})
        self.checkpointing.load_state_dict({"next_step": state["next_checkpoint_step"]})
        self.best = state["best"]

    def save(self, name: str) -> Path:
        """Write checkpoint ``name`` (SB3 zip) with the state a resume needs."""
        metadata = self.run.checkpoint_metadata(
            self.model.num_timesteps,
            observation=self.obs_spec,
            evaluation={"seed": self.config.eval.seed,
                        "validation_seed": self.config.eval.validation_seed,
                        "difficulties": self.eval_difficulties,
                        "max_episode_steps": self.config.eval.max_episode_steps},
            trainer_state=self.state_dict(),
        )
        return self.run.save_checkpoint(name, CHECKPOINT_SUFFIX, self.model.save, metadata)

    # ---------------------------------------------------------------------------- training
    def callbacks(self) -> CallbackList:
        verifier = self.config.reward == "verifier"
        outcome = "verifier_success" if verifier else "is_success"
        callbacks: list[BaseCallback] = [
            CurriculumCallback(self.curriculum, self.run, outcome),
            EvalCheckpointCallback(self),
        ]
        if self.adr is not None:
            callbacks.append(AdrCallback(self.adr, self.run, outcome))
        if verifier:
            callbacks.append(VerifierMetricsCallback(self.run))
        if self.guard.limit_s is not None:
            callbacks.append(TimeLimitCallback(self.guard))
        rollout = self.rollout_steps()
        callbacks.append(LogDumpCallback(self.log_interval() * rollout, rollout))  # last: as SB3
        return CallbackList(callbacks)

    def rollout_steps(self) -> int:
        """Environment steps of one rollout: ``algo.n_steps`` on each of ``n_envs``."""
        return self.config.algo.n_steps * self.config.n_envs

    def log_interval(self) -> int:
        """Rollouts between two dumps of SB3's logged values (``algo.log_interval``, or about
        one dump per 2,048 steps)."""
        algo = self.config.algo
        if algo.log_interval:
            return algo.log_interval
        return max(1, round(2048 / self.rollout_steps()))

    def _learn(self, steps: int, fresh: bool) -> None:
        self.model.learn(steps, callback=self.callbacks(), log_interval=None,  # LogDumpCallback
                         reset_num_timesteps=fresh, progress_bar=self.config.logger.progress_bar)

    def iteration(self) -> dict[str, float]:
        """One rollout and update of SB3's loop (its callbacks included); the step count."""
        self._learn(self.rollout_steps(), fresh=False)
        return {"time/steps": float(self.model.num_timesteps)}

    def train(self) -> dict[str, Any]:
        """Train up to ``total_timesteps`` (or the time limit), then the final evaluation."""
        remaining = self.config.total_timesteps - self.model.num_timesteps
        if remaining > 0:
            self._learn(remaining, fresh=self.run.resume_metadata is None)
        self.env.close()
        steps = self.model.num_timesteps
        self.save("latest")  # before the final evaluation: a failure there loses no training
        # ``best`` is chosen on the validation seeds only; without periodic evaluations there
        # is no validation, and the last policy is the best one.
        if self.evaluation.every:
            self.consider_best(self.periodic_evaluation(steps))
        else:
            self.save("best")
        config = self.config
        final = self.evaluate("test", videos=config.eval.video_episodes)
        sampled = self.evaluate("test", sampled=True)
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
            "time_limit_reached": self.guard.reached,
            "seed_ranges": config.seed_ranges(),
            "device": str(self.model.device),
            "checkpoints": {"latest": "checkpoints/latest.zip", "best": "checkpoints/best.zip"},
        }
