"""Sim-to-sim transfer: evaluation with task options over the trained ones
(``harness.evaluation.override_task_options``, ``scripts/evaluate.py domain=... +task.<option>=``),
the ratio interval against hand-worked numbers, and the
study script end to end on a tiny budget (real MuJoCo, real training, real evaluation)."""

from __future__ import annotations

import importlib
import json
import math

import pytest

import tasks
from harness.checkpoints import task_env_factory
from harness.config import ConfigError
from harness.evaluation import override_task_options
from harness.runs import resolve_checkpoint

study = importlib.import_module("studies.transfer_study")
breakdown = importlib.import_module("studies.transfer_breakdown")
evaluate_app = importlib.import_module("scripts.evaluate")

TINY = ["--total-timesteps", "128", "--episodes", "3", "--override", "task=reach",
        "task.max_episode_steps=15", "algo.n_steps=64", "algo.batch_size=32", "adr.buffer=1",
        "adr.boundary_prob=1.0"]


# --- the ratio and its interval (no MuJoCo) -------------------------------------------------
def test_ratio_interval_matches_hand_worked_mover_r():
    # 50/100 over 80/100: Wilson (0.4038, 0.5962) and (0.7112, 0.8666);
    # L = (0.4 - sqrt(0.16 - 0.4038*0.8666*0.5962*0.7334)) / (0.8666*0.7334) = 0.498,
    # U = (0.4 + sqrt(0.16 - 0.5962*0.7112*0.4038*0.8888)) / (0.7112*0.8888) = 0.773.
    ratio, low, high = study.ratio_interval(50, 100, 80, 100)
    assert ratio == pytest.approx(0.625)
    assert (low, high) == pytest.approx((0.498, 0.773), abs=1e-3)
    # 100/100 twice: the Wilson bounds (0.963, 1) give [0.963, 1/0.963 * ...] = [0.963, 1.038].
    assert study.ratio_interval(100, 100, 100, 100) == pytest.approx((1.0, 0.963, 1.038),
                                                                     abs=1e-3)
    ratio, low, _ = study.ratio_interval(0, 100, 50, 100)
    assert (ratio, low) == (0.0, 0.0)
    assert all(math.isnan(v) for v in study.ratio_interval(5, 10, 0, 10))
    assert study.ratio_entries(5, 10, 0, 10) == {"ratio": None, "ratio_interval": None}


def test_key_values_nest_dotted_keys_and_parse_yaml_values():
    assert study.key_values(["randomization.friction=[0.3,2.0]", "imperfections.action_latency=2"],
                            "--held-out") == {"randomization": {"friction": [0.3, 2.0]},
                                              "imperfections": {"action_latency": 2}}
    with pytest.raises(ValueError, match=r"--held-out: 'friction' is not key=value"):
        study.key_values(["friction"], "--held-out")


def test_adr_scales_the_imperfections_trained_with_and_never_reaches_the_held_out_ones():
    noise = {"action_noise": (0.5, 1.6), "control_jitter": (0.5, 1.6),
             "observation_noise": (0.5, 1.6)}
    assert study.ADR_NOISE_BOUNDS == noise
    assert study.adr_defaults("reach", study.TRAIN_IMPERFECTIONS) == {
        "friction": (0.7, 1.4), "damping": (0.7, 1.4), **noise}
    assert study.adr_defaults("reach", {}) == {"friction": (0.7, 1.4), "damping": (0.7, 1.4)}
    assert study.adr_defaults("reach", {"action_latency": 2}) == {  # no noise: no noise scale
        "friction": (0.7, 1.4), "damping": (0.7, 1.4)}
    for name, (_, highest) in noise.items():  # the held-out levels lie beyond ADR's bounds
        scale = study.HELD_OUT["imperfections"][name] / study.TRAIN_IMPERFECTIONS[name]
        assert scale == pytest.approx(2.0) and scale > highest


# --- the domain of an evaluation ------------------------------------------------------------
def test_task_overrides_replace_named_options_and_name_bad_values():
    trained = {"obs_mode": "state", "imperfections": {"action_noise": 0.1}, "randomization": {}}
    assert override_task_options("reach", trained) == trained
    nominal = override_task_options("reach", trained, {"randomization": {}, "imperfections": {}})
    assert nominal == {"obs_mode": "state", "imperfections": {}, "randomization": {}}
    latency = override_task_options("reach", trained, {"imperfections": {"action_latency": 2},
                                                       "max_episode_steps": 7, "physics": "fast"})
    assert latency["imperfections"] == {"action_latency": 2}  # replaced whole, not merged
    assert (latency["max_episode_steps"], latency["physics"]) == (7, "fast")
    # What the policy sees may be named, at the trained value only.
    assert override_task_options("reach", trained, {"obs_mode": "state", "camera": "front"})
    refused = [
        ({"randomization": {"frction": [0.5, 2.0]}},
         r"task: unknown randomization option\(s\) \['frction'\]"),
        ({"randomization": {"friction": [2.0, 0.5]}},
         r"randomization.friction=\(2.0, 0.5\); expected 0 < low"),
        ({"max_episode_steps": 0}, r"max_episode_steps=0; expected an integer 1..1000000"),
        ({"physiks": "fast"}, r"unknown option\(s\) \['physiks'\] for task 'reach'"),
        ({"imperfections": 2}, r"task.imperfections=2; expected a mapping of its fields"),
        ({"obs_mode": "pixels"}, r"task.obs_mode='pixels' would change what the policy sees;"
                                 r" obs_mode, camera, image_size stay as trained \(obs_mode="
                                 r"'state'\)"),
        ({"camera": "side"}, r"task.camera='side' would change what the policy sees"),
        ({"image_size": 64}, r"task.image_size=64 would change what the policy sees"),
        ({"difficulty": 0.5}, r"task.difficulty=0.5: .* given by difficulties=\[...\]"),
    ]
    for overrides, message in refused:
        with pytest.raises(ValueError, match=message):
            override_task_options("reach", trained, overrides)


# --- the study, end to end ------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("transfer") / "study"
    return out, study.main(["--out", str(out), *TINY, "--adr-noise"])


def test_study_trains_both_arms_and_writes_its_json_and_figure(tiny_study):
    out, result = tiny_study
    written = json.loads((out / "transfer_study.json").read_text())
    assert written == json.loads(json.dumps(result))
    assert set(written) == {"settings", "arms", "rows"}
    assert set(written["arms"]) == set(study.ARMS)
    for arm in written["arms"].values():
        assert {"nominal_success", "nominal_interval", "held_out_success", "held_out_interval",
                "ratio", "ratio_interval", "target_met", "episodes_per_domain"} <= set(arm)
        assert arm["episodes_per_domain"] == 3
    assert [(r["arm"], r["seed"]) for r in written["rows"]] == [(a, 0) for a in study.ARMS]
    settings = written["settings"]
    assert (settings["task"], settings["algo"], settings["total_timesteps"]) == \
        ("reach", "ppo", 128)
    assert settings["held_out"] == study.HELD_OUT
    assert settings["adr_bounds"] == {  # reach's ranges, and (--adr-noise) the noise levels
        "friction": [0.7, 1.4], "damping": [0.7, 1.4], "action_noise": [0.5, 1.6],
        "control_jitter": [0.5, 1.6], "observation_noise": [0.5, 1.6]}
    plain, robust = written["rows"]
    assert plain["env_steps"] == robust["env_steps"] >= 128  # the same budget
    # ADR ran on the robust arm only (every episode pinned a boundary, read after one outcome).
    assert plain["adr_final_ranges"] == {}
    assert set(robust["adr_final_ranges"]) == {"friction", "damping", "action_noise",
                                               "control_jitter", "observation_noise"}
    assert (out / "transfer_study.png").stat().st_size > 10_000
    # A finished study is read back, not trained again.
    trained_at = (out / "plain_seed0" / "summary.json").stat().st_mtime_ns
    study.main(["--out", str(out), *TINY, "--adr-noise"])
    assert (out / "plain_seed0" / "summary.json").stat().st_mtime_ns == trained_at


def test_the_robust_arm_trains_with_imperfections_and_is_evaluated_without(tiny_study):
    out, _ = tiny_study
    _, metadata = resolve_checkpoint(out / "adr_imperfections_seed0" / "checkpoints" /
                                     "latest.json")
    assert metadata["task_options"]["imperfections"] == study.TRAIN_IMPERFECTIONS
    nominal = task_env_factory(metadata, task_overrides=study.NOMINAL)()
    assert nominal is nominal.unwrapped  # no wrapper at all
    held_out = task_env_factory(metadata, task_overrides=study.HELD_OUT)()
    config = held_out.unwrapped.config
    assert config.randomization.enabled
    assert config.randomization.friction == tuple(study.HELD_OUT["randomization"]["friction"])
    assert config.imperfections.action_latency == \
        study.HELD_OUT["imperfections"]["action_latency"]
    nominal.close()
    held_out.close()


def test_evaluate_script_plays_the_domain_it_is_given(tiny_study, tmp_path, capsys):
    out, _ = tiny_study
    run = out / "plain_seed0"
    report = tmp_path / "eval.json"
    quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]  # no handlers left behind
    assert evaluate_app.main([f"checkpoint={run}", "episodes=2", "domain=nominal",
                              "+task.imperfections.action_latency=2", f"output={report}",
                              f"hydra.run.dir={tmp_path / 'eval'}", *quiet]) == 0
    assert json.loads(report.read_text())["task_overrides"] == {
        "randomization": {}, "imperfections": {"action_latency": 2}}
    assert evaluate_app.main([f"checkpoint={run}", "episodes=2",
                              "+task.randomization.friction=[2.0,0.5]",
                              f"hydra.run.dir={tmp_path / 'bad'}", *quiet]) == 1
    assert "randomization.friction=(2.0, 0.5); expected 0 < low <= high" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("extra", "error", "message"), [
    (["--held-out", "randomization.frction=[0.3,2.0]"], ValueError,
     r"unknown randomization option\(s\) \['frction'\]"),
    (["--held-out", "randomization.friction=[2.0,0.3]"], ValueError,
     r"randomization.friction=\(2.0, 0.3\); expected 0 < low <= high"),
    (["--adr-bounds", "friction=[1.4,0.7]"], ConfigError,
     r"adr.params.friction.bounds: randomization.friction=\(1.4, 0.7\)"),
    (["--adr-bounds", "mass=[0.7,1.4]"], ConfigError,
     r"adr.params.mass: not a randomisation range of task 'reach'"),
    (["--train-imperfections", "action_latency=-1"], ConfigError,
     r"imperfections.action_latency=-1"),
])
def test_bad_input_is_refused_naming_the_value_before_anything_trains(tmp_path, extra, error,
                                                                      message):
    with pytest.raises(error, match=message):
        study.main(["--out", str(tmp_path / "study"), *TINY, *extra])
    assert not (tmp_path / "study").exists()


# --- which part of the held-out domain costs the success ------------------------------------
def test_breakdown_sets_back_one_part_of_the_held_out_domain_at_a_time():
    trained = {"action_noise": 0.15, "action_latency": 2}
    domains = breakdown.breakdown_domains(study.HELD_OUT, trained)
    assert list(domains) == ["held-out", "physics nominal", "action_noise as trained",
                             "action_latency as trained", "control_jitter as trained",
                             "observation_noise as trained", "imperfections as trained",
                             "nominal"]
    held = study.HELD_OUT["imperfections"]
    assert domains["held-out"] == study.HELD_OUT
    assert domains["physics nominal"] == {"randomization": {}, "imperfections": held}
    assert domains["action_latency as trained"]["imperfections"] == {**held, "action_latency": 2}
    assert domains["control_jitter as trained"]["imperfections"] == {**held, "control_jitter": 0}
    assert domains["imperfections as trained"] == {
        "randomization": study.HELD_OUT["randomization"], "imperfections": trained}
    assert domains["nominal"] == study.NOMINAL
    # A held-out domain of physics only has nothing to set back among the imperfections.
    physics = {"randomization": study.HELD_OUT["randomization"]}
    assert list(breakdown.breakdown_domains(physics, trained)) == [
        "held-out", "physics nominal", "nominal"]


def test_breakdown_plays_every_run_of_a_study_and_pools_each_arm(tiny_study, tmp_path):
    out, result = tiny_study
    written = breakdown.main([str(out), "--episodes", "2", "--expert", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "transfer_breakdown.json").read_text()) == \
        json.loads(json.dumps(written))
    assert (tmp_path / "transfer_breakdown.png").stat().st_size > 10_000
    assert [(r["arm"], r["seed"]) for r in written["runs"]] == \
        [*((a, 0) for a in study.ARMS), (breakdown.EXPERT, None)]
    plain, robust, expert = written["runs"]
    # Each run's "as trained" is its own: the plain arm trained without imperfections.
    assert plain["domains"]["imperfections as trained"]["domain"]["imperfections"] == {}
    assert robust["domains"]["imperfections as trained"]["domain"]["imperfections"] == \
        study.TRAIN_IMPERFECTIONS
    assert expert["domains"]["imperfections as trained"]["domain"]["imperfections"] == {}
    assert expert["domains"]["nominal"]["successes"] == 2  # the expert reaches every target
    # The expert's cells: its controller on the study's test seeds, as played here by hand.
    settings = result["settings"]
    options = override_task_options("reach", {"max_episode_steps": 15}, settings["held_out"])
    env = tasks.make("reach", **options)
    wins = 0
    for j in range(2):
        env.reset(seed=settings["test_seed"] + j, options={"difficulty": 1.0})
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(tasks.ScriptedExpert(env)())
            done = terminated or truncated
        wins += bool(info["is_success"])
    env.close()
    assert expert["domains"]["held-out"]["successes"] == wins
    for arm, run in zip([*study.ARMS, breakdown.EXPERT], written["runs"], strict=True):
        pooled = written["arms"][arm]
        assert list(pooled) == list(run["domains"])
        for name, cell in pooled.items():
            assert cell["episodes"] == 2
            assert cell["successes"] == run["domains"][name]["successes"]
            assert cell["interval"][0] <= cell["success"] <= cell["interval"][1]
    # The held-out and nominal cells replay the study's own evaluation on the same seeds.
    for row in result["rows"]:
        again = breakdown.play_run(row, result["settings"]["held_out"], 3,
                                   result["settings"]["test_seed"])
        assert again["held-out"]["successes"] == row["held_out_successes"]
        assert again["nominal"]["successes"] == row["nominal_successes"]


def test_breakdown_refuses_a_folder_without_a_study(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"transfer_study.json does not exist"):
        breakdown.main([str(tmp_path)])
    (tmp_path / "transfer_study.json").write_text(json.dumps({"settings": {}, "rows": []}))
    with pytest.raises(ValueError, match=r"no settings.held_out or no rows"):
        breakdown.main([str(tmp_path)])
