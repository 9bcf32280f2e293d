"""Rollouts of the group trainer: attempts played from snapshots.

A *job* (:class:`~harness.algos.rollout.records.Job`) is one attempt restored from its snapshot,
with
more reset options of the attempt (``imperfections``: the scales automatic domain randomisation
chose for the group, :mod:`harness.algos.group.collect`). The G jobs of a group share one snapshot,
so
its G attempts start from the very same state. :func:`play` steps environment hosts
(:class:`EnvHost`) in lock-step with one batched policy call per decision; a pool
(:mod:`harness.algos.rollout.pools`, :mod:`harness.algos.rollout.batched`) spreads the jobs of an
iteration over worker processes or Ray actors (:mod:`harness.algos.rollout.workers`).

Seeding is per attempt: attempt ``i`` of a call seeded ``seed`` samples its tokens from its own
generator, ``SeedSequence([*seed, i])``, by the inverse CDF of each categorical
(:func:`harness.policies.sample_tokens`), and the policy never runs on fewer than
:data:`MIN_POLICY_BATCH` rows (small batches take other matrix kernels, whose last bits differ).
So an attempt plays the same tokens whichever worker, batch or slot it lands in: the same seed
gives the same attempts with 1, 2 or 16 workers, with processes or with Ray.

A decision is one policy call for one attempt: a chunk of ``chunk_size`` actions
(:mod:`harness.policies.chunks`), of which ``execute_steps`` are played before the attempt
asks again (one action per call by default). An attempt's records are its decisions: the
observation it was taken on, its tokens and the control steps it played (fewer than
``execute_steps`` when the attempt ended in the middle of the chunk).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import tasks
from harness.algos.rollout.records import Call, Finished, HostAnswer, HostSpec, Job
from harness.policies import Policy, obs_to_batch

# Fewer rows than this are padded (with copies of the first) before a policy call: on the CPU,
# matrix products of 1-3 rows use kernels whose results differ in the last bit from those of
# larger batches, and a last-bit difference can flip a sampled token.
MIN_POLICY_BATCH = 8


def attempt_generators(seed: int | Sequence[int], indices: Sequence[int]
                       ) -> list[np.random.Generator]:
    """One generator per attempt, from the call's ``seed`` and the attempt's index in the call.

    Args:
        seed: An int or a sequence of ints (e.g. ``(run seed, iteration, round)``).
        indices: Index of each attempt among all the jobs of the call.
    """
    base = [int(seed)] if np.isscalar(seed) else [int(s) for s in seed]
    return [np.random.Generator(np.random.PCG64(np.random.SeedSequence([*base, int(i)])))
            for i in indices]


@dataclass
class RolloutBatch:
    """Attempts of one iteration, decisions concatenated attempt by attempt.

    Attributes:
        obs: Observation arrays at each decision, ``(N_decisions, ...)`` per key (none from a
            greedy call).
        decisions: Each decision's record, ``(N_decisions, R)`` (:meth:`harness.policies.
            Policy.act`): int64 tokens of the tokens head, a continuous head's floats.
        executed: Control steps each decision played, ``(N_decisions,)`` int64, in
            ``[1, execute_steps]``.
        decision_counts: Decisions of each attempt, ``(A,)``; attempt ``i`` owns a contiguous
            slice of the decisions (:attr:`starts`).
        lengths: Control steps of each attempt, ``(A,)`` (its decisions' ``executed`` summed).
        success: Ground-truth success at the attempt's end, ``(A,)`` bool.
        final_frames: Last frame of each attempt for an image detector, or ``None``.
        group: Group index of each attempt, ``(A,)``; groups are contiguous, G attempts each.
        difficulty: Difficulty of each attempt's start state, ``(A,)``.
        timing: Seconds spent rendering+stepping (env) and in the policy, summed over workers.
        closest: With state capture on (``algo.starts.source`` uses replays): per attempt, the
            snapshot bytes of its captured state closest to success, or ``None``.
        final_margin: With ``final_frames``: metres outside the success region at each
            attempt's end (``Task.success_margin``; negative inside), for auditing the
            detector's errors; else ``None``.
        returns: The task reward summed over each attempt's steps, ``(A,)`` (what an
            evaluation reports as ``mean_return``); ``None`` from older callers.
    """

    obs: dict[str, np.ndarray]
    decisions: np.ndarray
    executed: np.ndarray
    decision_counts: np.ndarray
    lengths: np.ndarray
    success: np.ndarray
    final_frames: np.ndarray | None
    group: np.ndarray
    difficulty: np.ndarray
    timing: dict[str, float]
    closest: list | None = None
    final_margin: np.ndarray | None = None
    returns: np.ndarray | None = None

    @property
    def starts(self) -> np.ndarray:
        """Index of each attempt's first decision, ``(A,)``."""
        return np.concatenate(([0], np.cumsum(self.decision_counts)[:-1]))

    @staticmethod
    def concat(parts: list[RolloutBatch]) -> RolloutBatch:
        frames = [p.final_frames for p in parts]
        return RolloutBatch(
            obs={k: np.concatenate([p.obs[k] for p in parts]) for k in parts[0].obs},
            decisions=np.concatenate([p.decisions for p in parts]),
            executed=np.concatenate([p.executed for p in parts]),
            decision_counts=np.concatenate([p.decision_counts for p in parts]),
            lengths=np.concatenate([p.lengths for p in parts]),
            success=np.concatenate([p.success for p in parts]),
            final_frames=None if frames[0] is None else np.concatenate(frames),
            group=np.concatenate([p.group for p in parts]),
            difficulty=np.concatenate([p.difficulty for p in parts]),
            timing={k: sum(p.timing.get(k, 0.0) for p in parts) for k in parts[0].timing},
            closest=(None if parts[0].closest is None
                     else [c for p in parts for c in p.closest]),
            final_margin=(None if parts[0].final_margin is None
                          else np.concatenate([p.final_margin for p in parts])),
            returns=(None if parts[0].returns is None
                     else np.concatenate([p.returns for p in parts])),
        )


class EnvHost:
    """The environments of one worker, playing jobs from their snapshots as actions arrive.

    :meth:`begin` hands it a chunk of jobs; it restores the first ones into its
    ``num_envs`` environments and answers their first observations. Each :meth:`step` applies
    one action per active job, ends the attempts that terminate and starts the next pending job
    in the freed environment. Observations and outcomes are keyed by the job's index in the
    call, so whoever chooses the actions (a policy copy beside the host, or one batched policy
    in the learner) can assemble the attempts in job order.

    Args:
        spec: The task, its options, the number of environments, the verifier view and the
            state capture (:class:`~harness.algos.rollout.records.HostSpec`).
    """

    def __init__(self, spec: HostSpec) -> None:
        self.envs = [tasks.make(spec.task, **spec.task_options) for _ in range(spec.num_envs)]
        self.verifier_view = spec.verifier_view
        self.capture_every = int(spec.capture_every)
        self.env_time = 0.0
        self._pending: list[tuple[int, Any, dict[str, Any]]] = []
        self._active: dict[int, int] = {}  # job index -> env slot
        self._closest: dict[int, tuple[float, Any]] = {}  # job index -> (margin, snapshot)
        self._returns: dict[int, float] = {}  # job index -> reward so far

    def begin(self, jobs: list[Job], indices: Sequence[int]) -> HostAnswer:
        """Queue ``jobs`` (with their indices in the call); the first observation of each
        attempt that started."""
        self.env_time = 0.0
        self._pending = [(int(i), job.snapshot, dict(job.options))
                         for i, job in zip(indices, jobs, strict=True)][::-1]
        self._active = {}
        self._closest = {}
        self._returns = {}
        started = {}
        for slot in range(len(self.envs)):
            if self._pending:
                started.update(self._start(slot))
        return HostAnswer(started, {}, self.env_time)

    def _start(self, slot: int) -> dict[int, dict]:
        index, snapshot, options = self._pending.pop()
        t0 = time.perf_counter()
        # each attempt draws its own imperfection noise, unless its job names a key
        obs, _ = self.envs[slot].reset(options={"noise_key": index, **options,
                                                "snapshot": snapshot})
        self.env_time += time.perf_counter() - t0
        self._active[index] = slot
        self._returns[index] = 0.0
        return {index: obs}

    def step(self, actions: dict[int, np.ndarray]) -> HostAnswer:
        """Apply one action per active job.

        Returns:
            The next observation of every attempt still running or just started, and how
            every attempt that ended did (its frame and margin come with a verifier view, its
            closest state with state capture; else ``None``).
        """
        observations, finished = {}, {}
        for index, action in actions.items():
            slot = self._active[index]
            t0 = time.perf_counter()
            obs, reward, terminated, truncated, info = self.envs[slot].step(action)
            self._returns[index] += float(reward)
            if terminated or truncated:
                finished[index] = self._finish(index, slot, bool(info["is_success"]))
                self.env_time += time.perf_counter() - t0
                if self._pending:
                    observations.update(self._start(slot))
            else:
                observations[index] = obs
                env = self.envs[slot].unwrapped
                if self.capture_every and env.steps % self.capture_every == 0:
                    margin = float(env.task.success_margin(env))
                    if index not in self._closest or margin < self._closest[index][0]:
                        self._closest[index] = (margin, env.snapshot())
                self.env_time += time.perf_counter() - t0
        return HostAnswer(observations, finished, self.env_time)

    def _finish(self, index: int, slot: int, success: bool) -> Finished:
        frame = margin = None
        if self.verifier_view is not None:
            camera, size = self.verifier_view
            env = self.envs[slot].unwrapped
            frame = env.render_camera(camera, size)
            margin = float(env.task.success_margin(env))
        closest = self._closest.pop(index, None)
        closest = None if closest is None else tasks.snapshot_to_bytes(closest[1])
        del self._active[index]
        return Finished(success, frame, closest, margin, self._returns.pop(index))

    def close(self) -> None:
        for env in self.envs:
            env.close()


class InProcess:
    """A worker object of this process (an :class:`EnvHost` or a rollout engine) behind the
    remote workers' surface (:class:`~harness.algos.rollout.workers.ProcessWorker`): :meth:`send`
    runs the call at once, :meth:`receive` hands its value over. Exceptions are raised by
    :meth:`send`, with their own type."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self._answer: Any = None

    def send(self, call: Call) -> None:
        self._answer = getattr(self.worker, call.method)(*call.args)

    def receive(self) -> Any:
        answer, self._answer = self._answer, None
        return answer

    def settle(self) -> bool:
        """Drop an unread answer; alive (it lives as long as this process)."""
        self._answer = None
        return True

    def pid(self) -> None:
        """None: no process of its own."""
        return None

    def close(self) -> None:
        self.worker.close()


class PolicyActor:
    """A policy taking decisions (chunks of actions) for a batch of attempts, each with its own
    generator.

    Args:
        policy: The policy (on its device).
        temperature: Sampling temperature; 0 plays the most likely tokens (greedy, as an
            evaluation does), drawing no random numbers.
        seed: The call's seed; the attempt at position ``p`` samples from
            ``SeedSequence([*seed, keys[p]])``.
        keys: The index of each position among all the jobs of the call (a worker playing a
            slice gets the slice's indices); default the position itself.
        image_features: Keep the image features each call computed
            (:meth:`harness.policies.Policy.encode_frozen`) in :attr:`features`, for an update
            whose encoder is frozen (``algo.freeze_encoder``): it then reads the very features
            the attempts were sampled from instead of encoding every frame again.
    """

    def __init__(self, policy: Policy, temperature: float, seed,
                 keys: Sequence[int] | None = None, image_features: bool = False) -> None:
        self.policy = policy
        self.temperature = temperature
        self.base = [int(seed)] if np.isscalar(seed) else [int(s) for s in seed]
        self.keys = None if keys is None else [int(k) for k in keys]
        self.image_features = image_features
        self.features: dict[int, np.ndarray] = {}  # the last call's, by job index
        self.generators: dict[int, np.random.Generator] = {}
        self.time = 0.0

    def __call__(self, observations: dict[int, dict]) -> tuple[dict[int, np.ndarray],
                                                               dict[int, np.ndarray]]:
        """A decision for every attempt in ``observations`` (keyed by job index): its record
        and its chunk of actions ``(chunk_size, action_dim)``."""
        t0 = time.perf_counter()
        indices = list(observations)
        width = self.policy.spec.noise_width  # uniforms per decision (one per token)
        rows = [observations[i] for i in indices]
        pad = max(0, MIN_POLICY_BATCH - len(rows))
        device = next(self.policy.parameters()).device
        batch = obs_to_batch(rows + rows[:1] * pad, device=device)
        if self.temperature != 0:
            for index in indices:
                if index not in self.generators:
                    key = index if self.keys is None else self.keys[index]
                    self.generators[index] = attempt_generators(self.base, [key])[0]
            uniforms = np.stack([self.generators[i].random(width, dtype=np.float32)
                                 for i in indices])
            uniforms = np.concatenate([uniforms, np.repeat(uniforms[:1], pad, axis=0)])
        with torch.no_grad():
            if self.image_features:  # what act() would compute from the pixels, kept
                batch = self.policy.encode_frozen(batch)
                features = batch["image_features"][: len(indices)].cpu().numpy()
                self.features = {i: features[row] for row, i in enumerate(indices)}
            if self.temperature == 0:
                tokens, actions = self.policy.act(batch, deterministic=True)
            else:
                tokens, actions = self.policy.act(batch, temperature=self.temperature,
                                                  uniforms=torch.from_numpy(uniforms))
        tokens = tokens[: len(indices)].cpu().numpy()
        actions = actions[: len(indices)].cpu().numpy()
        self.time += time.perf_counter() - t0
        return ({i: tokens[row] for row, i in enumerate(indices)},
                {i: actions[row] for row, i in enumerate(indices)})


def play(actor: PolicyActor, hosts: list, chunks: list[Sequence[int]], jobs: list[Job],
         verifier: bool, capture: bool = False) -> RolloutBatch:
    """Play ``jobs`` on ``hosts`` (host ``h`` plays the jobs of ``chunks[h]``) with one batched
    policy call per control step for the attempts that need a decision, across all hosts.

    An attempt decides on its latest observation when it has played ``execute_steps`` actions
    of its last chunk (or has none yet), then plays one action of the chunk per control step;
    with one action per decision (the default) every attempt decides at every step. A host is
    an :class:`EnvHost` behind the workers' surface, ``send(Call)`` then ``receive()``
    (:class:`InProcess`,
     or a worker process or Ray actor of :mod:`harness.algos.rollout.workers`): all
    hosts step at once, then all are read. Attempts return in job order. With an ``actor`` that
    keeps image features, the observations carry them as ``image_features`` in place of
    ``pixels`` (a frame is 84x84x3 bytes, its features 64 floats). A greedy ``actor``
    (temperature 0: an evaluation) keeps no observations: the batch's ``obs`` is empty.

    Raises:
        WorkerDied: A remote host died (the pool replaces it and plays the call again).
        RolloutWorkerError: A host raised an exception.
    """
    records: dict[int, dict[str, Any]] = {}
    keep = actor.temperature != 0  # a greedy call is an evaluation: nothing trains on its frames
    steps_per_decision = actor.policy.spec.execute_steps
    env_time: dict[int, float] = {}

    def absorb(h: int, answer: HostAnswer) -> None:
        env_time[h] = answer.env_time
        for index, obs in answer.observations.items():
            records.setdefault(index, {"obs": [], "decisions": [], "executed": [],
                                       "queue": []})["latest"] = obs
        for index, finished in answer.finished.items():
            records[index]["finished"] = finished

    used = [h for h, chunk in enumerate(chunks) if len(chunk)]
    for h in used:
        hosts[h].send(Call("begin", ([jobs[i] for i in chunks[h]], list(chunks[h]))))
    for h in used:
        absorb(h, hosts[h].receive())
    active = {index: h for h in used for index in chunks[h] if index in records}
    while active:
        deciding = {i: records[i]["latest"] for i in active if not records[i]["queue"]}
        if deciding:
            decisions, actions = actor(deciding)
            for index, decision in decisions.items():
                record = records[index]
                record["decisions"].append(decision)
                record["executed"].append(0)
                record["queue"] = list(actions[index][:steps_per_decision])
                if keep:
                    obs = deciding[index]
                    if actor.image_features:
                        obs = {**{k: v for k, v in obs.items() if k != "pixels"},
                               "image_features": actor.features[index]}
                    record["obs"].append(obs)
        for index in active:
            records[index]["executed"][-1] += 1
        for h in used:
            hosts[h].send(Call("step", ({i: records[i]["queue"].pop(0) for i in active
                                         if active[i] == h},)))
        for h in used:
            answer = hosts[h].receive()
            absorb(h, answer)
            for index in answer.finished:
                del active[index]
            for index in answer.observations:
                active[index] = h
    return _assemble(records, jobs, keep, verifier, capture,
                     {"env": sum(env_time.values()), "policy": actor.time})


def _assemble(records: dict[int, dict[str, Any]], jobs: list[Job], keep: bool, verifier: bool,
              capture: bool, timing: dict[str, float]) -> RolloutBatch:
    """The attempts of :func:`play`'s ``records`` in job order."""
    order = range(len(jobs))
    ends: list[Finished] = [records[i]["finished"] for i in order]
    keys = records[0]["obs"][0].keys() if keep else ()
    executed = [np.array(records[i]["executed"], dtype=np.int64) for i in order]
    return RolloutBatch(
        obs={k: np.stack([o[k] for i in order for o in records[i]["obs"]]) for k in keys},
        decisions=np.concatenate([np.stack(records[i]["decisions"]) for i in order]),
        executed=np.concatenate(executed),
        decision_counts=np.array([len(steps) for steps in executed]),
        lengths=np.array([int(steps.sum()) for steps in executed]),
        success=np.array([end.success for end in ends]),
        final_frames=np.stack([end.frame for end in ends]) if verifier else None,
        group=np.array([job.group for job in jobs]),
        difficulty=np.array([job.difficulty for job in jobs], dtype=np.float64),
        timing=timing,
        closest=[end.closest for end in ends] if capture else None,
        final_margin=(np.array([end.margin for end in ends], dtype=np.float64)
                      if verifier else None),
        returns=np.array([end.episode_return for end in ends], dtype=np.float64),
    )
