"""The command line: every script answers ``--help`` (a Hydra app's without importing torch, and
with Hydra unpatched); the Hydra apps list their keys, print their configuration, run on tiny
settings, take a sweep's job folder as ``checkpoint=`` as written and refuse bad values naming the
key; ``import harness`` registers the Gymnasium ids.

What depends on a fresh interpreter (``--help``'s imports, Hydra unpatched, the Gymnasium ids)
runs the scripts in a subprocess, as a user would (the studies' and benchmarks' ``--help`` all in
one, each as ``__main__``). What the apps print and write runs their ``main(argv)`` in this
process (:func:`app`): ``scripts/<name>.py`` calls that same function, and a start of the
interpreter per case only added seconds."""

from __future__ import annotations

import functools
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(path.stem for path in (ROOT / "scripts").glob("*.py"))
STUDIES = sorted(str(path.relative_to(ROOT)) for folder in ("studies", "benchmarks")
                 for path in (ROOT / folder).glob("*.py"))
# The apps live in harness/apps/; scripts/<name>.py runs harness.apps.<name>.main.
HYDRA_APPS = [name for name in SCRIPTS if (ROOT / "harness/apps" / f"{name}.py").exists()
              and "@hydra.main" in (ROOT / "harness/apps" / f"{name}.py").read_text()]
KEYED_APPS = ("evaluate", "collect_demos", "pretrain_bc", "export_policy",  # help lists each
              "deploy_policy")                                          # key by hand
TRAIN_GROUPS = ("task", "algo", "policy", "curriculum", "detector", "logger", "experiment")
# An app run in this process leaves logging alone: Hydra's logging set-up closes every handler,
# pytest's and those that libraries bound to pytest's captured output among them.
HYDRA_QUIET = ("hydra/job_logging=none", "hydra/hydra_logging=none")
TINY_TRAIN = ("task=reach", "algo=grpo", "policy=mlp", "algo.iterations=1", "algo.group_size=2",
              "algo.num_start_states=2", "algo.minibatch_size=4", "task.max_episode_steps=10",
              "eval.final_episodes=2", "eval.every_steps=0", "logger=none")


def run_python(code: str) -> subprocess.CompletedProcess:
    """``python -c code`` from the repository root; it must succeed."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def run(script: str, *args: str, check: bool = True,
        python_flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``python [python_flags] scripts/<script>.py args...`` from the repository root."""
    done = subprocess.run([sys.executable, *python_flags, f"scripts/{script}.py", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def app(capsys, script: str, *args: str, check: bool = True) -> tuple[int, str, str]:
    """``scripts/<script>.py args...`` as the app's ``main`` in this process, with
    ``HYDRA_QUIET`` among the overrides (Hydra takes them as one run of arguments): its exit
    status, stdout and stderr (what was printed before is dropped)."""
    first = next((i for i, arg in enumerate(args) if "=" in arg and not arg.startswith("-")),
                 len(args))
    capsys.readouterr()
    status = importlib.import_module(f"harness.apps.{script}").main(
        [*args[:first], *HYDRA_QUIET, *args[first:]])
    out, err = capsys.readouterr()
    if check:
        assert status == 0, err[-3000:]
    return status, out, err


@functools.cache
def help_run(script: str) -> subprocess.CompletedProcess:
    """``scripts/<script>.py --help``, once per script, with the imports' times on stderr."""
    return run(script, "--help", python_flags=("-X", "importtime"))


def help_text(script: str) -> str:
    return help_run(script).stdout


# One interpreter runs every study's and benchmark's ``--help`` as ``python <path> --help`` would
# (as ``__main__``, with the script's folder first on ``sys.path``), instead of twenty starts.
HELP_OF_EACH = """
import contextlib, io, json, runpy, sys, traceback
from pathlib import Path
answers = {}
for path in sys.argv[1:]:
    out, err, status = io.StringIO(), io.StringIO(), 0
    sys.argv, sys.path[0] = [path, "--help"], str(Path(path).resolve().parent)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else (exit.code is not None)
        except Exception:
            traceback.print_exc()
            status = 1
    answers[path] = {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def study_help() -> dict[str, dict]:
    done = subprocess.run([sys.executable, "-c", HELP_OF_EACH, *STUDIES], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A one-job sweep's run folder: its name, ``0_algo.group_size=2,...``, holds = and ,.
    The training app in this process, its one job run in place by Hydra's basic launcher (the
    folder is named alike by every launcher; tests/test_launchers.py runs the others)."""
    from harness.apps import train

    sweep = tmp_path_factory.mktemp("cli") / "sweep"
    assert train.main(["-m", *TINY_TRAIN, "hydra/launcher=basic", *HYDRA_QUIET,
                       f"hydra.sweep.dir={sweep}"]) == 0
    (run_dir,) = sweep.glob("0_*")
    assert "=" in run_dir.name and "," in run_dir.name
    return run_dir


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help(script):
    text = help_text(script)
    assert len(text.splitlines()) >= 3 and "Traceback" not in text


@pytest.mark.parametrize("path", STUDIES, ids=str)
def test_every_study_and_benchmark_answers_help(path, study_help):
    """Run from the repository root, as their docstrings say."""
    answer = study_help[path]
    assert answer["status"] == 0, answer["stderr"][-3000:]
    assert answer["stdout"].startswith("usage:") and "--help" in answer["stdout"]


def test_train_help_lists_every_group_choice_and_hides_the_schemas():
    text = help_text("train")
    section = text[text.index("== Groups"):].split("\n\n")[0].splitlines()[1:]
    entries: dict[str, str] = {}  # group -> its choices, continuation lines included
    group = ""
    for line in section:
        if not line.startswith(" "):
            group = line.split()[0]
        entries[group] = entries.get(group, "") + " " + line.removeprefix(group)
    for group in TRAIN_GROUPS:
        listed = entries[("+" if group == "experiment" else "") + group]
        choices = sorted(path.stem for path in (ROOT / "conf" / group).glob("*.yaml"))
        missing = [choice for choice in choices if choice not in listed.replace(",", " ").split()]
        assert not missing, f"{group}: {missing} missing from --help"
    assert "schema" not in text and text.count("harness-train ") >= 3


@pytest.mark.parametrize("script", HYDRA_APPS)
def test_hydra_app_help_imports_neither_torch_nor_the_trainers(script):
    """``--help`` composes the config and prints the template; it needs no torch, which alone
    took seconds to import (``harness.config`` imports torch only inside the checks that use it,
    and the scripts import the trainers, policies and detectors in the functions that use them)."""
    done = help_run(script)
    imported = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "hydra.main" in imported  # the listing is there to read
    heavy = sorted(name for name in imported
                   if name.split(".")[0] in ("torch", "stable_baselines3", "transformers")
                   or name == "harness.trainers")
    assert not heavy, f"scripts/{script}.py --help imported {heavy[:5]}"
    # main.py is the training app with its help.
    assert done.stdout == help_text("train" if script == "main" else script)


def test_no_app_patches_hydra():
    """The help texts are Hydra's own templates (``hydra.help`` in each YAML): importing every
    app leaves Hydra's classes as Hydra defines them."""
    code = ("import importlib, pkgutil\n"
            "from hydra._internal.hydra import Hydra\n"
            "before = dict(vars(Hydra))\n"
            "import harness.apps\n"
            "for app in pkgutil.iter_modules(harness.apps.__path__):\n"
            "    importlib.import_module(f'harness.apps.{app.name}')\n"
            "assert dict(vars(Hydra)) == before\n")
    run_python(code)


@pytest.mark.parametrize("script", KEYED_APPS)
def test_hydra_app_help_names_every_key_of_its_config(script, capsys):
    keys = yaml.safe_load(app(capsys, script, "--cfg", "job")[1])
    text = help_text(script)
    missing = [key for key in keys if f"\n{key} " not in text]
    assert not missing, f"{missing} missing from scripts/{script}.py --help"


def test_main_job_config_is_the_experiment_and_main_py_prints_the_same(capsys):
    def printed(script: str, *args: str) -> str:
        return app(capsys, script, *args)[1]

    config = printed("train", "+experiment=main_job", "--cfg", "job")
    # The main job plays push_full_pixels_gaussian (the validation winner), setting for setting.
    assert config == printed("train", "+experiment=push_full_pixels_gaussian", "--cfg", "job")
    assert "  iterations: 150\n" in config
    job = yaml.safe_load(config)
    assert (job["task"]["name"], job["policy"]["name"], job["algo"]["name"]) == \
        ("push", "tiny_vla", "grpo")
    assert (job["policy"]["head"]["name"], job["policy"]["chunk_size"]) == ("gaussian", 4)
    assert (job["task"]["difficulty"], job["task"]["obs_mode"], job["task"]["physics"]) == \
        (1.0, "pixels", "fast")
    assert job["max_minutes"] == 40 and job["algo"]["start_policy"]["bc"]["demos"] == 200
    # The main job until 2026-12-05 keeps its settings under its own name.
    easy = yaml.safe_load(printed("train", "+experiment=push_easy_pixels", "--cfg", "job"))
    assert (easy["task"]["difficulty"], easy["algo"]["iterations"],
            easy["algo"]["start_policy"]["bc"]["demos"]) == (0.0, 360, 20)
    assert printed("main", "--cfg", "job") == config
    overridden = yaml.safe_load(printed("main", "seed=1", "algo.iterations=50", "--cfg", "job"))
    assert (overridden["seed"], overridden["algo"]["iterations"]) == (1, 50)


@pytest.mark.parametrize(("argv", "expected"), [
    ([], ["+experiment=main_job"]),
    (["--cfg", "job"], ["+experiment=main_job", "--cfg", "job"]),
    (["seed=1", "--cfg", "job"], ["+experiment=main_job", "seed=1", "--cfg", "job"]),
    (["-m", "seed=0,1"], ["-m", "+experiment=main_job", "seed=0,1"]),
])
def test_main_py_puts_the_experiment_among_the_overrides(argv, expected):
    from harness.apps.main import with_main_job

    assert with_main_job(argv) == expected


def test_main_table_shows_both_decodings_and_the_gain_over_the_better_start():
    """The main job's before/after table: both decodings of both policies, the greedy gain and
    the gain over the start's better decoding (chosen on validation), or why it is missing."""
    from harness import config as harness_config
    from harness.apps.main import before_after_table

    config = harness_config.compose(["+experiment=main_job", "eval.episodes=50"])
    summary = {
        "bc_success": 0.33, "bc_success_interval": [0.25, 0.43],
        "start_sampled_success_rate": 0.43, "final_success": 0.54,
        "final_success_interval": [0.44, 0.63], "sampled_success_rate": 0.57,
        "improvement": 0.21, "improvement_interval": [0.08, 0.33],
        "improvement_p_value": 0.0021, "best_start_decoding": "sampled",
        "start_validation_success_rate": 0.30, "start_validation_sampled_success_rate": 0.46,
        "improvement_vs_best_start": 0.11, "improvement_vs_best_start_interval": [-0.02, 0.24],
        "improvement_vs_best_start_p_value": 0.11, "iterations": 150,
        "time_limit_reached": False, "main_job_wall_clock_s": 1000.0,
    }
    table = before_after_table(summary, config, Path("run"), Path("run/learning_curve.png"))
    assert "| BC (200 demos) | 0.33 | 0.25-0.43 | 0.43 |" in table
    assert "| BC + grpo | 0.54 | 0.44-0.63 | 0.57 |" in table
    assert ("gain over BC greedy: +21 points, paired 95% interval [+8, +33], exact McNemar "
            "p = 0.0021") in table
    assert ("gain over BC sampled, its better decoding (greedy 0.30, sampled 0.46 on 50 "
            "validation episodes): +11 points, paired 95% interval [-2, +24], exact McNemar "
            "p = 0.11") in table
    resumed = {key: value for key, value in summary.items()
               if "best_start" not in key and not key.startswith("start_validation")}
    table = before_after_table(resumed, config, Path("run"), Path("run/learning_curve.png"))
    assert "gain over BC greedy: +21 points" in table
    assert "better decoding: not measured" in table


def test_evaluate_prints_its_table_and_writes_its_results(tiny_run, tmp_path, capsys):
    output = tmp_path / "eval.json"
    _, printed, _ = app(capsys, "evaluate", f"checkpoint={tiny_run}", "episodes=2",
                        "reference=true", f"output={output}", f"hydra.run.dir={tmp_path / 'eval'}")
    assert "start (reference) policy of grpo (greedy) on reach" in printed
    assert "| difficulty | episodes |" in printed and "| 1.00 | 2 |" in printed
    assert json.loads(output.read_text())["episodes"] == 2
    assert (tmp_path / "eval" / ".hydra" / "config.yaml").exists()


def test_evaluate_sweeps_with_multirun(tiny_run, tmp_path, capsys):
    _, printed, _ = app(capsys, "evaluate", "-m", f"checkpoint={tiny_run}", "episodes=1",
                        "sampled=false,true", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert "grpo (greedy) on reach" in printed and "grpo (sampled) on reach" in printed
    assert len(list((tmp_path / "sweep").glob("*/.hydra"))) == 2


def test_evaluate_takes_task_options_spelt_as_in_train(tiny_run, tmp_path, capsys):
    """``+task.<option>`` over the run's task options changes the episodes played (a shorter
    step limit, an action latency) and is recorded; what the policy sees cannot change."""
    def evaluated(name: str, *overrides: str) -> dict:
        output = tmp_path / f"{name}.json"
        app(capsys, "evaluate", f"checkpoint={tiny_run}", "episodes=2", f"output={output}",
            f"hydra.run.dir={tmp_path / name}", *overrides)
        return json.loads(output.read_text())

    trained = evaluated("trained")
    short = evaluated("short", "+task.max_episode_steps=3")
    late = evaluated("late", "+task.imperfections.action_latency=2")
    assert trained["mean_episode_length"] > 3 == short["mean_episode_length"]
    assert short["task_overrides"] == {"max_episode_steps": 3}
    assert late["task_overrides"] == {"imperfections": {"action_latency": 2}}
    assert late["mean_return"] != trained["mean_return"]  # the held actions took another path
    status, _, err = app(capsys, "evaluate", f"checkpoint={tiny_run}", "episodes=1",
                         "+task.obs_mode=pixels", f"hydra.run.dir={tmp_path / 'pixels'}",
                         check=False)
    assert status == 1
    assert "task.obs_mode='pixels' would change what the policy sees" in err


def test_collect_demos_then_pretrain_bc_on_tiny_settings(tmp_path, capsys):
    from harness.demos import load_demos

    demos = tmp_path / "reach.hdf5"
    _, printed, _ = app(capsys, "collect_demos", "task=reach", "task.obs_mode=state",
                        "episodes=2", "task.max_episode_steps=40", f"out={demos}",
                        f"hydra.run.dir={tmp_path / 'collect'}")
    assert "wrote 2 reach demos" in printed
    recorded = load_demos(demos)
    assert recorded.num_episodes == 2
    assert recorded.env_args["env_kwargs"]["max_episode_steps"] == 40

    policy = tmp_path / "bc.pt"
    _, printed, _ = app(capsys, "pretrain_bc", f"demos={demos}", "policy=mlp", "epochs=2",
                        "eval_episodes=1", f"out={policy}", f"hydra.run.dir={tmp_path / 'bc'}")
    assert "mlp policy" in printed and "held-out success" in printed
    assert policy.stat().st_size > 0
    assert json.loads(policy.with_suffix(".json").read_text())["eval/episodes"] == 1


@pytest.mark.parametrize(("script", "args", "named"), [
    ("evaluate", ["checkpoint=x", "episodes=0"], "episodes=0"),
    ("evaluate", ["checkpoint=x", "episods=3"], "episods"),
    ("evaluate", ["episodes=3"], "checkpoint=<path> is required"),
    # The spellings before task.<option> name the one to write.
    ("evaluate", ["checkpoint=x", "+imperfections.action_latency=2"],
     "write +task.imperfections.action_latency=2"),
    ("evaluate", ["checkpoint=x", "+randomization.friction=[0.3,2]"],
     "write +task.randomization.friction=[0.3,2]"),
    ("evaluate", ["checkpoint=x", "randomization={}"], "write +task.randomization.<field>="),
    ("evaluate", ["checkpoint=x", "max_episode_steps=50"], "write +task.max_episode_steps=50"),
    ("deploy_policy", ["model=x.onnx", "+task_options.max_episode_steps=100"],
     "write +task.max_episode_steps=100"),
    ("collect_demos", ["task.obs_mode=pixel"], "obs_mode='pixel'"),
    ("pretrain_bc", ["policy=cnn"], "policy='cnn'"),
    ("train", ["total_timesteps=0"], "total_timesteps=0"),
])
def test_a_bad_value_fails_naming_the_key(script, args, named, tmp_path, capsys):
    """In this process (the app's ``main``, as the console script calls it): the same status and
    message as ``scripts/<script>.py`` gives, without an interpreter start per case."""
    status = importlib.import_module(f"harness.apps.{script}").main(
        [*args, f"hydra.run.dir={tmp_path}"])
    assert status != 0 and named in capsys.readouterr().err


def test_importing_harness_registers_the_gymnasium_ids():
    code = ("import harness, gymnasium\n"
            "gymnasium.make('harness/Push-v0').reset(seed=0)\n"
            "envs = gymnasium.make_vec('harness/Reach-v0', num_envs=2)\n"
            "assert envs.reset(seed=0)[0]['state'].shape[0] == 2\n")
    run_python(code)


def test_a_path_argument_is_taken_as_written(tmp_path):
    """``key=<existing path>`` is quoted for Hydra when the path holds its syntax; anything else,
    a sweep over two values included, reaches Hydra unchanged."""
    from harness_common.cli import quote_paths

    job = tmp_path / "0_algo=grpo,seed=1"
    job.mkdir()
    quoted = tmp_path / "it's"
    quoted.mkdir()
    args = ["-m", f"checkpoint={job}", f"+hydra.run.dir={job}", "checkpoint=a,b", "seed=0,1",
            f"checkpoint={tmp_path}", f"checkpoint={quoted}", "--cfg", "job"]
    assert quote_paths(args) == [
        "-m", f"checkpoint='{job}'", f"+hydra.run.dir='{job}'", "checkpoint=a,b", "seed=0,1",
        f"checkpoint={tmp_path}", f'checkpoint="{quoted}"', "--cfg", "job"]


def test_run_app_returns_the_exit_status_and_prints_a_message(capsys):
    from harness_common.cli import run_app

    def fails() -> None:
        raise SystemExit("collect_demos: episodes=0; must be >= 1")

    assert run_app(lambda: None, []) == 0
    assert run_app(lambda: sys.exit(3), []) == 3
    assert run_app(fails, []) == 1
    assert capsys.readouterr().err == "collect_demos: episodes=0; must be >= 1\n"
