"""One of our environments around another suite's MuJoCo task: :class:`SuiteEnv`.

A suite (Meta-World, robosuite) builds its own model and steps it its own way; a
:class:`SuiteBackend` wraps one of its tasks and answers the few questions the harness asks
(reset from our generator, step, success, the state vector, the scripted expert). :class:`SuiteEnv`
puts our contract on top: the ``Dict`` observation of :class:`tasks.base.ManipulationEnv`
(``state``, ``pixels``, ``proprio``, ``instruction``), its reset options, exact
``snapshot()``/``restore()`` and camera rendering without shadows.

**Exact snapshots of code we do not own.** A snapshot carries the full integration state
(``mj_getState(mjSTATE_INTEGRATION)``: positions, velocities, warm-start, controls, mocap), the
model fields the suite's reset writes (Meta-World moves bodies and goal sites in the *model*),
every plain Python attribute of the suite's env object (goal, object start, random vector, step
count, previous observation; minus those the backend declares static) and the state of our
generator, which is the only randomness a reset draws from. That this is everything is checked,
not assumed: :func:`check_exact` replays recorded actions after a restore, in the same env and in
a fresh one, and compares observations (state and pixels) and rewards bit for bit;
:func:`tasks.suites.make` runs it once per task and observation mode in each process and refuses a
task that fails it, by name.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

import gymnasium as gym
import mujoco
import numpy as np

from tasks import language
from tasks.checks import check_action, check_int
from tasks.config import check_difficulty
from tasks.rendering import Cameras
from tasks.snapshot import (
    STATE_SPEC,
    Snapshot,
    check_snapshot,
    check_structure,
    get_physics_state,
    plain_copy,
    set_physics_state,
)

PROPRIO_DIM = 8  # as tasks.base: gripper position (3), velocity (3), opening, gripper command
NO_RANDOMIZATION = "none"  # suites have no domain randomisation of ours


class SuiteError(ValueError):
    """A suite task that cannot be used as one of ours (named in the message)."""


class SuiteBackend:
    """One task of another suite, as :class:`SuiteEnv` drives it.

    Subclasses build the suite's env in ``__init__`` and set :attr:`model` and :attr:`data` to its
    MuJoCo model and data, :attr:`raw` to the suite's env object and :attr:`max_episode_steps` to
    the suite's own episode length.

    Class attributes:
        suite: The suite's name, e.g. ``"metaworld"``.
        default_camera: The camera of pixel observations by default.
        model_fields: ``MjModel`` arrays the suite's reset writes (they travel in snapshots).
        static_attributes: Attributes of :attr:`raw` that are configuration, not state
            (left out of snapshots); values that are not plain data (spaces, renderers, the
            model) are always left out.
    """

    suite: ClassVar[str]
    default_camera: ClassVar[str]
    model_fields: ClassVar[tuple[str, ...]] = ()
    static_attributes: ClassVar[frozenset[str]] = frozenset()

    raw: Any
    model: mujoco.MjModel
    data: mujoco.MjData
    max_episode_steps: int
    name: str

    def instruction_text(self) -> str:
        """What the task asks, in words; by default its name (``"push-v3"``: ``"push"``)."""
        return self.name.rsplit("-v", 1)[0].replace("-", " ").replace("_", " ")

    def instruction(self) -> str:
        """:meth:`instruction_text` in our vocabulary (:data:`tasks.language.VOCAB`, which holds
        every word of the wrapped suites' tasks; a word it lacks becomes ``<unk>``)."""
        words = self.instruction_text().lower().split()
        known = [w if w in language.VOCAB[2:] else "<unk>" for w in words]
        return " ".join(known[:language.MAX_TOKENS])

    def reset(self, rng: np.random.Generator, difficulty: float) -> None:
        """Start an episode, drawing every random number from ``rng``."""
        raise NotImplementedError

    def step(self, action: np.ndarray) -> tuple[float, bool, str | None]:
        """One control step: ``(reward, success, physics_error or None)``."""
        raise NotImplementedError

    def is_success(self) -> bool:
        """The suite's own success predicate in the current state."""
        raise NotImplementedError

    def observe(self) -> np.ndarray:
        """The suite's state observation (float64 vector) in the current state."""
        raise NotImplementedError

    def proprio(self, gripper_cmd: float) -> np.ndarray:
        """:data:`PROPRIO_DIM` numbers: gripper position, velocity, opening, command."""
        raise NotImplementedError

    def expert_action(self) -> np.ndarray:
        """The suite's scripted expert action in the current state (privileged)."""
        raise NotImplementedError

    def after_restore(self) -> None:
        """Recompute what the suite derives after its own step (nothing by default)."""

    def close(self) -> None:
        close = getattr(self.raw, "close", None)
        if close is not None:
            close()

    # ------------------------------------------------------------------ state of the raw env
    def attributes(self) -> dict[str, Any]:
        """The raw env's plain attributes (a deep copy), without the declared static ones and
        without live views of the simulator's arrays (Meta-World's door-lock keeps its lock's
        start as a view of ``data.xpos``: it follows the physics, which the snapshot restores)."""
        return {key: plain_copy(value) for key, value in vars(self.raw).items()
                if key not in self.static_attributes and _plain(value)
                and not self._live_view(value)}

    def _live_view(self, value: Any) -> bool:
        if not isinstance(value, np.ndarray) or value.flags.owndata:
            return False
        return any(np.may_share_memory(value, array) for array in self._simulator_arrays())

    def _simulator_arrays(self) -> list[np.ndarray]:
        d, m = self.data, self.model
        return [d.xpos, d.xquat, d.xipos, d.xmat, d.site_xpos, d.site_xmat, d.geom_xpos,
                d.qpos, d.qvel, d.mocap_pos, d.mocap_quat, d.ctrl, d.cvel, m.body_pos,
                m.body_quat, m.site_pos, m.geom_pos]

    def set_attributes(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            current = getattr(self.raw, key, None)
            if isinstance(current, tuple) and isinstance(value, list):
                value = tuple(value)
            setattr(self.raw, key, plain_copy(value))

    def model_state(self) -> dict[str, np.ndarray]:
        return {name: getattr(self.model, name).copy() for name in self.model_fields}

    def set_model_state(self, values: dict[str, np.ndarray]) -> None:
        for name, value in values.items():
            getattr(self.model, name)[...] = value


def _plain(value: Any) -> bool:
    """Plain data a snapshot can carry: numbers, strings, arrays and containers of them."""
    if value is None or isinstance(value, (bool, int, float, str, np.generic)):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biuf"
    if isinstance(value, (list, tuple)):  # of scalars only: they travel as JSON
        return all(v is None or isinstance(v, (bool, int, float, str, np.generic))
                   for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _same_kind(expected: Any, value: Any) -> bool:
    """``value`` has the type (and for arrays the shape and dtype) of ``expected``; where
    ``expected`` is ``None`` (an attribute not yet set), any plain value; where it is an array,
    also ``None``."""
    if expected is None:
        return _plain(value)
    if value is None:  # an array the suite sets only later (Meta-World's last stable obs)
        return isinstance(expected, np.ndarray)
    if isinstance(expected, np.ndarray):
        return (isinstance(value, np.ndarray) and value.shape == expected.shape
                and value.dtype == expected.dtype
                and (value.dtype.kind != "f" or bool(np.isfinite(value).all())))
    if isinstance(expected, (bool, np.bool_)):
        return isinstance(value, (bool, np.bool_))
    if isinstance(expected, (int, float, np.integer, np.floating)):
        return isinstance(value, (int, float, np.integer, np.floating)) \
            and not isinstance(value, bool) and bool(np.isfinite(value))
    if isinstance(expected, dict):
        return isinstance(value, dict) and set(value) == set(expected) \
            and all(_same_kind(expected[k], value[k]) for k in expected)
    if isinstance(expected, (list, tuple)):  # JSON turns tuples into lists
        return isinstance(value, (list, tuple)) and len(value) == len(expected) \
            and all(_same_kind(e, v) for e, v in zip(expected, value, strict=True))
    return value is None if expected is None else isinstance(value, type(expected))


# The version of every suite task (caches of demos carry it): 2 since the instructions name every
# word of the task (they had <unk> for the words our vocabulary lacked).
SUITE_TASK_VERSION = 2


class _SuiteTask:
    """What the harness asks of ``env.task`` (:class:`tasks.task.Task`), for a suite task."""

    levels: ClassVar[tuple[str, ...]] = ()
    reward_weights: ClassVar[dict[str, float]] = {"suite": 1.0}
    version: ClassVar[int] = SUITE_TASK_VERSION

    def __init__(self, name: str, backend: SuiteBackend, state_dim: int) -> None:
        self.name = name
        self.max_episode_steps = backend.max_episode_steps
        self.state_dim = state_dim
        self._backend = backend
        self.state: dict[str, Any] = {}

    def is_success(self, env: Any = None) -> bool:
        return bool(self._backend.is_success())

    def success_margin(self, env: Any = None) -> float:
        """No distance is known for another suite's predicate: -1 inside, +1 outside."""
        return -1.0 if self.is_success() else 1.0

    def goal_region(self) -> None:
        return None

    def movable_objects(self, env: Any = None) -> tuple[str, ...]:
        return ()

    def named_object(self, env: Any = None) -> None:
        return None


class SuiteEnv(gym.Env):
    """Another suite's task behind our env contract (:class:`tasks.base.ManipulationEnv`'s).

    **Action** ``Box(-1, 1, (4,))``: the suite's own four numbers (Meta-World: end-effector
    displacement and gripper effort). Finite values outside ``[-1, 1]`` are clipped; NaN/inf or
    a wrong shape raise ``ValueError`` before anything is simulated.

    **Observation** ``Dict`` by ``obs_mode`` as our tasks: ``state`` (proprio followed by the
    suite's own state observation), ``pixels`` and ``proprio``, ``instruction`` token ids.

    **Reward** the suite's own (``info["reward_terms"] = {"suite": r}``); ``info["is_success"]``
    the suite's success predicate on every step.

    **Reset options**: ``difficulty`` in [0, 1] (the fraction of the suite's start-state ranges
    drawn from, around their centre; 1 is the suite's own distribution), ``snapshot``,
    ``noise_key`` (accepted, unused: suites have no imperfection wrappers), ``max_episode_steps``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 25}
    reset_option_keys = ("difficulty", "snapshot", "noise_key", "max_episode_steps")

    def __init__(self, backend: SuiteBackend, *, obs_mode: str = "state", camera: str | None = None,
                 image_size: int = 84, render_quality: str = "fast",
                 max_episode_steps: int | None = None, terminate_on_success: bool = True,
                 difficulty: float = 1.0, render_mode: str | None = None) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r}; expected None or 'rgb_array'")
        if obs_mode not in ("state", "pixels", "pixels_state"):
            raise ValueError(f"obs_mode={obs_mode!r}; expected state, pixels or pixels_state")
        self.backend = backend
        self.model, self.data = backend.model, backend.data
        self.name = f"{backend.suite}/{backend.name}"
        self.obs_mode = obs_mode
        self.render_mode = render_mode
        self.image_size = check_int("image_size", image_size, 8, 1024)
        self.render_quality = render_quality
        self.terminate_on_success = bool(terminate_on_success)
        self.configured_max_episode_steps = (
            backend.max_episode_steps if max_episode_steps is None
            else check_int("max_episode_steps", max_episode_steps, 1, 10**6))
        self.max_episode_steps = self.configured_max_episode_steps
        self.configured_difficulty = check_difficulty(difficulty)
        self._cameras = Cameras(self.model)
        self.camera_names = self._cameras.names
        self.camera = camera or backend.default_camera
        if self.camera not in self.camera_names:
            raise ValueError(f"camera={self.camera!r}; {self.name} has {self.camera_names}")
        self.model_signature = _model_signature(self.model, self.name)
        self._state_size = mujoco.mj_stateSize(self.model, STATE_SPEC)

        self.steps, self.difficulty, self.levels = 0, self.configured_difficulty, {}
        self.gripper_cmd = -1.0
        self.instruction = backend.instruction()
        self._tokens = language.tokenize(self.instruction)
        self._needs_reset = True
        self._was_reset = False
        state_dim = int(np.asarray(backend.observe()).size)
        self.task = _SuiteTask(self.name, backend, state_dim)

        spaces: dict[str, gym.Space] = {}
        if obs_mode != "pixels":
            spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (PROPRIO_DIM + state_dim,),
                                             np.float32)
        if obs_mode != "state":
            spaces["pixels"] = gym.spaces.Box(0, 255, (self.image_size, self.image_size, 3),
                                              np.uint8)
            spaces["proprio"] = gym.spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32)
        spaces["instruction"] = gym.spaces.Box(0, language.VOCAB_SIZE - 1,
                                               (language.MAX_TOKENS,), np.int64)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)

    # ------------------------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.reset_option_keys))
        if unknown:
            raise ValueError(f"unknown reset option(s) {unknown} for {self.name}; "
                             f"allowed: {list(self.reset_option_keys)}")
        limit = options.get("max_episode_steps")
        limit = (self.configured_max_episode_steps if limit is None else
                 check_int("reset option max_episode_steps", limit, 1, 10**6))
        if options.get("snapshot") is not None:
            snapshot = options["snapshot"]
            if not isinstance(snapshot, Snapshot):
                raise ValueError(f"options['snapshot'] is a {type(snapshot).__name__}; "
                                 "expected a tasks.Snapshot from env.unwrapped.snapshot()")
            super().reset(seed=seed)
            self.restore(snapshot)
            self.max_episode_steps = limit
            return self._observe(), self._info(self.backend.is_success())
        difficulty = options.get("difficulty")
        difficulty = (self.configured_difficulty if difficulty is None
                      else check_difficulty(difficulty))
        super().reset(seed=seed)
        self.max_episode_steps, self.difficulty = limit, difficulty
        self.backend.reset(self.np_random, difficulty)
        self.steps, self.gripper_cmd = 0, -1.0
        self._needs_reset = False
        self._was_reset = True
        return self._observe(), self._info(self.backend.is_success())

    def step(self, action):
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        action = check_action(action)
        self.gripper_cmd = float(action[3])
        reward, success, error = self.backend.step(action)
        self.steps += 1
        if error:
            self._needs_reset = True
            info = self._info(False)
            info["physics_error"] = error
            info["reward_terms"] = {"suite": 0.0}
            return self._observe(safe=True), 0.0, False, True, info
        terminated = bool(success and self.terminate_on_success)
        truncated = self.steps >= self.max_episode_steps and not terminated
        info = self._info(success)
        info["reward_terms"] = {"suite": float(reward)}
        return self._observe(), float(reward), terminated, truncated, info

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return self._cameras.render(self.data, self.camera, 480, 480, "high")

    def render_camera(self, camera: str, size: int | None = None, quality: str | None = None):
        """One frame from any named camera (``"a+b"``: side by side), as our tasks do."""
        return self._cameras.render_views(self.data, camera, int(size or self.image_size),
                                          quality or self.render_quality)

    def camera_mounts(self, camera: str) -> list[dict]:
        return self._cameras.mounts(camera)

    def close(self) -> None:
        self._cameras.close()
        self.backend.close()

    def expert_action(self) -> np.ndarray:
        """The suite's scripted expert action (privileged), clipped to the action bounds."""
        return np.clip(np.asarray(self.backend.expert_action(), np.float64), -1, 1).astype(
            np.float32)

    def randomization_signature(self) -> str:
        return NO_RANDOMIZATION

    def randomization_ranges(self) -> tuple[str, ...]:
        return ()

    # ------------------------------------------------------------------------ snapshots
    def snapshot(self) -> Snapshot:
        """Everything needed to come back here exactly: physics, the model fields the suite's
        reset writes, the suite env's attributes, our step count and generator."""
        if self._needs_reset and not self._was_reset:
            raise RuntimeError("call reset() before snapshot()")
        task_state = {
            "steps": self.steps, "difficulty": self.difficulty, "levels": {},
            "gripper_cmd": self.gripper_cmd, "instruction": self.instruction,
            **_flatten(ATTRIBUTES, self.backend.attributes()),
            **_flatten(MODEL, self.backend.model_state()),
        }
        return Snapshot(task=self.name, model_signature=self.model_signature,
                        randomization_signature=NO_RANDOMIZATION,
                        physics=get_physics_state(self.model, self.data), task_state=task_state,
                        rng_state=plain_copy(self.np_random.bit_generator.state))

    def restore(self, snapshot: Snapshot) -> None:
        """Put the env back exactly at ``snapshot``; every field is checked first, so a refused
        snapshot leaves the env as it was.

        Raises:
            TypeError: Not a :class:`Snapshot`.
            ValueError: A snapshot of another task or model, or a malformed field (named).
        """
        check_structure(snapshot, self.model_signature, self.name)
        check_snapshot(snapshot, self._state_size, self._check_state)
        state = snapshot.task_state
        self.backend.set_model_state(_unflatten(MODEL, state))
        set_physics_state(self.model, self.data, snapshot.physics)
        self.backend.set_attributes(_unflatten(ATTRIBUTES, state))
        self.backend.after_restore()
        self.steps, self.difficulty = int(state["steps"]), float(state["difficulty"])
        self.gripper_cmd = float(state["gripper_cmd"])
        self.np_random.bit_generator.state = plain_copy(snapshot.rng_state)
        self._needs_reset, self._was_reset = False, True

    def _check_state(self, state: dict[str, Any]) -> list[str]:
        bad = []
        if state.get("instruction") != self.instruction:
            bad.append("instruction")
        for prefix, current in ((ATTRIBUTES, self.backend.attributes()),
                                (MODEL, self.backend.model_state())):
            expected = _flatten(prefix, current)
            given = {key for key in state if key.startswith(prefix)}
            bad += sorted(given ^ set(expected))  # missing or foreign
            bad += [key for key in sorted(given & set(expected))
                    if not _same_kind(expected[key], state[key])]
        return bad

    # ------------------------------------------------------------------------ helpers
    def proprio(self) -> np.ndarray:
        return np.asarray(self.backend.proprio(self.gripper_cmd), np.float32)

    def _observe(self, safe: bool = False) -> dict[str, np.ndarray]:
        obs: dict[str, np.ndarray] = {}
        proprio = self.proprio()
        if safe:
            proprio = np.nan_to_num(proprio, nan=0.0, posinf=0.0, neginf=0.0)
        if self.obs_mode != "pixels":
            state = np.concatenate((proprio, np.asarray(self.backend.observe(), np.float32)))
            obs["state"] = np.nan_to_num(state, nan=0.0, posinf=0.0, neginf=0.0) if safe \
                else state
        if self.obs_mode != "state":
            size = self.image_size
            obs["pixels"] = (np.zeros((size, size, 3), np.uint8) if safe else
                             self._cameras.render(self.data, self.camera, size, size,
                                                  self.render_quality))
            obs["proprio"] = proprio
        obs["instruction"] = self._tokens.copy()
        return obs

    def _info(self, success: bool) -> dict[str, Any]:
        return {"is_success": bool(success), "difficulty": self.difficulty,
                "instruction": self.instruction, "steps": self.steps}


ATTRIBUTES, MODEL = "suite.", "suite_model."  # key prefixes in a snapshot's task state


def _flatten(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    """Nested dicts as one level of dotted keys (snapshot files keep top-level arrays)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(f"{prefix}{key}.", value))
        else:
            flat[prefix + key] = value
    return flat


def _unflatten(prefix: str, flat: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in flat.items():
        if key.startswith(prefix):
            *parents, leaf = key[len(prefix):].split(".")
            node = values
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = value
    return values


def _model_signature(model: mujoco.MjModel, name: str) -> str:
    """``"<suite/task>:<hash>"`` of the model's structure: restores only into the same."""
    m = model
    bodies = ",".join(mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_BODY, i) or ""
                      for i in range(m.nbody))
    text = (f"{name}|nq={m.nq}|nv={m.nv}|nu={m.nu}|na={m.na}|nbody={m.nbody}|ngeom={m.ngeom}|"
            f"nmocap={m.nmocap}|neq={m.neq}|dt={m.opt.timestep!r}|{bodies}")
    return f"{name}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def check_exact(make_env, seed: int = 0, warmup: int = 8, horizon: int = 8) -> None:
    """Refuse an env whose snapshots are not exact: after ``warmup`` random steps from
    ``reset(seed)``, snapshot, record ``horizon`` steps of random actions, then restore the
    snapshot (in the same env, and through ``reset(options={"snapshot": s})`` in a fresh one)
    and replay them. Observations (every key, pixels included) and rewards must be equal bit
    for bit.

    Args:
        make_env: Builds a new env (called twice).

    Raises:
        SuiteError: Naming the task, the step and the first observation key that differed.
    """
    env = make_env()
    fresh = None
    try:
        rng = np.random.default_rng(seed)
        env.reset(seed=seed)
        for _ in range(warmup):
            env.step(rng.uniform(-1, 1, 4))
        snapshot = env.snapshot()
        actions = rng.uniform(-1, 1, (horizon, 4))
        recorded = [env.step(a)[:2] for a in actions]
        env.restore(snapshot)
        _compare(env, actions, recorded, "restore() in the same env")
        fresh = make_env()
        fresh.reset(seed=seed + 1, options={"snapshot": snapshot})
        _compare(fresh, actions, recorded, "reset(options={'snapshot': s}) in a fresh env")
    finally:
        env.close()
        if fresh is not None:
            fresh.close()


def _compare(env: SuiteEnv, actions: np.ndarray, recorded: list, how: str) -> None:
    for t, (action, (obs, reward)) in enumerate(zip(actions, recorded, strict=True)):
        replay_obs, replay_reward = env.step(action)[:2]
        for key, value in obs.items():
            if not np.array_equal(value, replay_obs[key]):
                raise SuiteError(
                    f"{env.name} ({env.obs_mode}) is not exact after {how}: observation "
                    f"{key!r} differs at replayed step {t}; this task cannot be wrapped")
        if reward != replay_reward:
            raise SuiteError(f"{env.name} is not exact after {how}: reward differs at replayed "
                             f"step {t} ({reward!r} != {replay_reward!r})")
