"""Group-relative fine-tuning of token policies: GRPO, Dr. GRPO, RLOO, critic baseline, REINFORCE.

One iteration, in the order of the papers (Shao et al. 2024; Liu et al. 2025):

1. draw B start states (difficulty from the curriculum) and snapshot them;
2. roll out G attempts from each by restoring its snapshot (worker processes, each with its own
   environments and renderer, stepping attempts in lock-step with batched policy calls);
3. score every attempt with the verifier (scripted predicate, or a learned detector on the last
   frame) -> one binary reward per attempt;
4. advantages per group (``harness.algos.objectives.group_advantages``); zero-signal groups are
   counted, and kept, dropped or re-sampled;
5. ``num_iterations`` epochs of minibatch updates of the clipped surrogate
   (``harness.algos.objectives.policy_loss``) against the sampling policy, with an optional k3 KL
   penalty to a frozen copy of the starting policy.

An attempt's tokens are every action dimension of every step until it ends, so successful attempts
that terminate early are shorter: that is where GRPO's per-attempt length normalisation and
Dr. GRPO's constant normaliser differ.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import logging
import math
import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import tasks
from harness import curriculum as curricula
from harness.algos.objectives import group_advantages, policy_loss
from harness.policies import (
    TokenPolicy,
    build_policy,
    obs_to_batch,
)
from harness.policies import (
    load_policy as load_token_policy,
)
from harness.policies import (
    make as make_policy,
)

log = logging.getLogger(__name__)
ESTIMATOR_OF_ALGO = {
    "grpo": "grpo", "dr_grpo": "dr_grpo", "rloo": "rloo", "critic": "critic",
    "reinforce": "reinforce",
}
MAX_RESAMPLE_ROUNDS = 4


# ------------------------------------------------------------------------------ rollouts
@dataclass
class RolloutBatch:
    """Attempts of one iteration, steps concatenated attempt by attempt.

    Attributes:
        obs: Observation arrays, ``(N_steps, ...)`` per key.
        tokens: Action tokens, ``(N_steps, action_dim)`` int64.
        lengths: Steps of each attempt, ``(A,)``; attempt ``i`` owns a contiguous slice.
        success: Ground-truth success at the attempt's end, ``(A,)`` bool.
        final_frames: Last frame of each attempt for an image detector, or ``None``.
        group: Group index of each attempt, ``(A,)``; groups are contiguous, G attempts each.
        difficulty: Difficulty of each attempt's start state, ``(A,)``.
        timing: Seconds spent rendering+stepping (env) and in the policy, summed over workers.
    """

    obs: dict[str, np.ndarray]
    tokens: np.ndarray
    lengths: np.ndarray
    success: np.ndarray
    final_frames: np.ndarray | None
    group: np.ndarray
    difficulty: np.ndarray
    timing: dict[str, float]

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.lengths)[:-1]))

    @staticmethod
    def concat(parts: list[RolloutBatch]) -> RolloutBatch:
        frames = [p.final_frames for p in parts]
        return RolloutBatch(
            obs={k: np.concatenate([p.obs[k] for p in parts]) for k in parts[0].obs},
            tokens=np.concatenate([p.tokens for p in parts]),
            lengths=np.concatenate([p.lengths for p in parts]),
            success=np.concatenate([p.success for p in parts]),
            final_frames=None if frames[0] is None else np.concatenate(frames),
            group=np.concatenate([p.group for p in parts]),
            difficulty=np.concatenate([p.difficulty for p in parts]),
            timing={k: sum(p.timing.get(k, 0.0) for p in parts) for k in parts[0].timing},
        )


class RolloutEngine:
    """Runs attempts from snapshots in ``num_envs`` environments of one process, in lock-step.

    Args:
        task: Task name.
        task_options: Options of ``tasks.make``.
        policy_spec: ``(TokenPolicyConfig, obs_shapes)`` to build the local policy copy.
        num_envs: Environments stepped together (one batched policy call per step).
        verifier_view: ``(camera, size)`` of the frame an image detector reads, or ``None``.
    """

    def __init__(self, task: str, task_options: dict[str, Any], policy_spec: tuple,
                 num_envs: int, verifier_view: tuple[str, int] | None = None) -> None:
        torch.set_flush_denormal(True)  # see train()
        self.envs = [tasks.make(task, **task_options) for _ in range(num_envs)]
        self.policy = build_policy(*policy_spec)
        self.policy.eval()
        self.verifier_view = verifier_view

    def run(self, state_dict: dict[str, torch.Tensor] | None, jobs: list[tuple], temperature: float,
            seed: int) -> RolloutBatch:
        """Play every job ``(snapshot, group, difficulty)`` once; attempts return in job order."""
        if state_dict is not None:
            self.policy.load_state_dict(state_dict)
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        env_time = policy_time = 0.0
        records: list[dict[str, Any]] = [{} for _ in jobs]
        pending = list(range(len(jobs)))[::-1]
        active: dict[int, int] = {}  # env slot -> job index

        def start(slot: int) -> None:
            nonlocal env_time
            job = pending.pop()
            t0 = time.perf_counter()
            obs, _ = self.envs[slot].reset(options={"snapshot": jobs[job][0]})
            env_time += time.perf_counter() - t0
            records[job] = {"obs": [obs], "tokens": []}
            active[slot] = job

        for slot in range(len(self.envs)):
            if pending:
                start(slot)
        while active:
            slots = list(active)
            t0 = time.perf_counter()
            batch = obs_to_batch([records[active[s]]["obs"][-1] for s in slots])
            tokens, actions = self.policy.act(batch, temperature=temperature)
            actions = actions.numpy()
            policy_time += time.perf_counter() - t0
            for row, slot in enumerate(slots):
                job = active[slot]
                record = records[job]
                record["tokens"].append(tokens[row].numpy())
                t0 = time.perf_counter()
                obs, _, terminated, truncated, info = self.envs[slot].step(actions[row])
                env_time += time.perf_counter() - t0
                if terminated or truncated:
                    record["success"] = bool(info["is_success"])
                    if self.verifier_view is not None:
                        camera, size = self.verifier_view
                        record["frame"] = self.envs[slot].unwrapped.render_camera(camera, size)
                    del active[slot]
                    if pending:
                        start(slot)
                else:
                    record["obs"].append(obs)
        torch.random.set_rng_state(generator_state)

        lengths = np.array([len(r["tokens"]) for r in records])
        keys = records[0]["obs"][0].keys()
        obs_arrays = {k: np.stack([o[k] for r in records for o in r["obs"]]) for k in keys}
        return RolloutBatch(
            obs=obs_arrays,
            tokens=np.concatenate([np.stack(r["tokens"]) for r in records]).astype(np.int64),
            lengths=lengths,
            success=np.array([r["success"] for r in records]),
            final_frames=np.stack([r["frame"] for r in records]) if self.verifier_view else None,
            group=np.array([job[1] for job in jobs]),
            difficulty=np.array([job[2] for job in jobs], dtype=np.float64),
            timing={"env": env_time, "policy": policy_time},
        )

    def close(self) -> None:
        for env in self.envs:
            env.close()


class RolloutWorkerError(RuntimeError):
    """An exception raised inside a rollout worker process, with its traceback."""


def _worker_main(connection, engine_args: tuple) -> None:
    # Mesa's llvmpipe rasterises with one thread per core by default; with one rollout process
    # per core that oversubscribes the machine (measured: 2-worker scaling 1.23x -> 1.43x).
    os.environ.setdefault("LP_NUM_THREADS", "1")
    torch.set_num_threads(1)  # one core per worker; the trainer process keeps its own setting
    engine = RolloutEngine(*engine_args)
    try:
        while True:
            message = connection.recv()
            if message is None:
                break
            try:
                result = engine.run(*message)
            except Exception as error:  # report it to the trainer, which raises it there
                result = RolloutWorkerError(f"{type(error).__name__}: {error}\n"
                                            f"{traceback.format_exc()}")
            connection.send(result)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the trainer is gone (killed or crashed): stop quietly instead of lingering
    finally:
        engine.close()
        connection.close()


class RolloutPool:
    """``workers`` rollout processes (or the calling process when ``workers == 1``).

    Jobs are split into contiguous chunks, one per worker; the policy weights travel with every
    request, so workers always sample from the current policy.
    """

    def __init__(self, workers: int, engine_args: tuple) -> None:
        self.workers = workers
        self._local = RolloutEngine(*engine_args) if workers == 1 else None
        self._connections = []
        self._processes = []
        if workers > 1:
            context = mp.get_context("spawn")
            for _ in range(workers):
                parent, child = context.Pipe()
                process = context.Process(target=_worker_main, args=(child, engine_args),
                                          daemon=True)
                process.start()
                self._connections.append(parent)
                self._processes.append(process)

    def run(self, policy: TokenPolicy, jobs: list[tuple], temperature: float,
            seed: int) -> RolloutBatch:
        state = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
        if self._local is not None:
            return self._local.run(state, jobs, temperature, seed)
        chunks = np.array_split(np.arange(len(jobs)), self.workers)
        used = []
        for i, (connection, chunk) in enumerate(zip(self._connections, chunks, strict=True)):
            if len(chunk):
                connection.send((state, [jobs[j] for j in chunk], temperature, seed * 1000 + i))
                used.append(connection)
        results = [connection.recv() for connection in used]
        for result in results:
            if isinstance(result, RolloutWorkerError):
                raise RolloutWorkerError(f"a rollout worker failed: {result}")
        return RolloutBatch.concat(results)

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
        for connection in self._connections:
            try:
                connection.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()


# ------------------------------------------------------------------------------ the update
DIAGNOSTIC_STEPS = 512  # steps on which entropy and KL to the reference are estimated

def attempt_tensor(values: torch.Tensor, lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-step ``(N_steps, action_dim)`` values -> padded per-attempt tokens ``(A, T)`` + mask."""
    per_attempt = torch.split(values.reshape(len(values), -1), lengths.tolist())
    flat = [v.reshape(-1) for v in per_attempt]
    padded = torch.nn.utils.rnn.pad_sequence(flat, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(v, dtype=torch.bool) for v in flat],
                                           batch_first=True)
    return padded, mask


def select_attempts(batch_obs: dict[str, torch.Tensor], tokens: torch.Tensor, starts: np.ndarray,
                    lengths: np.ndarray, attempts: np.ndarray):
    """Steps of the chosen attempts, concatenated in their order."""
    index = np.concatenate([np.arange(starts[a], starts[a] + lengths[a]) for a in attempts])
    index_t = torch.as_tensor(index)
    return {k: v[index_t] for k, v in batch_obs.items()}, tokens[index_t], index_t


class GroupTrainer:
    """State and update rule of the group-relative fine-tuner (see the module docstring).

    Args:
        cfg: The run's ``TrainConfig`` (``cfg.algo`` a ``GroupAlgoConfig``).
        policy: The policy to fine-tune (its starting weights become the KL reference).
    """

    def __init__(self, cfg, policy: TokenPolicy) -> None:
        algo = cfg.algo
        self.cfg = cfg
        self.algo = algo
        self.estimator = ESTIMATOR_OF_ALGO[algo.name]
        if self.estimator in ("grpo", "dr_grpo", "rloo") and algo.group_size < 2:
            raise ValueError(f"algo.group_size={algo.group_size}: the {algo.name!r} estimator "
                             "compares attempts within a group and needs group_size >= 2")
        self.aggregation = algo.aggregation  # conf/algo/dr_grpo.yaml picks token_sum_const
        self.policy = policy
        self.reference = copy.deepcopy(policy).eval()
        for parameter in self.reference.parameters():
            parameter.requires_grad_(False)
        self.freeze_encoder = bool(getattr(algo, "freeze_encoder", False))
        if self.freeze_encoder:
            if not hasattr(policy, "encode_image"):
                raise ValueError(
                    f"algo.freeze_encoder=true needs a policy with an image encoder "
                    f"(policy=tiny_vla); {type(policy).__name__} has none")
            for parameter in policy.image_encoder.parameters():
                parameter.requires_grad_(False)
        self._trainable = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self._trainable, lr=algo.learning_rate)
        self.max_tokens = None  # set from the env's episode limit by train()

    def update(self, rollout: RolloutBatch, rewards: np.ndarray,
               keep_groups: np.ndarray) -> dict[str, float]:
        """Advantages, then ``num_iterations`` epochs of minibatch updates; returns metrics.

        Only the steps of the kept groups' attempts are evaluated: with ``zero_signal=drop``
        the others carry no gradient, so no log-probability of theirs is computed.
        """
        algo, policy = self.algo, self.policy
        obs = obs_to_batch(rollout.obs, batched=True)
        tokens = torch.as_tensor(rollout.tokens)
        starts, lengths = rollout.starts, rollout.lengths
        rewards_t = torch.as_tensor(rewards, dtype=torch.float32)
        values = None
        if self.estimator == "critic":
            with torch.no_grad():
                values = policy.value({k: v[torch.as_tensor(starts)] for k, v in obs.items()})
        advantages = group_advantages(rewards_t, algo.group_size, self.estimator, values=values)

        # The update's data: the kept attempts, renumbered 0..A-1, their steps concatenated.
        attempts = np.flatnonzero(np.repeat(keep_groups, algo.group_size))
        kept_lengths = lengths[attempts]
        kept_starts = np.concatenate([[0], np.cumsum(kept_lengths)[:-1]]).astype(np.int64)
        kept_advantages, kept_rewards = advantages[attempts], rewards_t[attempts]
        metrics: dict[str, list[float]] = {}
        old_logp = ref_logp = None
        if len(attempts):
            kept_obs, kept_tokens, _ = select_attempts(obs, tokens, starts, lengths, attempts)
            with torch.no_grad():
                if self.freeze_encoder:  # the encoder never changes: encode each frame once
                    kept_obs = self._with_image_features(kept_obs)
                old_logp = self._log_probs(policy, kept_obs, kept_tokens)
                # Without a KL penalty the reference is only watched, on a subsample of steps
                # (a full pass costs as much as a third of an update epoch on pixels).
                if algo.beta > 0:
                    ref_logp = self._log_probs(self.reference, kept_obs, kept_tokens)
            generator = np.random.default_rng(self.cfg.seed)
            for _ in range(algo.num_iterations):
                order = generator.permutation(len(attempts))
                for begin in range(0, len(order), algo.minibatch_size):
                    chosen = np.sort(order[begin:begin + algo.minibatch_size])
                    stats = self._step(kept_obs, kept_tokens, kept_starts, kept_lengths, chosen,
                                       old_logp, ref_logp, kept_advantages, kept_rewards)
                    for key, value in stats.items():
                        metrics.setdefault(key, []).append(float(value))

        result = {f"train/{k}": float(np.mean(v)) for k, v in metrics.items()}
        # Entropy and KL to the reference are diagnostics: a subsample of steps is enough, and
        # on pixels each evaluated frame costs as much as in the update itself.
        with torch.no_grad():
            source = kept_obs if old_logp is not None else obs
            stride = max(1, len(next(iter(source.values()))) // DIAGNOSTIC_STEPS)
            sample = {k: v[::stride] for k, v in source.items()}
            result["train/entropy"] = float(policy.entropy(sample).mean())
            if old_logp is not None:
                # k3 estimate of KL(sampling policy || reference) on the sampled tokens
                if ref_logp is None:
                    ref_logp = self._log_probs(self.reference, sample, kept_tokens[::stride])
                else:
                    ref_logp = ref_logp[::stride]
                log_ratio = ref_logp - old_logp[::stride]
                kl_ref = float((torch.exp(log_ratio) - log_ratio - 1).mean())
            else:
                kl_ref = float("nan")  # no group carried signal: nothing was evaluated
        result.update({
            "train/kl_to_reference": kl_ref,
            "train/advantage_mean": float(advantages.mean()),
            "train/advantage_std": float(advantages.std()) if len(advantages) > 1 else 0.0,
            "train/advantage_abs_max": float(advantages.abs().max()),
            "train/updated_attempts": float(len(attempts)),
        })
        return result

    def _with_image_features(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``obs`` with ``pixels`` replaced by the (frozen) encoder's features, in chunks."""
        pixels, chunk = obs["pixels"], 1024
        features = torch.cat([self.policy.encode_image(pixels[i:i + chunk])
                              for i in range(0, len(pixels), chunk)])
        return {**{k: v for k, v in obs.items() if k != "pixels"}, "image_features": features}

    def _step(self, obs, tokens, starts, lengths, chosen, old_logp, ref_logp, advantages,
              rewards) -> dict[str, float]:
        """One gradient step on the attempts ``chosen`` (indices into ``starts``/``lengths``)."""
        algo, policy = self.algo, self.policy
        mb_obs, mb_tokens, index = select_attempts(obs, tokens, starts, lengths, chosen)
        mb_lengths = lengths[chosen]
        logp_pad, mask = attempt_tensor(policy.log_prob(mb_obs, mb_tokens), mb_lengths)
        old_pad, _ = attempt_tensor(old_logp[index], mb_lengths)
        ref_pad = None if ref_logp is None else attempt_tensor(ref_logp[index], mb_lengths)[0]
        loss, stats = policy_loss(
            logp_pad, old_pad, advantages[chosen], mask,
            clip_low=algo.clip_low, clip_high=algo.clip_high,
            aggregation=self.aggregation, max_tokens=self.max_tokens,
            ref_logp=ref_pad, beta=algo.beta,
        )
        if self.estimator == "critic":
            first = torch.as_tensor(starts[chosen])
            value = policy.value({k: v[first] for k, v in obs.items()})
            value_loss = torch.mean((value - rewards[chosen]) ** 2)
            loss = loss + 0.5 * value_loss
            stats["value_loss"] = float(value_loss.detach())
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite policy loss ({float(loss)}) at a minibatch of "
                f"{len(chosen)} attempts; the last good checkpoint is kept"
            )
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self._trainable, algo.max_grad_norm)
        self.optimizer.step()
        stats["loss"] = float(loss.detach())
        stats["grad_norm"] = float(grad_norm)
        return stats

    @staticmethod
    def _log_probs(policy: TokenPolicy, obs: dict[str, torch.Tensor],
                   tokens: torch.Tensor) -> torch.Tensor:
        size, chunk = len(tokens), 1024
        return torch.cat([
            policy.log_prob({k: v[i:i + chunk] for k, v in obs.items()}, tokens[i:i + chunk])
            for i in range(0, size, chunk)
        ])

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "reference": self.reference.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.reference.load_state_dict(state["reference"])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except ValueError as error:  # Adam's state covers another set of parameters
            raise ValueError(
                f"the checkpoint's optimizer does not fit this run ({error}); resume with the "
                f"algo.freeze_encoder the run started with (now {self.freeze_encoder})"
            ) from error


# ------------------------------------------------------------------------------- the loop
def _score(rollout: RolloutBatch, detector) -> tuple[np.ndarray, dict[str, float]]:
    """Binary reward per attempt from the verifier, and its error rates against ground truth."""
    truth = rollout.success
    if detector is None:
        return truth.astype(np.float32), {}
    verdict = np.asarray(detector({"pixels": rollout.final_frames}), dtype=bool)
    positives, negatives = max(1, int(truth.sum())), max(1, int((~truth).sum()))
    return verdict.astype(np.float32), {
        "detector/false_positive_rate": float((verdict & ~truth).sum() / negatives),
        "detector/false_negative_rate": float((~verdict & truth).sum() / positives),
        "detector/agreement": float((verdict == truth).mean()),
    }


def _build_detector(cfg):
    """A learned detector when the config asks for one; ``None`` means the scripted predicate."""
    name = (cfg.detector or {}).get("name", "scripted")
    if name == "scripted":
        return None
    import success_detectors

    detector = success_detectors.make(cfg.detector)
    if "pixels" not in getattr(detector, "requires", ("pixels",)):
        return None
    return detector


HAS_REFERENCE_POLICY = True  # checkpoints also hold the frozen start policy


def _policy_fn(policy: TokenPolicy, sampled: bool = False):
    def act(obs):
        with torch.no_grad():
            _, actions = policy.act(obs_to_batch(obs), deterministic=not sampled)
        return actions[0].numpy()
    return act


def load_policy(checkpoint, metadata: dict[str, Any], device: str = "cpu",
                sampled: bool = False, reference: bool = False):
    """Policy function of a group-trainer checkpoint: greedy tokens, or sampled at temperature 1
    (``sampled``); the fine-tuned policy, or the frozen start policy (``reference``)."""
    state = torch.load(checkpoint, map_location=device, weights_only=False)
    policy = _policy_from_checkpoint(state, "reference" if reference else "policy")
    return _policy_fn(policy.eval(), sampled)


def _policy_from_checkpoint(state: dict[str, Any], which: str = "policy") -> TokenPolicy:
    from harness.policies import TokenPolicyConfig

    saved = {"image_features": "avg_pool", **state["policy_config"]}  # older checkpoints
    policy = build_policy(TokenPolicyConfig(**saved),
                          {k: tuple(v) for k, v in state["obs_shapes"].items()})
    policy.load_state_dict(state["trainer"][which])
    return policy


def _initial_policy(cfg, observation_space) -> tuple[TokenPolicy, dict[str, Any]]:
    """The starting policy: ``algo.init_policy``, else BC on ``algo.bc_demos`` demos, else fresh."""
    algo = cfg.algo
    if algo.init_policy:
        policy = load_token_policy(algo.init_policy, observation_space)
        if policy.config.kind != cfg.policy.name:
            raise ValueError(f"algo.init_policy={algo.init_policy} holds a "
                             f"{policy.config.kind!r} policy; this run's policy is "
                             f"{cfg.policy.name!r}")
        return policy, {}
    if algo.bc_demos > 0:
        from harness.bc import cloned_start_policy

        return cloned_start_policy(
            cfg.task.name, cfg.task.env_options(), cfg.policy.token_policy_config(),
            algo.bc_demos, algo.bc_epochs,
            cfg.task.difficulty if algo.bc_difficulty is None else algo.bc_difficulty,
            seed=cfg.seed,
            progress=cfg.logger.progress_bar,
            state_pretrain_episodes=algo.state_pretrain_episodes,
            state_pretrain_epochs=algo.state_pretrain_epochs,
        )
    return make_policy(cfg.policy.token_policy_config(), observation_space), {}


def train(cfg, run) -> dict[str, Any]:
    """Fine-tune a token policy with the group-relative algorithm ``cfg.algo.name``.

    Args:
        cfg: A validated ``harness.config.TrainConfig`` whose ``algo`` is a group algorithm.
        run: The ``harness.runs.Run`` to write metrics, checkpoints and videos into.

    Returns:
        The final evaluation's summary (``success_rate``, ``success_interval``, ``env_steps``...).
    """
    from tqdm import tqdm

    from harness.evaluation import evaluate

    algo = cfg.algo
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.torch_threads)
    # Subnormal floats appear in the CNN's activations and gradients as fine-tuning goes on and
    # make x86 CPUs crawl: one fine-tuned TinyVLA's forward+backward took 0.59 s per 128 frames
    # with them and 0.21 s flushed to zero. Flushing costs no accuracy at these magnitudes.
    torch.set_flush_denormal(True)
    task_options = cfg.task.env_options()
    probe = tasks.make(cfg.task.name, **task_options)
    starts_env = tasks.make(cfg.task.name, **{**task_options, "obs_mode": "state"})
    iteration = env_steps = 0
    best = -1.0
    start: dict[str, Any] = {}
    resume_state = None
    if run.resume_metadata is not None:  # the checkpoint holds the weights and the reference
        resume_state = torch.load(run.checkpoints_dir / "latest.pt", weights_only=False)
        policy = _policy_from_checkpoint(resume_state)
    else:
        policy, start = _initial_policy(cfg, probe.observation_space)
    trainer = GroupTrainer(cfg, policy)
    trainer.max_tokens = probe.max_episode_steps * policy.config.action_dim
    curriculum = curricula.make(cfg.curriculum.name, seed=cfg.seed,
                                **cfg.curriculum.params(cfg.task.difficulty))
    detector = _build_detector(cfg)
    verifier_view = (detector.camera, int(detector.image_size)) if detector is not None else None

    if resume_state is not None:
        trainer.load_state_dict(resume_state["trainer"])
        curriculum.load_state_dict(resume_state["curriculum"])
        iteration, env_steps = resume_state["iteration"], resume_state["env_steps"]
        best, start = resume_state["best"], resume_state["start"]
        log.info("resumed at iteration %d, %d env steps", iteration, env_steps)

    attempts_per_iteration = algo.num_start_states * algo.group_size
    envs_per_worker = max(1, math.ceil(attempts_per_iteration / algo.workers))
    pool = RolloutPool(algo.workers, (cfg.task.name, task_options,
                                      (policy.config, policy.obs_shapes), envs_per_worker,
                                      verifier_view))
    eval_difficulties = list(cfg.eval.difficulties) or [cfg.task.difficulty]

    def env_factory(render: bool = False):
        return lambda: tasks.make(cfg.task.name, render_mode="rgb_array" if render else None,
                                  **task_options)

    def save(name: str, evaluation: dict | None = None) -> None:
        state = {
            "policy_config": dataclasses.asdict(policy.config),
            "obs_shapes": {k: list(v) for k, v in policy.obs_shapes.items()},
            "trainer": trainer.state_dict(), "curriculum": curriculum.state_dict(),
            "iteration": iteration, "env_steps": env_steps, "best": best, "start": start,
        }

        def write(handle) -> None:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            handle.write(buffer.getvalue())

        extra = {"iteration": iteration,
                 "evaluation": {"difficulties": eval_difficulties, "seed": cfg.eval.seed}}
        if evaluation:
            extra["eval_success_rate"] = evaluation["success_rate"]
        run.save_checkpoint(name, ".pt", write, run.checkpoint_metadata(env_steps, **extra))

    def periodic_eval(episodes: int, videos: int = 0):
        policy.eval()
        result = evaluate(_policy_fn(policy), env_factory(render=videos > 0), episodes,
                          eval_difficulties, cfg.eval.seed, videos)
        policy.train()
        return result

    if resume_state is None:
        # The starting policy on the held-out seeds of the final evaluation: what RL adds is
        # measured against this (the BC policy in the main job).
        before = periodic_eval(cfg.eval.final_episodes)
        start.update({"start_success_rate": before.success_rate,
                      "start_success_interval": list(before.success_interval)})
        run.log({**before.metrics("start"),
                 **{k: v for k, v in start.items() if isinstance(v, (int, float))}}, 0)
        save("latest")
    next_eval = env_steps + cfg.eval.every_steps if cfg.eval.every_steps else None
    last_checkpoint = env_steps
    limit_s = cfg.max_minutes * 60 if cfg.max_minutes else None
    # With a time budget the bar counts its seconds (the iteration cap is often far away, as in
    # the main job); otherwise it counts iterations.
    by_time = limit_s is not None
    bar = tqdm(total=int(limit_s) if by_time else algo.iterations,
               initial=min(int(run.elapsed()), int(limit_s)) if by_time else iteration,
               unit="s" if by_time else "it", desc=f"{algo.name} {cfg.task.name}",
               disable=not cfg.logger.progress_bar, dynamic_ncols=True)
    start_counter = iteration * attempts_per_iteration * MAX_RESAMPLE_ROUNDS
    try:
        while iteration < algo.iterations and env_steps < cfg.total_timesteps:
            if limit_s is not None and run.elapsed() > limit_s:
                log.info("max_minutes=%s reached at iteration %d", cfg.max_minutes, iteration)
                break
            t0 = time.perf_counter()
            kept: list[tuple[RolloutBatch, np.ndarray, np.ndarray]] = []
            informative_total = groups_total = 0
            timing = {"env": 0.0, "policy": 0.0}
            verifier_metrics: list[dict[str, float]] = []
            for round_ in range(MAX_RESAMPLE_ROUNDS if algo.zero_signal == "resample" else 1):
                needed = algo.num_start_states - sum(int(k[2].sum()) for k in kept) \
                    if algo.zero_signal == "resample" else algo.num_start_states
                if needed <= 0:
                    break
                jobs = []
                for group in range(needed):
                    difficulty = float(curriculum.sample())
                    starts_env.reset(seed=(cfg.seed + 1) * 10_000_000 + start_counter,
                                     options={"difficulty": difficulty})
                    start_counter += 1
                    snapshot = starts_env.snapshot()
                    jobs += [(snapshot, group, difficulty)] * algo.group_size
                rollout = pool.run(policy, jobs, algo.temperature,
                                   seed=cfg.seed * 1_000_003 + iteration * 17 + round_)
                rewards, verifier = _score(rollout, detector)
                if verifier:
                    verifier_metrics.append(verifier)
                grouped = rewards.reshape(-1, algo.group_size)
                informative = grouped.max(axis=1) > grouped.min(axis=1)
                informative_total += int(informative.sum())
                groups_total += len(informative)
                for group in range(len(informative)):
                    curriculum.update(float(rollout.difficulty[group * algo.group_size]),
                                      grouped[group].tolist())
                for key in timing:
                    timing[key] += rollout.timing[key]
                env_steps += int(rollout.lengths.sum())
                keep = informative if algo.zero_signal in ("drop", "resample") \
                    else np.ones_like(informative)
                kept.append((rollout, rewards, keep))
            rollout = RolloutBatch.concat([k[0] for k in kept])
            rewards = np.concatenate([k[1] for k in kept])
            keep = np.concatenate([k[2] for k in kept])
            if algo.zero_signal == "resample" and keep.sum() > algo.num_start_states:
                keep[np.flatnonzero(keep)[algo.num_start_states:]] = False
            rollout_s = time.perf_counter() - t0

            t1 = time.perf_counter()
            metrics = trainer.update(rollout, rewards, keep)
            update_s = time.perf_counter() - t1
            iteration += 1
            metrics.update({
                "rollout/success_rate": float(rollout.success.mean()),
                "rollout/verifier_success_rate": float(rewards.mean()),
                "rollout/zero_signal_fraction": 1.0 - informative_total / max(1, groups_total),
                "rollout/signal_fraction": informative_total / max(1, groups_total),
                "rollout/mean_length_steps": float(rollout.lengths.mean()),
                "rollout/mean_length_tokens": float(rollout.lengths.mean()
                                                    * policy.config.action_dim),
                "rollout/attempts": float(len(rollout.lengths)),
                "rollout/difficulty_mean": float(rollout.difficulty.mean()),
                "time/rollout_s": rollout_s, "time/update_s": update_s,
                "time/env_s": timing["env"], "time/policy_s": timing["policy"],
                "time/iteration": float(iteration),
                **{k: float(np.mean([v[k] for v in verifier_metrics]))
                   for k in (verifier_metrics[0] if verifier_metrics else {})},
                **curriculum.metrics(),
            })
            if next_eval is not None and env_steps >= next_eval:
                result = periodic_eval(cfg.eval.episodes)
                metrics.update(result.metrics("eval"))
                next_eval = env_steps + cfg.eval.every_steps
                if result.success_rate > best:
                    best = result.success_rate
                    save("best", {"success_rate": result.success_rate})
            run.log(metrics, env_steps)
            if env_steps - last_checkpoint >= cfg.checkpoint_every_steps:
                save("latest")
                last_checkpoint = env_steps
            bar.update(min(int(run.elapsed()), int(limit_s)) - bar.n if by_time else 1)
            bar.set_postfix(iteration=iteration, success=f"{metrics['rollout/success_rate']:.2f}",
                            signal=f"{metrics['rollout/signal_fraction']:.2f}")
        save("latest")
    finally:
        bar.close()
        pool.close()
        probe.close()
        starts_env.close()

    final = periodic_eval(cfg.eval.final_episodes,
                          cfg.eval.video_episodes if cfg.logger.videos else 0)
    if cfg.logger.videos and final.videos:
        for i, frames in enumerate(final.videos):
            run.write_video(f"final_eval_{i}", frames)
    run.log(final.metrics("final"), env_steps)
    if final.success_rate > best:
        best = final.success_rate
        save("best", {"success_rate": final.success_rate})
    return {**final.summary(), **start, "env_steps": env_steps, "iterations": iteration}
