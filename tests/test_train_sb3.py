"""End-to-end runs of the SB3 baselines on ``reach`` with tiny networks and budgets.

Each run trains a few thousand steps and must leave every artifact of a run directory; a killed
run resumes and continues its step count; a saved checkpoint evaluates; missing or corrupt
checkpoints are reported as such before any environment starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import imageio.v2 as imageio
import pytest
import torch

from harness import runs, trainers
from harness.config import compose
from harness.runs import CheckpointError
from harness_common.files import read_metrics

ROOT = Path(__file__).resolve().parent.parent
torch.set_num_threads(1)

# Tiny networks and rollouts so that a run of ~1.5k steps updates several times.
ALGO_OVERRIDES = {
    "ppo": ["algo=ppo", "algo.n_steps=256", "algo.batch_size=64", "algo.n_epochs=2"],
    "a2c": ["algo=a2c", "algo.n_steps=16"],
    "trpo": ["algo=trpo", "algo.n_steps=256", "algo.batch_size=128", "algo.n_critic_updates=2"],
}
TINY = [
    "task=reach", "policy.net_arch=[16]", "total_timesteps=1500", "eval.every_steps=512",
    "eval.episodes=2", "eval.final_episodes=4", "eval.video_episodes=1",
    "checkpoint_every_steps=512", "logger.progress_bar=false", "task.max_episode_steps=20",
    "algo.log_interval=1",
]


def tiny_config(algo: str, *extra: str):
    return compose([*ALGO_OVERRIDES[algo], *TINY, *extra])


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory) -> Path:
    """One finished tiny PPO run shared by the evaluation and corruption tests."""
    run_dir = tmp_path_factory.mktemp("ppo") / "run"
    trainers.train(tiny_config("ppo", "logger=none"), run_dir)
    return run_dir


@pytest.mark.parametrize("algo", ["ppo", "a2c", "trpo"])
def test_algo_trains_reach_and_writes_every_artifact(algo, tmp_path):
    run_dir = tmp_path / "run"
    summary = trainers.train(tiny_config(algo), run_dir)

    assert (run_dir / "config.yaml").read_text().count(f"name: {algo}") == 1
    metrics = read_metrics(run_dir / "metrics.csv")
    assert "rollout/success_rate" in metrics
    assert any(key.startswith("train/") for key in metrics), "no update was logged"
    assert [step for step, _ in metrics["eval/success_rate"]] == sorted(
        step for step, _ in metrics["eval/success_rate"]
    )
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    for name in ("latest", "best"):
        meta = json.loads((run_dir / "checkpoints" / f"{name}.json").read_text())
        assert meta["algo"] == algo and meta["task"] == "reach"
        assert meta["task_options"]["max_episode_steps"] == 20
        assert (run_dir / "checkpoints" / meta["file"]).stat().st_size > 0
    videos = sorted((run_dir / "videos").glob("*.mp4"))
    assert videos and imageio.get_reader(videos[-1]).get_meta_data()["codec"] == "h264"

    written = json.loads((run_dir / "summary.json").read_text())
    assert written == json.loads(json.dumps(summary))
    low, high = written["success_interval"]
    assert 0.0 <= low <= written["success_rate"] <= high <= 1.0
    assert written["episodes"] == 4
    assert written["env_steps"] >= 1500
    assert written["wall_clock_s"] > 0 and written["fps"] > 0
    assert written["versions"]["stable-baselines3"] and "commit" in written["git"]
    assert written["machine"]["cpu_capability"] and written["machine"]["cores"] >= 1


def test_verifier_reward_logs_the_detector_error_rates(tmp_path):
    pytest.importorskip("success_detectors")
    config = tiny_config("ppo", "reward=verifier", "detector=scripted", "logger=none",
                         "total_timesteps=512", "eval.every_steps=0")
    trainers.train(config, tmp_path / "run")
    metrics = read_metrics(tmp_path / "run" / "metrics.csv")
    assert metrics["detector/false_positives"][-1][1] == 0.0  # the scripted verifier is exact
    assert sum(value for _, value in metrics["detector/evaluations"]) > 0


def test_killed_run_resumes_and_continues_the_step_count(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [*ALGO_OVERRIDES["ppo"], *TINY, "logger=none", "checkpoint_every_steps=256",
                 "eval.every_steps=0"]
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *overrides,
         "total_timesteps=1000000", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    latest = run_dir / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if latest.exists() and json.loads(latest.read_text())["num_timesteps"] >= 512:
                break
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate()
    assert latest.exists(), stderr.decode()[-2000:]
    # A kill between a save's two renames is finished by the reader, so ask it, not the JSON.
    killed_at = runs.resolve_checkpoint(latest)[1]["num_timesteps"]
    assert not (run_dir / "summary.json").exists()

    target = killed_at + 768
    summary = trainers.train(compose([*overrides, f"total_timesteps={target}", "resume=true"]),
                         run_dir)

    assert summary["env_steps"] == target
    steps = [step for step, _ in read_metrics(run_dir / "metrics.csv")["time/total_timesteps"]]
    assert steps == sorted(steps) and steps[-1] == target
    assert any(killed_at < step for step in steps)
    assert json.loads(latest.read_text())["num_timesteps"] == target


def test_saved_checkpoint_evaluates_from_the_script(ppo_run, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("evaluate_script", ROOT / "scripts/evaluate.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(script)
    output, video = tmp_path / "eval.json", tmp_path / "eval.mp4"

    # Hydra's own logging would hold pytest's captured stderr after the test closes it.
    here = [f"hydra.run.dir={tmp_path / 'evaluate'}", "hydra/job_logging=none",
            "hydra/hydra_logging=none"]
    code = script.main([f"checkpoint={ppo_run / 'checkpoints' / 'best.zip'}", "episodes=3",
                        "difficulties=[0.0,1.0]", f"output={output}", f"video={video}", *here])

    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "success" in printed and "| 0.00 | 3 |" in printed and "| 1.00 | 3 |" in printed
    report = json.loads(output.read_text())
    assert report["algo"] == "ppo" and report["episodes"] == 6
    assert [row["difficulty"] for row in report["per_difficulty"]] == [0.0, 1.0]
    assert imageio.get_reader(video).get_meta_data()["codec"] == "h264"
    assert script.main([f"checkpoint={ppo_run}", "episodes=1", "video_episod=1", *here]) == 1
    assert "video_episod" in capsys.readouterr().err
    assert script.main([f"checkpoint={ppo_run}", "episodes=1", "reference=true", *here]) == 1
    assert "holds no reference policy" in capsys.readouterr().err
    assert script.main([f"checkpoint={ppo_run}", "episodes=2", "sampled=true", *here]) == 0
    assert "(sampled)" in capsys.readouterr().out


def test_resume_without_a_checkpoint_starts_afresh_and_says_so(tmp_path, caplog):
    """A re-launched sweep resumes every job; one that never saved a checkpoint starts over."""
    summary = trainers.train(tiny_config("ppo", "resume=true", "logger=none"), tmp_path / "empty")
    assert summary["env_steps"] > 0 and "holds no checkpoint" in caplog.text


@pytest.mark.parametrize("damage", ["truncate_zip", "garble_json", "drop_zip"])
def test_resume_from_a_corrupt_checkpoint_says_so(ppo_run, tmp_path, damage, monkeypatch):
    run_dir = tmp_path / "run"
    shutil.copytree(ppo_run, run_dir)
    checkpoint = run_dir / "checkpoints" / "latest.zip"
    if damage == "truncate_zip":
        checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    elif damage == "garble_json":
        (run_dir / "checkpoints" / "latest.json").write_text('{"algo": "ppo", ')
    else:
        checkpoint.unlink()
    import harness.algos.sb3.run as sb3

    monkeypatch.setattr(sb3, "make_vec_env", lambda *a: pytest.fail("an env was started"))
    with pytest.raises(CheckpointError, match="corrupt|does not exist"):
        trainers.train(tiny_config("ppo", "resume=true", "logger=none"), run_dir)
    with pytest.raises(CheckpointError):
        runs.resolve_checkpoint(run_dir / "checkpoints" / "latest.json")


def test_fresh_run_refuses_a_directory_holding_a_run(ppo_run):
    with pytest.raises(CheckpointError, match="resume=true"):
        trainers.train(tiny_config("ppo", "logger=none"), ppo_run)


def test_a_resumed_run_dumps_on_the_same_step_grid(tmp_path):
    """SB3 counts ``log_interval`` in iterations of one ``learn`` call; the harness counts it in
    steps, so a run resumed off the grid (320 steps, grid 192) dumps where the uninterrupted
    run does."""
    overrides = ["algo=ppo", "algo.n_steps=64", "algo.batch_size=32", "algo.n_epochs=1",
                 "algo.log_interval=3", "policy.net_arch=[8]", "eval.every_steps=0",
                 "eval.final_episodes=2", "task=reach", "task.max_episode_steps=20",
                 "checkpoint_every_steps=64", "logger=none"]

    def dumps(run_dir):
        return [step for step, _ in read_metrics(run_dir / "metrics.csv")["time/total_timesteps"]]

    trainers.train(compose([*overrides, "total_timesteps=640"]), tmp_path / "whole")
    trainers.train(compose([*overrides, "total_timesteps=320"]), tmp_path / "resumed")
    trainers.train(compose([*overrides, "total_timesteps=640", "resume=true"]),
                   tmp_path / "resumed")
    assert dumps(tmp_path / "whole") == [192, 384, 576]
    assert dumps(tmp_path / "resumed") == dumps(tmp_path / "whole")
