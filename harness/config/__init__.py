"""Typed configuration of the training app, registered in Hydra's ConfigStore.

Hydra composes ``conf/train.yaml`` and the group files (``task/``, ``algo/``, ``policy/``,
``curriculum/``, ``detector/``, ``logger/``) over the dataclasses of this package, so a typo in a
file or on the command line (``task.obs_mod=pixels``) fails at composition, naming the key, before
any environment exists. :func:`load` then converts the ``DictConfig`` once into a
:class:`TrainConfig` (running every ``__post_init__``), and the library only ever sees these
objects.

The ``algo``, ``policy`` and ``curriculum`` groups hold a different dataclass per choice; each
group file names its schema in its defaults list (``/schema/algo@_here_: ppo``), so the node is
typed by the choice and holds only that choice's fields. Schemas live in the ``schema/`` group so
that they never show up as choices of a group. Importing this package registers them
(:func:`register_configs`), so every app that takes one of these groups composes.

One module per group: :mod:`~harness.config.task`, :mod:`~harness.config.algos`,
:mod:`~harness.config.policy`, :mod:`~harness.config.curriculum`; the primary config in
:mod:`~harness.config.train` and its ``logger``, ``eval``, ``verifier`` and ``detector_refresh``
blocks in :mod:`~harness.config.blocks`; Hydra's side
(registration, :func:`compose`, :func:`load`, :func:`to_yaml`) in :mod:`~harness.config.hydra`.
Every name is re-exported here: import from ``harness.config``.

This package is the schema and its checks: it builds none of a run's objects (curriculum, ADR,
detector, datasets); the trainers do, from the checked config. Importing it does not import
torch: the checks that need the policies' or objectives' constants, or the detectors' import
them inside themselves, when :func:`load` runs them, so that
composing a config (``--help``, ``--cfg job``) does without the seconds torch takes to load
(``tests/test_cli.py`` checks that ``--help`` loads no torch).
"""

from harness.config.adr import AdrConfig, AdrParamConfig
from harness.config.algos import (
    ALGO_SCHEMAS,
    GROUP_ALGOS,
    SB3_ALGOS,
    ZERO_SIGNAL,
    A2CConfig,
    AlgoConfig,
    GroupAlgoConfig,
    PPOConfig,
    ResetNoiseConfig,
    SB3AlgoConfig,
    TRPOConfig,
)
from harness.config.blocks import (
    DetectorRefreshConfig,
    EvalConfig,
    LoggerConfig,
    VerifierConfig,
    WandbConfig,
)
from harness.config.curriculum import (
    CURRICULUM_SCHEMAS,
    CurriculumConfig,
    FixedCurriculumConfig,
    LinearCurriculumConfig,
    SuccessBandCurriculumConfig,
    UniformCurriculumConfig,
)
from harness.config.errors import ConfigError
from harness.config.hydra import (
    CONF_DIR,
    compose,
    import_plugins,
    load,
    plugins_in,
    register_configs,
    to_yaml,
)
from harness.config.moved import MOVED, check_moved
from harness.config.policy import (
    ACTIVATIONS,
    CNNPolicyConfig,
    PolicyConfig,
    SB3PolicyFields,
    policy_schemas,
)
from harness.config.seeds import (
    DEMO_SEED_OFFSET,
    STATE_PRETRAIN_SEED,
    TRAIN_SEED_STRIDE,
    Seeds,
    demo_first_seed,
    state_pretrain_first_seed,
)
from harness.config.start import (
    BCConfig,
    StartPolicyConfig,
    StartsConfig,
    StatePretrainConfig,
)
from harness.config.task import OBS_MODE_KEYS, TaskOptions
from harness.config.train import (
    MAX_RESAMPLE_ROUNDS,
    REWARDS,
    SB3_BAND_GROUP_SIZE,
    SB3_DEFAULT_TIMESTEPS,
    TrainConfig,
)

__all__ = [
    "ACTIVATIONS",
    "ALGO_SCHEMAS",
    "CONF_DIR",
    "CURRICULUM_SCHEMAS",
    "DEMO_SEED_OFFSET",
    "GROUP_ALGOS",
    "MAX_RESAMPLE_ROUNDS",
    "MOVED",
    "OBS_MODE_KEYS",
    "REWARDS",
    "SB3_ALGOS",
    "SB3_BAND_GROUP_SIZE",
    "SB3_DEFAULT_TIMESTEPS",
    "STATE_PRETRAIN_SEED",
    "TRAIN_SEED_STRIDE",
    "ZERO_SIGNAL",
    "A2CConfig",
    "BCConfig",
    "Seeds",
    "StartPolicyConfig",
    "StartsConfig",
    "StatePretrainConfig",
    "AdrConfig",
    "AdrParamConfig",
    "AlgoConfig",
    "CNNPolicyConfig",
    "ConfigError",
    "CurriculumConfig",
    "DetectorRefreshConfig",
    "EvalConfig",
    "FixedCurriculumConfig",
    "GroupAlgoConfig",
    "LinearCurriculumConfig",
    "LoggerConfig",
    "PPOConfig",
    "PolicyConfig",
    "ResetNoiseConfig",
    "SB3AlgoConfig",
    "SB3PolicyFields",
    "SuccessBandCurriculumConfig",
    "TRPOConfig",
    "TaskOptions",
    "TrainConfig",
    "UniformCurriculumConfig",
    "VerifierConfig",
    "WandbConfig",
    "compose",
    "demo_first_seed",
    "check_moved",
    "import_plugins",
    "load",
    "plugins_in",
    "policy_schemas",
    "register_configs",
    "state_pretrain_first_seed",
    "to_yaml",
]

register_configs()
