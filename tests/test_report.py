"""The experiment report: statistics against hand-computed numbers, reports of fake run folders
whose every number is known, bad input, the ablation's experiment config, and a real multirun."""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness import config as harness_config
from harness import report
from harness.report import ReportError, build_report, load_runs, scan_runs

ROOT = Path(__file__).resolve().parent.parent
REPS = 500  # enough for intervals whose ends have >= 25% mass, as below


def write_run(folder: Path, *, overrides: list[str] | None, seed: int, final: float,
              task: str = "push", algo: str = "grpo", config: dict | None = None,
              series: dict[str, list[tuple[int, float]]] | None = None,
              env_steps: int = 3000, extra: dict | None = None) -> Path:
    """A run folder as ``scripts/train.py`` leaves it: summary.json (plus ``extra``),
    long-format metrics.csv, config.yaml and (unless ``overrides`` is None)
    .hydra/overrides.yaml."""
    folder.mkdir(parents=True)
    series = dict(series or {})
    series.setdefault("final/success_rate", [(env_steps, final)])
    with open(folder / "metrics.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["step", "time_s", "key", "value"])
        for key, points in series.items():
            for step, value in points:
                writer.writerow([step, f"{step / 100:.3f}", key, repr(float(value))])
    summary = {"algo": algo, "task": task, "seed": seed, "success_rate": final,
               "success_interval": [max(0.0, final - 0.1), min(1.0, final + 0.1)],
               "env_steps": env_steps, "wall_clock_s": 12.0, "iterations": 3, **(extra or {})}
    (folder / "summary.json").write_text(json.dumps(summary))
    resolved = config or {"task": {"name": task}, "algo": {"name": algo}, "seed": seed}
    (folder / "config.yaml").write_text(yaml.safe_dump(resolved))
    if overrides is not None:
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    return folder


def section(text: str, title: str) -> str:
    """The part of a report from the heading starting with ``title`` to the next heading."""
    return text.split(f"## {title}")[1].split("\n## ")[0]


def rows_of(text: str, first_cell: str) -> list[list[str]]:
    """The cells of every Markdown table row whose first cell is ``first_cell``."""
    return [[c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith(f"| {first_cell} |")]


# Two arms x two seeds. Every number the report shows is worked out next to it.
ABLATION = {
    ("fixed", 0): dict(final=0.1, series={
        "rollout/success_rate": [(1000, 0.0), (2000, 0.1), (3000, 0.2)],
        "rollout/signal_fraction": [(1000, 0.0), (2000, 0.25), (3000, 0.5)],  # mean 0.25
        "eval/success_rate": [(1500, 0.0)],
    }),
    ("fixed", 1): dict(final=0.3, series={
        "rollout/success_rate": [(1000, 0.0), (2000, 0.0), (3000, 0.1)],
        "rollout/signal_fraction": [(1000, 0.0), (2000, 0.0), (3000, 0.25)],  # mean 1/12
        "eval/success_rate": [(1500, 0.1)],
    }),
    ("success_band", 0): dict(final=0.5, series={
        "rollout/success_rate": [(1000, 0.3), (2000, 0.6), (3000, 0.85)],  # 50% at 2000
        "rollout/signal_fraction": [(1000, 0.5), (2000, 0.75), (3000, 1.0)],  # mean 0.75
        "eval/success_rate": [(1500, 0.5)],  # held-out 50% at 1500
        "detector/false_positive_rate": [(1000, 0.1), (3000, 0.3)],  # mean 0.2
    }),
    ("success_band", 1): dict(final=0.7, series={
        "rollout/success_rate": [(1000, 0.4), (2000, 0.45), (3000, 0.9)],  # 50% at 3000
        "rollout/signal_fraction": [(1000, 0.5), (2000, 0.5), (3000, 0.5)],  # mean 0.5
        "eval/success_rate": [(1500, 0.25)],  # held-out 50% at 3000 (final 0.7)
        "detector/false_positive_rate": [(1000, 0.0)],  # mean 0.0
    }),
}


@pytest.fixture
def ablation(tmp_path) -> Path:
    """A fake sweep ``-m +experiment=x curriculum=fixed,success_band seed=0,1``."""
    root = tmp_path / "multirun"
    for job, ((curriculum, seed), run) in enumerate(ABLATION.items()):
        write_run(root / f"{job}_curriculum={curriculum},seed={seed}", seed=seed,
                  overrides=["+experiment=x", f"curriculum={curriculum}", f"seed={seed}"], **run)
    return root


# ------------------------------------------------------------------------------- statistics
def test_interquartile_mean_matches_hand_computed_values_and_rliable():
    from rliable import metrics

    # Sorted 0.1, 0.3, 0.5, 0.9: one cut from each end leaves 0.3 and 0.5.
    assert report.interquartile_mean([0.9, 0.1, 0.5, 0.3]) == pytest.approx(0.4)
    # Eight values: two cut from each end leave 3, 4, 5, 6.
    assert report.interquartile_mean([100, 1, 7, 3, 5, 2, 4, 6]) == pytest.approx(4.5)
    # Fewer than four: nothing is cut.
    assert report.interquartile_mean([0.0, 0.0, 0.9]) == pytest.approx(0.3)
    scores = np.random.default_rng(0).random((7, 3))
    assert report.interquartile_mean(scores) == pytest.approx(metrics.aggregate_iqm(scores))


def test_bootstrap_interval_by_rliable_and_by_the_numpy_fallback(monkeypatch):
    # The mean of two resampled runs is 0.1, 0.2 or 0.3 with probabilities 1/4, 1/2, 1/4, so
    # the 2.5th and 97.5th percentiles are exactly the two runs.
    by_rliable = report.stratified_bootstrap([[0.1, 0.3]], "iqm", reps=REPS)
    assert by_rliable.method.startswith("rliable")
    monkeypatch.setitem(sys.modules, "rliable", None)  # "import rliable" now raises ImportError
    by_numpy = report.stratified_bootstrap([[0.1, 0.3]], "iqm", reps=REPS)
    assert by_numpy.method.startswith("numpy")
    for estimate in (by_rliable, by_numpy):
        assert (estimate.point, estimate.low, estimate.high) == pytest.approx((0.2, 0.1, 0.3))
    # Strata of different sizes (tasks with different numbers of runs) take the numpy path, and
    # resampling within each task keeps every replicate at (0.2 + 0.2 + 0.6) / 3 here, where
    # pooled resampling would spread them.
    ragged = report.stratified_bootstrap([[0.2, 0.2], [0.6]], "mean", reps=REPS)
    assert ragged.method.startswith("numpy")
    assert (ragged.point, ragged.low, ragged.high) == pytest.approx((1 / 3,) * 3)


def test_steps_to_threshold_counts_unreached_seeds_as_infinitely_late():
    assert report.first_step_reaching([(10, 0.2), (20, 0.5), (30, 0.4)], 0.5) == 20
    assert report.first_step_reaching([(10, 0.2)], 0.5) is None
    assert report.median_steps([100, 300, None]) == (300.0, 2)
    assert report.median_steps([100, None, None]) == (float("inf"), 1)


def test_band_interpolates_on_the_steps_every_run_covers():
    band = report.band_across_runs([[(0, 0.0), (100, 1.0)], [(50, 0.0), (150, 0.0)]], points=3)
    assert band.steps.tolist() == [50, 75, 100]
    assert band.centre.tolist() == pytest.approx([0.25, 0.375, 0.5])
    assert band.high.tolist() == pytest.approx([0.5, 0.75, 1.0])
    # Disjoint ranges (a final evaluation each): one point at the median last step.
    point = report.band_across_runs([[(90, 0.2)], [(110, 0.6)]])
    assert point.steps.tolist() == [100] and point.centre.tolist() == pytest.approx([0.4])


# --------------------------------------------------------------------------------- reports
def test_report_of_fake_ablation_shows_hand_computed_numbers(ablation):
    runs = load_runs(ablation)
    assert [r.arm for r in runs] == ["curriculum=fixed"] * 2 + ["curriculum=success_band"] * 2
    text = build_report(ablation, reps=REPS).read_text()
    assert "Warning" not in text
    final = section(text, "Final held-out")
    # IQM of two runs is their mean; the interval is the two runs (see the bootstrap test).
    assert rows_of(final, "curriculum=fixed") == [
        ["curriculum=fixed", "2", "0.200", "[0.100, 0.300]", "0.200", "0.100, 0.300"]]
    assert rows_of(final, "curriculum=success_band") == [
        ["curriculum=success_band", "2", "0.600", "[0.500, 0.700]", "0.600", "0.500, 0.700"]]
    steps = section(text, "Environment steps")
    # Held-out 50%: seeds at 1500 and 3000 -> 2250; training 50%: 2000 and 3000 -> 2500;
    # training 80%: 3000 and 3000.
    assert rows_of(steps, "curriculum=success_band") == [[
        "curriculum=success_band", "2,250 (2/2)", "not reached (0/2)", "2,500 (2/2)",
        "3,000 (2/2)"]]
    assert rows_of(steps, "curriculum=fixed")[0][1:] == ["not reached (0/2)"] * 4
    signal = section(text, "Fraction of informative groups")
    # fixed: runs 0.25 and 1/12, mean 1/6; success_band: 0.75 and 0.5, mean 0.625.
    assert rows_of(signal, "curriculum=fixed") == [
        ["curriculum=fixed", "2", "0.167", "[0.083, 0.250]", "1.00x", "0.250, 0.083"]]
    assert rows_of(signal, "curriculum=success_band")[0][2:5] == [
        "0.625", "[0.500, 0.750]", "3.75x"]
    detector = section(text, "Verifier error rates")
    assert rows_of(detector, "curriculum=success_band") == [
        ["curriculum=success_band", "2", "0.100"]]
    assert rows_of(detector, "curriculum=fixed") == [["curriculum=fixed", "0", "n/a"]]
    per_run = section(text, "Runs")
    assert rows_of(per_run, "`2`")[0][1:6] == [
        "curriculum=success_band", "0", "grpo", "push", "0.500"]
    for png in ("final_iqm", "learning_curves", "signal_fraction"):
        assert (ablation / "plots" / f"{png}.png").stat().st_size > 10_000


def test_sweeps_pooled_through_links_report_as_one(ablation, tmp_path):
    """More seeds run later in a second sweep: a folder of links to both reports them together."""
    later = tmp_path / "later"
    for job, ((curriculum, seed), run) in enumerate(ABLATION.items()):
        write_run(later / f"{job}_curriculum={curriculum},seed={seed + 2}", seed=seed + 2,
                  overrides=["+experiment=x", f"curriculum={curriculum}", f"seed={seed + 2}"],
                  **run)
    pooled = tmp_path / "pooled"
    pooled.mkdir()
    (pooled / "first").symlink_to(ablation)
    (pooled / "later").symlink_to(later)
    (pooled / "later" / "loop").symlink_to(pooled)  # a cycle is walked once, not forever
    runs = load_runs(pooled)
    assert sorted((r.arm, r.seed) for r in runs) == sorted(
        (f"curriculum={c}", s) for c in ("fixed", "success_band") for s in range(4))
    text = build_report(pooled, tmp_path / "out", reps=REPS).read_text()
    # each arm's finals twice over: fixed 0.1, 0.3, 0.1, 0.3 -> IQM 0.2; success_band 0.6
    assert rows_of(section(text, "Final held-out"), "curriculum=fixed")[0][1:3] == ["4", "0.200"]
    assert rows_of(section(text, "Final held-out"), "curriculum=success_band")[0][1:3] == [
        "4", "0.600"]
    assert "| `later/0` | curriculum=fixed | 2 |" in section(text, "Runs")


def test_report_iqm_of_four_seeds(tmp_path):
    for seed, final in enumerate([0.9, 0.1, 0.5, 0.3]):
        write_run(tmp_path / f"{seed}_seed={seed}", overrides=[f"seed={seed}"], seed=seed,
                  final=final)
    text = build_report(tmp_path, tmp_path / "out", reps=REPS).read_text()
    # One arm (only the seed varies); IQM of 0.1, 0.3, 0.5, 0.9 is 0.4, their mean 0.45.
    row = rows_of(section(text, "Final held-out"), "all runs")[0]
    assert row[:3] + row[4:5] == ["all runs", "4", "0.400", "0.450"]
    assert (tmp_path / "out" / "report.md").exists()


def write_sweep(root: Path, seeds_per_arm: dict[str, int]) -> Path:
    """A fake sweep ``-m curriculum=... seed=...`` with the given number of seeds per arm."""
    job = 0
    for curriculum, seeds in seeds_per_arm.items():
        for seed in range(seeds):
            write_run(root / f"{job}_curriculum={curriculum},seed={seed}", seed=seed,
                      final=0.1 * seed, overrides=[f"curriculum={curriculum}", f"seed={seed}"])
            job += 1
    return root


def test_arms_with_fewer_than_five_runs_get_a_note_beside_the_final_table(tmp_path, caplog):
    sweep = write_sweep(tmp_path / "sweep", {"fixed": 5, "success_band": 4})
    with caplog.at_level(logging.WARNING, logger="harness.report"):
        text = build_report(sweep, reps=REPS).read_text()
    note = ("Bootstrap intervals over fewer than 5 runs per arm are unreliable (Agarwal et al. "
            "2021 recommend more runs): curriculum=success_band (4 runs).")
    final = section(text, "Final held-out")
    assert note in final
    assert final.index("| curriculum=success_band |") < final.index(note)  # after the table
    assert note in caplog.text
    assert "curriculum=fixed (" not in text


def test_no_few_runs_note_with_five_runs_per_arm(tmp_path, caplog):
    sweep = write_sweep(tmp_path / "sweep", {"fixed": 5, "success_band": 5})
    with caplog.at_level(logging.WARNING, logger="harness.report"):
        text = build_report(sweep, reps=REPS).read_text()
    assert "unreliable" not in text and "unreliable" not in caplog.text


def test_arms_of_runs_without_hydra_folders_come_from_their_configs(tmp_path):
    for job, (algo, n_steps) in enumerate([("ppo", 2048), ("a2c", 5), ("ppo", 2048)]):
        config = {"task": {"name": "reach"}, "algo": {"name": algo, "n_steps": n_steps},
                  "seed": job}
        write_run(tmp_path / f"run{job}", overrides=None, seed=job, final=0.5, algo=algo,
                  config=config)
    # algo.n_steps follows algo.name, so it does not split the arms further.
    assert [r.arm for r in load_runs(tmp_path)] == ["algo=ppo", "algo=a2c", "algo=ppo"]


# ------------------------------------------------------------------------------- bad input
def test_a_folder_without_runs_is_a_clear_error(tmp_path):
    with pytest.raises(ReportError, match="no runs to report"):
        build_report(tmp_path)
    with pytest.raises(ReportError, match="is not a folder"):
        build_report(tmp_path / "missing")
    unfinished = tmp_path / "0_seed=0"
    unfinished.mkdir()
    (unfinished / "metrics.csv").write_text("step,time_s,key,value\n")
    with pytest.raises(ReportError, match="no summary.json"):
        build_report(tmp_path)


def test_mixed_tasks_fail_unless_allowed_then_warn(tmp_path, caplog):
    for job, task in enumerate(["push", "push", "reach", "reach"]):
        write_run(tmp_path / f"{job}_seed={job % 2}", overrides=[f"seed={job % 2}"],
                  seed=job % 2, task=task, final=0.5)
    with pytest.raises(ReportError, match=r"different tasks.*push \(2 runs\), reach \(2 runs\)"):
        build_report(tmp_path)
    with caplog.at_level(logging.WARNING, logger="harness.report"):
        text = build_report(tmp_path, allow_mixed_tasks=True, reps=REPS).read_text()
    assert "runs of different tasks are pooled" in caplog.text
    assert text.splitlines()[2].startswith("> **Warning:** runs of different tasks are pooled")


def test_runs_with_missing_metrics_are_skipped_with_a_reason(ablation, caplog):
    no_metrics = ablation / "4_curriculum=linear,seed=0"
    write_run(no_metrics, overrides=["curriculum=linear", "seed=0"], seed=0, final=0.5)
    (no_metrics / "metrics.csv").unlink()
    no_success = ablation / "5_curriculum=linear,seed=1"
    write_run(no_success, overrides=["curriculum=linear", "seed=1"], seed=1, final=0.5)
    summary = json.loads((no_success / "summary.json").read_text())
    del summary["success_rate"]
    (no_success / "summary.json").write_text(json.dumps(summary))
    with caplog.at_level(logging.WARNING, logger="harness.report"):
        text = build_report(ablation, reps=REPS).read_text()
    assert "skipped `4_curriculum=linear,seed=0`: no metrics.csv" in text
    assert "skipped `5_curriculum=linear,seed=1`: summary.json has no numeric 'success_rate'" \
        in text
    assert "no metrics.csv" in caplog.text
    assert "curriculum=linear" not in section(text, "Final held-out")


def test_report_script_prints_the_report_and_fails_cleanly(ablation, tmp_path, monkeypatch,
                                                            capsys):
    spec = importlib.util.spec_from_file_location("report_script", ROOT / "scripts" / "report.py")
    report_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report_script)

    monkeypatch.setattr(sys, "argv", ["report.py", str(ablation), "--reps", str(REPS)])
    assert report_script.main() == 0
    assert f"report: {ablation / 'report.md'}" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["report.py", str(tmp_path / "empty_dir_is_missing")])
    assert report_script.main() == 2
    assert "error: " in capsys.readouterr().err


# ---------------------------------------------------------------------- the ablation itself
@pytest.mark.parametrize(("experiment", "task", "bc_difficulty"), [
    ("curriculum_ablation", "reach", 0.0),
    ("curriculum_ablation_long", "reach", 0.0),
    ("curriculum_ablation_push", "push", None),
    ("curriculum_ablation_push_easy_bc", "push", 0.0),
])
@pytest.mark.parametrize("curriculum", ["fixed", "uniform", "linear", "success_band"])
def test_curriculum_ablation_composes_for_every_curriculum(experiment, task, bc_difficulty,
                                                           curriculum):
    config = harness_config.compose([f"+experiment={experiment}", f"curriculum={curriculum}"])
    assert (config.algo.name, config.task.name, config.task.obs_mode, config.policy.name) == (
        "grpo", task, "state", "mlp")
    assert config.task.difficulty == 1.0 and config.curriculum.name == curriculum
    assert config.max_minutes is not None and config.total_timesteps is None
    assert config.algo.iterations <= 1000  # the budget of a group run
    # the easy-start variants clone on difficulty 0 and still train and evaluate at 1.0
    assert config.algo.start_policy.bc.difficulty == bc_difficulty


def test_long_curriculum_ablation_changes_only_the_budget():
    short = harness_config.compose(["+experiment=curriculum_ablation", "curriculum=success_band"])
    long = harness_config.compose(["+experiment=curriculum_ablation_long",
                                   "curriculum=success_band"])
    assert (short.algo.iterations, long.algo.iterations) == (225, 600)
    for block in ("task", "policy", "curriculum", "eval"):
        assert getattr(long, block) == getattr(short, block), block
    assert {**vars(long.algo), "iterations": 225} == vars(short.algo)


# Four seeds of one arm: start greedy / sampled, the decoding validation chose, final greedy and
# sampled. The better start is (0.4, 0.3, 0.6, 0.5); the gains over it (+20, +20, -10, +40).
BEFORE_AFTER = [(0.2, 0.4, "sampled", 0.6, 0.7), (0.3, 0.3, "greedy", 0.5, 0.4),
                (0.4, 0.6, "sampled", 0.5, 0.6), (0.5, 0.5, "sampled", 0.9, 0.8)]


def test_before_after_section_shows_hand_computed_numbers(tmp_path):
    root = tmp_path / "multirun"
    for seed, (greedy, sampled, best, final, final_sampled) in enumerate(BEFORE_AFTER):
        better = sampled if best == "sampled" else greedy
        write_run(root / f"{seed}_seed={seed}", seed=seed, overrides=[f"seed={seed}"],
                  final=final, extra={
                      "start_success_rate": greedy, "start_sampled_success_rate": sampled,
                      "best_start_decoding": best, "sampled_success_rate": final_sampled,
                      "improvement": final - greedy, "improvement_interval": [-0.1, 0.5],
                      "improvement_p_value": 0.04, "improvement_vs_best_start": final - better,
                      "improvement_vs_best_start_interval": [final - better - 0.1,
                                                             final - better + 0.1],
                      "improvement_vs_best_start_p_value": 0.01})
    text = build_report(root, reps=REPS).read_text()
    part = section(text, "Before and after")
    # IQM of four values: the mean of the middle two after sorting
    assert rows_of(part, "start, greedy")[0][1] == "0.35"                  # (0.3 + 0.4) / 2
    assert rows_of(part, "start, better decoding (chosen on validation)")[0][1] == "0.45"
    assert rows_of(part, "final, greedy")[0][1] == "0.55"                  # (0.5 + 0.6) / 2
    assert rows_of(part, "final, sampled")[0][1] == "0.65"                 # (0.6 + 0.7) / 2
    gain = rows_of(part, "gain: final greedy - better start")[0]
    assert gain[1] == "+20" and gain[3] == "+20, +20, -10, +40"            # (20 + 20) / 2
    # P(final > start): 12.5 of the 16 pairs (ties half), rliable's Mann-Whitney form
    assert rows_of(part, "P(final greedy > better start)")[0][1] == "0.78"
    # interval lower ends 0.1, 0.1, -0.2, 0.3; upper ends 0.3, 0.3, 0.0, 0.5
    assert "beats the start's better decoding on 3 of 4 seeds; its paired interval lies above " \
           "0 on 3 and below 0 on 0." in part
    assert rows_of(part, "2")[0][3:7] == ["sampled", "0.50", "0.60", "-10 [-20, +0], p = 0.01"]
    assert (root / "plots" / "before_after.png").stat().st_size > 10_000


def test_report_of_a_real_two_job_multirun(tmp_path, capsys):
    """A real ``scripts/train.py -m`` sweep: the training app's ``main`` in this process, its
    two jobs played one after the other by Hydra's basic launcher (the folders are those of
    every launcher; tests/test_launchers.py runs the launchers themselves)."""
    from harness.apps import train

    sweep = tmp_path / "sweep"
    status = train.main(
        ["-m", "task=reach", "task.obs_mode=state", "policy=mlp", "algo=grpo",
         "algo.iterations=2", "algo.group_size=4", "algo.num_start_states=2",
         "eval.final_episodes=3", "eval.every_steps=0", "logger.videos=false",
         "logger.tensorboard=false", "logger.progress_bar=false",
         "curriculum=fixed,success_band", "hydra/launcher=basic", f"hydra.sweep.dir={sweep}",
         # Hydra's logging set-up would close pytest's handlers (and its captured output)
         "hydra/job_logging=none", "hydra/hydra_logging=none"])
    assert status == 0, capsys.readouterr().err[-3000:]
    runs = load_runs(sweep)
    assert [r.arm for r in runs] == ["curriculum=fixed", "curriculum=success_band"]
    text = build_report(sweep, reps=REPS).read_text()
    final = section(text, "Final held-out")
    for run in runs:
        assert rows_of(final, run.arm)[0][1:3] == ["1", f"{run.summary['success_rate']:.3f}"]
    signal = section(text, "Fraction of informative groups")
    assert len(rows_of(signal, "curriculum=success_band")) == 1
    assert (sweep / "plots" / "learning_curves.png").exists()
    # real group runs carry their start policy's figures: the before/after section reads them
    part = section(text, "Before and after")
    for run in runs:
        gain = 100 * run.summary["improvement_vs_best_start"]
        assert f"### `{run.arm}`: 1 seeds" in part and f"{gain:+.0f}" in part


def test_bootstrap_interval_is_the_same_for_the_same_seed():
    """rliable resamples from the global np.random whatever random_state it gets; the report
    seeds it, so one seed gives one interval, and the caller's global state is left alone."""
    scores = [[0.1, 0.3, 0.2, 0.6, 0.0, 0.4]]
    first = report.stratified_bootstrap(scores, "iqm", 500, seed=3)
    np.random.seed(123)
    expected_draw = np.random.rand()
    np.random.seed(123)
    second = report.stratified_bootstrap(scores, "iqm", 500, seed=3)
    assert np.random.rand() == expected_draw
    assert (first.low, first.high) == (second.low, second.high)


def algo_sweep(root: Path, finals: dict[str, list[float]],
               clocks: dict[str, float] | None = None) -> Path:
    """A fake sweep ``-m algo=... seed=0,1,...``: ``finals[algo][seed]`` is each run's final
    success, ``clocks[algo]`` its wall clock."""
    job = 0
    for algo, scores in finals.items():
        for seed, final in enumerate(scores):
            folder = write_run(root / f"{job}_algo={algo},seed={seed}", seed=seed, final=final,
                               algo=algo, overrides=[f"algo={algo}", f"seed={seed}"],
                               env_steps=1000 * (seed + 1))
            if clocks:
                summary = json.loads((folder / "summary.json").read_text())
                summary["wall_clock_s"] = clocks[algo]
                (folder / "summary.json").write_text(json.dumps(summary))
            job += 1
    return root


def test_reference_section_shows_hand_computed_numbers(tmp_path):
    # grpo is the reference by default. vla_ppo vs grpo per seed: 0.5-0.2, 0.1-0.3, 0.4-0.4 ->
    # differences +0.3, -0.2, 0 (mean +0.0333); P(vla_ppo > grpo) over the 3 x 3 pairs:
    # 0.5 beats all three (3); 0.1 beats none (0); 0.4 beats 0.2 and 0.3, ties 0.4 (2.5) -> 5.5/9.
    # rloo ran seed 0 only: 0.9 - 0.2 = +0.7, beats every grpo run.
    root = algo_sweep(tmp_path / "sweep", {"grpo": [0.2, 0.3, 0.4], "vla_ppo": [0.5, 0.1, 0.4],
                                           "rloo": [0.9]},
                      clocks={"grpo": 100.0, "vla_ppo": 150.0, "rloo": 50.0})
    text = build_report(root, reps=REPS).read_text()
    part = section(text, "Against the reference arm `algo=grpo`")
    reference = rows_of(part, "`algo=grpo` (reference)")[0]
    assert reference[5:] == ["2,000", "100", "1.00×"]  # median env steps of seeds 0-2: 2,000
    ppo = rows_of(part, "`algo=vla_ppo`")[0]
    assert ppo[1] == "3" and ppo[2].startswith(f"{5.5 / 9:.2f} [")
    assert ppo[3].startswith("+0.033 [") and ppo[4] == "1 / 1 / 1"
    assert ppo[5:] == ["2,000", "150", "1.50×"]
    rloo = rows_of(part, "`algo=rloo`")[0]
    assert rloo[2].startswith("1.00 [") and rloo[3] == "+0.700 [+0.700, +0.700]"
    assert rloo[4] == "1 / 0 / 0" and rloo[7] == "0.50×"
    assert (root / "plots" / "improvement_over_reference.png").stat().st_size > 0


def test_ignored_setting_does_not_split_arms(tmp_path):
    # vla_ppo runs started from each seed's saved grpo start: algo.start_policy.file differs per
    # seed
    root = tmp_path / "sweep"
    for job, (algo, seed, final) in enumerate([("grpo", 0, 0.2), ("grpo", 1, 0.4),
                                                ("vla_ppo", 0, 0.5), ("vla_ppo", 1, 0.3)]):
        start = [] if algo == "grpo" else [f"algo.start_policy.file=/runs/grpo_s{seed}/start.pt"]
        write_run(root / f"{job}_{algo}_s{seed}", seed=seed, final=final, algo=algo,
                  overrides=[f"algo={algo}", f"seed={seed}", *start])
    split = sorted({run.arm for run in scan_runs(root)[0]})
    assert len(split) == 3 and "algo=grpo, algo.start_policy.file=<default>" in split
    assert sorted({run.arm for run in scan_runs(root, ignore=("algo.start_policy.file",))[0]}) == [
        "algo=grpo", "algo=vla_ppo"]
    from harness.apps.report import main

    assert main([str(root), "--ignore", "algo.start_policy.file", "--reps", str(REPS)]) == 0
    part = section((root / "report.md").read_text(), "Against the reference arm `algo=grpo`")
    assert rows_of(part, "`algo=vla_ppo`")[0][3:5] == ["+0.100 [-0.100, +0.300]", "1 / 0 / 1"]


def test_reference_arm_is_chosen_or_refused_by_name(tmp_path, capsys):
    root = algo_sweep(tmp_path / "sweep", {"rloo": [0.2, 0.3], "critic": [0.5, 0.1]})
    text = build_report(root, reps=REPS).read_text()
    assert "Against the reference arm" not in text  # no algo=grpo arm: no default reference
    text = build_report(root, reps=REPS, reference="algo=rloo").read_text()
    assert rows_of(section(text, "Against the reference arm `algo=rloo`"), "`algo=critic`")
    with pytest.raises(ReportError, match=r"reference='algo=grpo' is not an arm.*algo=critic"):
        build_report(root, reps=REPS, reference="algo=grpo")
    from harness.apps.report import main

    assert main([str(root), "--reference", "grpo"]) == 2
    assert "reference='grpo' is not an arm" in capsys.readouterr().err


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "rloo", "critic", "reinforce", "vla_ppo"])
@pytest.mark.parametrize(("experiment", "obs_mode", "policy"), [
    ("algo_comparison", "pixels", "tiny_vla"), ("algo_comparison_state", "state", "mlp")])
def test_algo_comparison_gives_every_algorithm_the_same_budget_and_start(algo, experiment,
                                                                         obs_mode, policy):
    config = harness_config.compose([f"+experiment={experiment}", f"algo={algo}", "seed=3"])
    reference = harness_config.compose([f"+experiment={experiment}", "algo=grpo", "seed=3"])
    assert (config.algo.name, config.task.name, config.task.obs_mode, config.policy.name) == (
        algo, "push", obs_mode, policy)
    same = ("iterations", "group_size", "num_start_states", "learning_rate", "num_iterations",
            "minibatch_size", "zero_signal", "start_policy", "demo_seed", "starts")
    assert {k: getattr(config.algo, k) for k in same} == {
        k: getattr(reference.algo, k) for k in same}
    assert config.algo.zero_signal == "keep" and config.task.difficulty == 1.0


@pytest.mark.parametrize("override", ["algo.start_policy.bc.difficulty=1.0",
                                      "algo.start_policy.bc.demos=0",
                                      "policy/head=gaussian", "algo=vla_ppo"])
def test_reach_diagnosis_changes_one_factor(override):
    base = harness_config.compose(["+experiment=reach_diagnosis"])
    config = harness_config.compose(["+experiment=reach_diagnosis", override])
    assert (base.task.name, base.curriculum.name, base.algo.name, base.algo.iterations) == (
        "reach", "fixed", "grpo", 125)
    assert (config.algo.iterations, config.algo.learning_rate) == (125, base.algo.learning_rate)
