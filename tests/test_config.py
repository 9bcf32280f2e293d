"""The training app's configuration: composition into typed objects and every bad-input path.

Nothing here builds an environment: each error must come before one would start.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

import tasks
from harness import trainers
from harness.algos.group.run import GroupRun
from harness.algos.sb3.run import SB3Run
from harness.config import (
    CONF_DIR,
    SB3_DEFAULT_TIMESTEPS,
    A2CConfig,
    CNNPolicyConfig,
    ConfigError,
    FixedCurriculumConfig,
    GroupAlgoConfig,
    PPOConfig,
    SuccessBandCurriculumConfig,
    TaskOptions,
    TrainConfig,
    TRPOConfig,
    compose,
    to_yaml,
)
from harness.policies.mlp import MLPConfig
from harness.policies.tiny_vla import TinyVLAConfig


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    """Fail the test if anything builds a task environment."""

    def refuse(*args, **kwargs):
        raise AssertionError("an environment was built while checking the configuration")

    monkeypatch.setattr(tasks.ManipulationEnv, "__init__", refuse)


def test_default_config_is_typed():
    config = compose([])
    assert isinstance(config, TrainConfig)
    assert isinstance(config.task, TaskOptions) and config.task.name == "reach"
    assert isinstance(config.algo, PPOConfig) and config.algo.family == "sb3"
    assert isinstance(config.curriculum, FixedCurriculumConfig)
    assert config.reward == "dense" and config.device == "cpu"


@pytest.mark.parametrize(
    ("algo", "schema"),
    [("ppo", PPOConfig), ("a2c", A2CConfig), ("trpo", TRPOConfig), ("grpo", GroupAlgoConfig),
     ("dr_grpo", GroupAlgoConfig), ("rloo", GroupAlgoConfig), ("critic", GroupAlgoConfig),
     ("reinforce", GroupAlgoConfig)],
)
def test_each_algo_file_composes_into_its_schema(algo, schema):
    config = compose([f"algo={algo}"])
    assert type(config.algo) is schema
    assert config.algo.name == algo
    assert algo in trainers.TRAINERS


def test_group_knobs_and_overrides_are_typed():
    config = compose(["algo=dr_grpo", "algo.group_size=4", "curriculum=success_band",
                      "curriculum.low=0.3"])
    assert config.algo.aggregation == "token_sum_const"
    assert config.algo.group_size == 4
    assert isinstance(config.curriculum, SuccessBandCurriculumConfig)
    assert config.curriculum.low == 0.3


@pytest.mark.parametrize(
    ("override", "choices"),
    [("algo=sac", ["a2c", "ppo", "trpo", "grpo"]),
     ("task=stack", ["reach", "push", "pick_place", "drawer_open"]),
     ("policy=transformer", ["mlp", "cnn", "tiny_vla"]),
     ("curriculum=adr", ["fixed", "uniform", "linear", "success_band"])],
)
def test_unknown_names_list_the_choices(override, choices):
    with pytest.raises(MissingConfigException) as error:
        compose([override])
    for choice in choices:
        assert choice in str(error.value)
    assert "schema" not in str(error.value).split("Config search path")[0]


@pytest.mark.parametrize(
    ("override", "key"),
    [("task.obs_mod=pixels", "task.obs_mod"), ("algo.n_step=64", "algo.n_step"),
     ("totl_timesteps=5", "totl_timesteps")],
)
def test_typo_on_the_command_line_names_the_key(override, key):
    with pytest.raises(ConfigCompositionException, match=key):
        compose([override])


def test_appended_typo_names_the_key():
    with pytest.raises(ConfigError, match=r"task\.obs_mod"):
        compose(["+task.obs_mod=pixels"])


def test_typo_in_a_group_file_names_the_key(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(Path(__file__).resolve().parent.parent / "conf", conf)
    (conf / "task" / "typo.yaml").write_text("name: reach\nobs_mdoe: pixels\n")
    with pytest.raises(ConfigCompositionException) as error:
        compose(["task=typo"], config_dir=conf)
    assert "obs_mdoe" in str(error.value) + str(error.value.__cause__)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [(["policy=cnn"], ["policy='cnn'", "task.obs_mode='state'", "pixels"]),
     (["task.obs_mode=pixels"], ["policy='mlp'", "'state'", "task.obs_mode='pixels'"]),
     (["policy=tiny_vla", "task.obs_mode=pixels"], ["policy='tiny_vla'", "algo='ppo'"]),
     (["algo=grpo", "policy=cnn", "task.obs_mode=pixels"], ["policy='cnn'", "algo='grpo'"])],
)
def test_policy_that_cannot_take_the_obs_mode_or_algo_fails(overrides, words):
    with pytest.raises(ConfigError) as error:
        compose(overrides)
    for word in words:
        assert word in str(error.value)


def test_pixel_policy_with_pixel_obs_is_accepted():
    config = compose(["policy=cnn", "task.obs_mode=pixels_state"])
    assert config.policy.name == "cnn"


SB3_FIELDS = {"net_arch", "activation", "log_std_init", "features_dim"}
TINY_VLA_FIELDS = {"hidden", "embed_dim", "conv_channels", "pooled_size", "image_features",
                   "instruction_keypoints", "chunk_size", "execute_steps", "action_dim", "head"}


@pytest.mark.parametrize(
    ("overrides", "schema", "fields", "absent"),
    [(["policy=tiny_vla", "algo=grpo", "task.obs_mode=pixels"], TinyVLAConfig,
      TINY_VLA_FIELDS, SB3_FIELDS),
     (["policy=cnn", "algo=ppo", "task.obs_mode=pixels"], CNNPolicyConfig,
      SB3_FIELDS, TINY_VLA_FIELDS),
     (["policy=mlp"], MLPConfig,
      {"net_arch", "activation", "log_std_init", "hidden", "embed_dim", "normalize_state",
       "chunk_size", "execute_steps", "action_dim", "head"},
      {"features_dim", "conv_channels", "pooled_size", "image_features",
       "instruction_keypoints"})],
)
def test_each_policy_file_composes_into_a_schema_of_only_the_fields_it_reads(
        overrides, schema, fields, absent):
    config = compose(overrides)
    assert type(config.policy) is schema
    printed = OmegaConf.create(to_yaml(config)).policy  # what --cfg job and config.yaml show
    assert set(printed) == {"name", "use_instruction", *fields}
    assert not absent & set(printed)


def test_instruction_keypoints_are_validated_by_name():
    base = ["policy=tiny_vla", "algo=grpo", "task.obs_mode=pixels"]
    assert compose(base).policy.instruction_keypoints == 0
    chosen = compose([*base, "policy.instruction_keypoints=4"]).policy
    assert chosen.instruction_keypoints == 4
    with pytest.raises(ConfigError, match=r"policy.instruction_keypoints=-1; need an int in \[0"):
        compose([*base, "policy.instruction_keypoints=-1"])
    with pytest.raises(ConfigError, match="needs policy.image_features=spatial_softmax"):
        compose([*base, "policy.instruction_keypoints=2", "policy.image_features=avg_pool"])
    with pytest.raises(ConfigError, match="policy.use_instruction=true"):
        compose([*base, "policy.instruction_keypoints=2", "policy.use_instruction=false"])


def test_action_chunks_reach_the_policy_config():
    default = compose(["policy=mlp", "algo=grpo"]).policy
    assert (default.chunk_size, default.execute_steps, default.steps_per_decision) == (1, None, 1)
    chunked = compose(["policy=tiny_vla", "algo=grpo", "task.obs_mode=pixels",
                       "policy.chunk_size=4", "policy.execute_steps=2"]).policy
    config = chunked
    assert (config.chunk_size, config.execute_steps, config.steps_per_decision) == (4, 2, 2)
    whole = compose(["policy=mlp", "algo=grpo", "policy.chunk_size=3"]).policy
    assert whole.steps_per_decision == 3  # null: the whole chunk


@pytest.mark.parametrize(
    ("overrides", "message"),
    [(["policy.chunk_size=0"], r"policy.chunk_size=0; need an int in \[1, 256\]"),
     (["policy.chunk_size=4", "policy.execute_steps=5"],
      r"policy.execute_steps=5 with chunk_size=4; need an int in \[1, chunk_size\]"),
     (["policy.chunk_size=2", "policy.execute_steps=0"],
      r"policy.execute_steps=0 with chunk_size=2"),
     (["policy.execute_steps=2"], r"policy.execute_steps=2 with chunk_size=1")],
)
def test_bad_action_chunks_are_refused_by_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose(["policy=mlp", "algo=grpo", *overrides])


def test_sb3_refuses_action_chunks_by_name():
    with pytest.raises(ConfigError, match=r"policy.chunk_size=4 is read by the group trainer"):
        compose(["policy=mlp", "algo=ppo", "policy.chunk_size=4"])
    assert compose(["policy=mlp", "algo=ppo", "policy.chunk_size=1"]).policy.chunk_size == 1


def test_each_kind_gives_its_own_config_with_its_head():
    vla = compose(["policy=tiny_vla", "algo=grpo", "task.obs_mode=pixels",
                   "policy.conv_channels=[4,8]", "policy.image_features=avg_pool",
                   "policy/head=flow", "policy.head.steps=3"]).policy
    assert type(vla) is TinyVLAConfig
    assert (vla.name, vla.conv_channels, vla.image_features, vla.use_instruction) == \
        ("tiny_vla", [4, 8], "avg_pool", True)
    assert vla.head == {"name": "flow", "steps": 3, "hidden": 128, "noise": "learned",
                        "sigma_min": 0.02, "sigma_max": 0.5, "sigma_init": 0.1,
                        "learn_noise": True}
    mlp = compose(["policy=mlp", "algo=grpo", "policy.hidden=32"]).policy
    assert (mlp.name, mlp.hidden, mlp.use_instruction, mlp.head) == \
        ("mlp", 32, False, {"name": "tokens", "num_bins": 11})
    with pytest.raises(ConfigError, match=r"policy=.cnn. cannot be trained by algo=.grpo.; "
                                          r"group algorithms take policy in \('mlp'"):
        compose(["policy=cnn", "task.obs_mode=pixels", "algo=grpo"])


@pytest.mark.parametrize(("overrides", "message"), [
    (["policy/head=flow", "policy.head.steps=0"], r"policy.head \(flow\): steps=0; need an int"),
    (["policy.head.num_bins=1"], r"policy.head \(tokens\): num_bins=1; need an int in \[2,"),
    (["policy/head=gaussian", "+policy.head.num_bins=5"],
     r"policy.head has options \['num_bins'\] that the 'gaussian' head does not take"),
    (["policy.head.name=diffusion"], r"action head 'diffusion' is not registered"),
    (["policy.action_head=flow"], r"policy.action_head is now policy/head: write "
                                  r"policy/head=flow"),
    (["policy.flow_noise=network"], r"write policy.head.noise=network"),
])
def test_bad_heads_and_old_spellings_are_refused_by_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose(["policy=mlp", "algo=grpo", *overrides])


@pytest.mark.parametrize(
    ("overrides", "key"),
    [(["policy=tiny_vla", "algo=grpo", "task.obs_mode=pixels", "policy.net_arch=[8]"],
      "policy.net_arch"),
     (["policy=cnn", "task.obs_mode=pixels", "policy.hidden=5"], "policy.hidden"),
     (["policy=mlp", "policy.num_bins=5"], "policy.num_bins"),
     (["policy=mlp", "policy.conv_channels=[8]"], "policy.conv_channels")],
)
def test_a_field_the_policy_does_not_read_fails_at_composition(overrides, key):
    with pytest.raises(ConfigCompositionException, match=key):
        compose(overrides)


def test_policy_name_must_match_its_schema():
    with pytest.raises(ConfigError, match="policy.name='cnn' with the MLPConfig schema"):
        compose(["policy.name=cnn", "task.obs_mode=pixels"])


@pytest.mark.parametrize(
    ("overrides", "read"),
    [(["policy=mlp"], {"name", "net_arch", "activation", "log_std_init"}),
     (["policy=cnn", "task.obs_mode=pixels"],
      {"name", "net_arch", "activation", "log_std_init", "features_dim"})],
)
def test_checkpoint_metadata_holds_what_sb3_rebuilds_its_network_from(overrides, read):
    """``harness.algos.sb3.run.build_model`` rebuilds the network from the metadata's ``policy``,
    as ``harness.runs.Run.checkpoint_metadata`` stores it."""
    config = compose(overrides)
    assert read <= set(OmegaConf.to_container(OmegaConf.structured(config.policy)))


@pytest.mark.parametrize(
    ("overrides", "words"),
    [(["algo.batch_size=4096"], ["algo.batch_size=4096", "algo.n_steps=2048", "n_envs=1"]),
     (["task.difficulty=1.5"], ["difficulty=1.5"]),
     (["+task.reward_weights.speed=1.0", "task=push"], ["speed"]),
     (["+task.randomization.frction=[1,2]"], ["frction"]),
     (["reward=sparse"], ["reward='sparse'", "dense", "verifier"]),
     (["n_envs=0"], ["n_envs=0"]),
     (["curriculum=success_band", "curriculum.low=0.9"], ["curriculum", "low"]),
     (["algo=grpo", "algo.aggregation=sum"], ["algo.aggregation='sum'", "token_sum_const"]),
     (["algo=rloo", "algo.zero_signal=skip"], ["skip", "resample"]),
     (["algo=grpo", "algo.start_policy.bc.difficulty=1.5"], ["algo.start_policy.bc.difficulty=1.5",
                                                             "[0, 1]"]),
     (["eval.difficulties=[0.5,2.0]"], ["eval.difficulties", "2.0"]),
     (["algo.name=sac"], ["sac", "ppo", "trpo"])],
)
def test_bad_values_name_the_key_and_value(overrides, words):
    with pytest.raises(ConfigError) as error:
        compose(overrides)
    for word in words:
        assert word in str(error.value)


def test_verifier_reward_needs_a_detector():
    with pytest.raises(ConfigError, match="reward=verifier needs a detector"):
        compose(["reward=verifier", "~detector"])


def test_verifier_reward_checks_the_detector_config():
    pytest.importorskip("success_detectors")
    with pytest.raises(ConfigError, match="detector"):
        compose(["reward=verifier", "detector=cnn"])  # no checkpoint given


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigCompositionException, match="total_timesteps"):
        compose(["total_timesteps=many"])


def test_each_family_has_one_budget():
    sb3 = compose(["algo=ppo"])
    assert (sb3.total_timesteps, sb3.n_envs) == (SB3_DEFAULT_TIMESTEPS, 1)
    assert compose(["algo=a2c", "total_timesteps=512", "n_envs=2"]).total_timesteps == 512
    group = compose(["algo=grpo", "algo.iterations=7"])
    assert (group.total_timesteps, group.n_envs, group.algo.iterations) == (None, None, 7)
    with pytest.raises(ConfigError, match=r"group algorithms count their budget in "
                                          r"algo.iterations; remove total_timesteps=5000"):
        compose(["algo=grpo", "total_timesteps=5000"])


def test_group_algorithms_refuse_n_envs_by_name():
    with pytest.raises(ConfigError, match=r"n_envs=4 with algo='rloo'.*algo.workers"):
        compose(["algo=rloo", "n_envs=4"])


@pytest.mark.parametrize(
    "overrides",
    [["algo=trpo", "task=push", "curriculum=linear", "seed=3"],
     ["algo=grpo", "policy=tiny_vla", "task.obs_mode=pixels", "policy.conv_channels=[8,8]"],
     ["algo=a2c", "policy=cnn", "task.obs_mode=pixels_state", "policy.features_dim=64"]],
)
def test_resolved_yaml_round_trips(overrides):
    config = compose(overrides)
    schema = OmegaConf.structured(TrainConfig)
    schema.algo = OmegaConf.structured(type(config.algo))
    schema.policy = OmegaConf.structured(type(config.policy))
    schema.curriculum = OmegaConf.structured(type(config.curriculum))
    again = OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.create(to_yaml(config))))
    assert again == config


def test_registry_names_every_algorithm_and_lists_choices_for_unknown_ones():
    assert {"ppo", "a2c", "trpo", "grpo", "dr_grpo", "rloo", "critic", "reinforce"} <= set(
        trainers.TRAINERS
    )
    assert trainers.trainer_class("grpo") is GroupRun
    assert trainers.trainer_class("ppo") is SB3Run
    with pytest.raises(ValueError, match="choose one of"):
        trainers.trainer_class("sac")


@pytest.mark.parametrize(
    "experiment", sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml")))
def test_each_experiment_file_composes_and_validates(experiment):
    text = (CONF_DIR / "experiment" / f"{experiment}.yaml").read_text()
    suite = re.search(r"override /task: (metaworld|robosuite)\b", text)
    if suite and importlib.util.find_spec(suite[1]) is None:  # tests/suites/ composes it there
        with pytest.raises(ConfigError, match=r"make suites"):
            compose([f"+experiment={experiment}"])
        return
    config = compose([f"+experiment={experiment}"])
    assert isinstance(config, TrainConfig)


def test_push_full_pixels_is_the_recipe_its_figures_were_measured_with():
    """docs/results.md's pixel push figures: 200 DART demos, 4 instruction keypoints, 150 GRPO
    iterations of 8 groups of 16 attempts from resets on fast physics, 30 BC epochs keeping the
    best on validation (the control only changes ``algo.starts.source``; the 110-iteration rows
    name ``algo.iterations=110``, the rows before 2026-12-04 ``algo.start_policy.bc.epochs=15
    algo.start_policy.bc.keep=last``, those before 2026-12-05 ``algo.group_size=8
    algo.num_start_states=16``)."""
    config = compose(["+experiment=push_full_pixels"])
    algo = config.algo
    assert (config.task.obs_mode, config.task.difficulty, config.task.physics) == \
        ("pixels", 1.0, "fast")
    assert config.policy.instruction_keypoints == 4
    assert (algo.start_policy.bc.demos, algo.start_policy.bc.epochs, algo.start_policy.bc.lr,
            algo.start_policy.bc.noise) == (200, 30, 1e-3, 0.5)
    assert algo.start_policy.bc.keep == "best_val_loss"
    assert (algo.starts.source, algo.iterations, algo.learning_rate) == ("reset", 150, 1e-3)
    assert (algo.group_size, algo.num_start_states) == (16, 8)
    control = compose(["+experiment=push_full_pixels", "algo.starts.source=demo"]).algo
    assert (control.starts.source, control.starts.demos) == ("demo", 20)
    assert control.starts.shares == {"reset": 0.25, "demo": 0.75, "replay": 0.0}


# The arms of the recipe search on validation (docs/results_group.md, "Recipes per head from
# pixels") that each head's experiment file names: the file must be that very arm.
HEAD_RECIPES = {
    "tokens_c1": [],
    "tokens_c4": ["policy.chunk_size=4", "algo.learning_rate=1e-4", "algo.temperature=0.5"],
    "gaussian": ["policy/head=gaussian", "policy.chunk_size=4", "algo.learning_rate=3e-4",
                 "algo.exploration.low=0.1", "algo.exploration.high=0.3"],
    "flow": ["policy/head=flow", "policy.chunk_size=1", "algo.residual.scale=0.2",
             "algo.residual.log_std_init=-1.5", "algo.learning_rate=3e-4"],
}


@pytest.mark.parametrize("head", sorted(HEAD_RECIPES))
def test_each_heads_pixel_recipe_is_the_arm_chosen_on_validation(head):
    """``push_full_pixels_<head>`` is push_full_pixels with the chosen arm's overrides, setting
    for setting (the figures of the test seeds were measured with these files)."""
    recipe = compose([f"+experiment=push_full_pixels_{head}"])
    arm = compose(["+experiment=push_full_pixels", *HEAD_RECIPES[head]])
    assert recipe == arm
    assert recipe.algo.iterations == 150  # the main job's budget


def test_the_gaussian_state_recipe_is_the_arm_run_on_validation_and_its_tests():
    """``push_full_state_gaussian`` is the validation arm and the test runs of
    docs/results_group.md ("Recipes from state"), setting for setting."""
    recipe = compose(["+experiment=push_full_state_gaussian"])
    arm = compose(["+experiment=push_full_state", "algo.starts.source=reset",
                   "policy/head=gaussian", "algo.learning_rate=3e-4",
                   "algo.exploration.high=0.3"])
    assert recipe == arm
    assert recipe.algo.iterations == 600 and recipe.policy.chunk_size == 1


def test_tiny_vla_reach_is_hf_vla_reach_with_another_policy():
    """docs/vla.md compares the two on the same task, budget and group settings: only the
    policy and the start recipe that the hf_vla command line sets differ."""
    tiny = compose(["+experiment=tiny_vla_reach"])
    hf = compose(["+experiment=hf_vla_reach", "algo.start_policy.bc.demos=300",
                  "algo.start_policy.bc.noise=0.5",
                  "algo.start_policy.state_pretrain.episodes=200"])
    assert (tiny.policy.name, hf.policy.name) == ("tiny_vla", "hf_vla")
    for part in ("task", "algo", "eval"):
        assert getattr(tiny, part) == getattr(hf, part), part
    assert (tiny.torch_threads, tiny.policy.head["num_bins"]) == (hf.torch_threads,
                                                                   hf.policy.num_bins)
