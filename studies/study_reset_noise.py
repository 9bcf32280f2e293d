"""Study: inexact resets (``algo.reset_noise``) against what group advantages learn from.

A real robot cannot put the gripper and the objects back exactly, so the G attempts of a group
start from slightly different states, and part of an attempt's advantage is the luck of its
start rather than the quality of its actions. For each estimator (``--algos``, GRPO and the
critic baseline by default) and each position sigma (``--sigmas-mm``), one training run, then:

* **informative-group fraction**: ``rollout/mixed_outcome_fraction`` (groups whose outcomes are
  not all equal) averaged over the run's iterations;
* **advantage / start-luck correlation**: with the final policy, ``--probe-starts`` fresh start
  states (their own seed range) each give G attempts from perturbed copies (the run's sigma),
  played once and weighed by the run's estimator; each attempt's own start state is then
  played ``--probe-repeats`` more times to estimate its success probability under that
  policy. ``advantage_luck_correlation`` is the Pearson correlation of the advantages with
  those per-state success rates, both centred within each group: how much an attempt's
  advantage over its group mates credits its luckier start (about 0 with exact resets, where
  the attempts of a group share one state). ``advantage_luck_correlation_pooled`` leaves them
  uncentred, so for the critic it also counts how much the value misses between start states;
* **final success**: the run's final evaluation (greedy, test seeds, exact resets: evaluation
  is never perturbed).

Writes ``<out>/<algo>_sigma<mm>/`` (the runs), ``<out>/study.json``, ``<out>/study.csv`` and
``<out>/study_reset_noise.png``. With ``--seeds 0 1 2`` each seed's runs and table go to
``<out>/seed<N>/`` and the combined table and figure (the mean over seeds, each seed's value a
dot) to ``<out>``; ``--combine A/study.json B/study.json ...`` only merges tables measured
apart (one per seed, or per arm on several machines) into ``<out>``. Every run starts from
``+experiment=curriculum_ablation`` (state ``reach``, MLP token policy cloned on 5 expert demos
at difficulty 0) at ``--difficulty``; ``--override`` adds Hydra overrides to every run.

Usage, from the repository root:
    python studies/study_reset_noise.py --out outputs/study_reset_noise \\
        --sigmas-mm 0 2 5 10 20 --algos grpo critic --iterations 45 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import tasks
from harness import trainers
from harness.algos.group.checkpoints import policy_from_state, read_checkpoint
from harness.algos.group.update import GroupTrainer
from harness.algos.rollout.engine import RolloutEngine
from harness.algos.rollout.records import EngineSpec, Job
from harness.config import TrainConfig, compose
from harness.policies.saving import policy_record
from harness_common.files import atomic_write_text, read_metrics
from harness_common.plots import save_figure
from tasks.perturb import ResetNoise, perturbed_snapshots

PROBE_SEED = 7_000_000  # start states of the correlation probe: apart from training and eval


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/study_reset_noise"))
    parser.add_argument("--sigmas-mm", type=float, nargs="+", default=[0, 2, 5, 10, 20])
    parser.add_argument("--algos", nargs="+", default=["grpo", "critic"])
    parser.add_argument("--difficulty", type=float, default=0.3, help="task.difficulty")
    parser.add_argument("--iterations", type=int, default=45,
                        help="algo.iterations, the budget (45: about 60k env steps)")
    parser.add_argument("--final-episodes", type=int, default=100)
    parser.add_argument("--probe-starts", type=int, default=16)
    parser.add_argument("--probe-repeats", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="several seeds, each into <out>/seed<N>/, combined in <out>")
    parser.add_argument("--combine", type=Path, nargs="+", default=None,
                        help="only merge these study.json files into <out>")
    parser.add_argument("--override", nargs="*", default=[], help="more Hydra overrides")
    args = parser.parse_args(argv)
    for path in args.combine or []:
        if not path.is_file():
            parser.error(f"--combine: {path} is not a file (expected a study.json)")
    if any(s < 0 for s in args.sigmas_mm):
        parser.error(f"--sigmas-mm must be >= 0, got {args.sigmas_mm}")
    if args.probe_starts < 1 or args.probe_repeats < 1:
        parser.error("--probe-starts and --probe-repeats must be >= 1")
    return args


def run_config(args: argparse.Namespace, algo: str, sigma_mm: float) -> TrainConfig:
    """One arm's configuration: the reach ablation's, at ``--difficulty`` and ``sigma_mm``."""
    return compose(["+experiment=curriculum_ablation", f"algo={algo}",
                    f"task.difficulty={args.difficulty}",
                    f"algo.reset_noise.position_mm={sigma_mm}",
                    f"algo.iterations={args.iterations}", "eval.every_steps=0",
                    f"eval.final_episodes={args.final_episodes}", f"seed={args.seed}",
                    "logger=none", *args.override])


def informative_fraction(run_dir: Path) -> float:
    """Mean of ``rollout/mixed_outcome_fraction`` over the run's iterations."""
    values = [v for _, v in read_metrics(run_dir / "metrics.csv").get(
        "rollout/mixed_outcome_fraction", [])]
    return float(np.mean(values)) if values else float("nan")


def luck_correlation(cfg: TrainConfig, run_dir: Path, args: argparse.Namespace) -> dict:
    """Advantages of the final policy's attempts against their start states' success rates."""
    state = read_checkpoint(run_dir / "checkpoints" / "latest.pt")
    policy = policy_from_state(state)
    trainer = GroupTrainer(cfg, policy)
    trainer.load_state_dict(state["trainer"])
    policy.eval()
    algo, options = cfg.algo, cfg.task.env_options()
    noise = ResetNoise(algo.reset_noise.position_mm / 1000.0, algo.reset_noise.rotation)
    starts = tasks.make(cfg.task.name, **{**options, "obs_mode": "state"})
    jobs = []
    for m in range(args.probe_starts):
        starts.reset(seed=PROBE_SEED + m, options={"difficulty": cfg.task.difficulty})
        generators = [np.random.default_rng([args.seed, m, a]) for a in range(algo.group_size)]
        jobs += [Job(s, m, cfg.task.difficulty)
                 for s in perturbed_snapshots(starts, starts.snapshot(), noise, generators)]
    starts.close()
    engine = RolloutEngine(EngineSpec(cfg.task.name, options, policy_record(policy),
                                      num_envs=len(jobs)))
    with torch.no_grad():
        rollout = engine.run(policy.state_dict(), jobs, algo.temperature, seed=(args.seed, 1))
        rewards = rollout.success.astype(np.float32)
        advantages = trainer.advantages(rollout, rewards).cpu().numpy()
        repeats = [Job(job.snapshot, i, job.difficulty) for i, job in enumerate(jobs)
                   for _ in range(args.probe_repeats)]
        probe = engine.run(None, repeats, algo.temperature, seed=(args.seed, 2))
    engine.close()
    success = probe.success.reshape(len(jobs), args.probe_repeats).mean(axis=1)
    spread = success.reshape(-1, algo.group_size).std(axis=1).mean()
    return {"advantage_luck_correlation": pearson(centred(advantages, algo.group_size),
                                                  centred(success, algo.group_size)),
            "advantage_luck_correlation_pooled": pearson(advantages, success),
            "probe_success": float(success.mean()),
            "probe_within_group_success_std": float(spread)}


def centred(values: np.ndarray, group_size: int) -> np.ndarray:
    """``values`` (A,) minus the mean of their group (groups of ``group_size``, in order)."""
    grouped = values.reshape(-1, group_size)
    return (grouped - grouped.mean(axis=1, keepdims=True)).reshape(-1)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; NaN when either side is constant."""
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def _finite_mean(values: list[float]) -> float:
    """Mean of the finite values (a correlation is NaN where a side was constant); NaN if none."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def figure(rows: list[dict], out: Path) -> Path:
    """Three panels against sigma, one line per estimator: the mean over seeds, and each seed's
    value as a dot when there are several."""
    fig = Figure(figsize=(13, 4), layout="constrained")
    FigureCanvasAgg(fig)
    panels = (("informative_fraction", "informative-group fraction"),
              ("advantage_luck_correlation", "corr(advantage, start success), in-group"),
              ("final_success_rate", "final success (exact resets)"))
    for ax, (key, title) in zip(fig.subplots(1, 3), panels, strict=True):
        for algo in dict.fromkeys(r["algo"] for r in rows):
            mine = [r for r in rows if r["algo"] == algo]
            sigmas = sorted({r["sigma_mm"] for r in mine})
            means = [_finite_mean([r[key] for r in mine if r["sigma_mm"] == s]) for s in sigmas]
            seeds = len({r.get("seed", 0) for r in mine})
            line = ax.plot(sigmas, means, "o-", label=algo if seeds == 1 else
                           f"{algo} (mean of {seeds} seeds)")[0]
            if seeds > 1:
                ax.plot([r["sigma_mm"] for r in mine], [r[key] for r in mine], ".",
                        color=line.get_color(), alpha=0.4)
        ax.set_xlabel("reset noise sigma (mm)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, out)


def run_seed(args: argparse.Namespace, seed: int, out: Path) -> list[dict]:
    """Train every arm of one seed into ``out`` (skipping finished ones) and measure them."""
    args = argparse.Namespace(**{**vars(args), "seed": seed})
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for algo in args.algos:
        for sigma in args.sigmas_mm:
            cfg = run_config(args, algo, sigma)
            run_dir = out / f"{algo}_sigma{sigma:g}"
            if not (run_dir / "summary.json").exists():
                trainers.train(cfg, run_dir)
            summary = json.loads((run_dir / "summary.json").read_text())
            rows.append({"algo": algo, "sigma_mm": sigma, "seed": seed,
                         "informative_fraction": informative_fraction(run_dir),
                         "final_success_rate": summary["success_rate"],
                         "env_steps": summary["env_steps"],
                         **luck_correlation(cfg, run_dir, args)})
            print(json.dumps(rows[-1]))
    write_table(rows, args, out)
    return rows


def write_table(rows: list[dict], args: argparse.Namespace, out: Path) -> None:
    """``study.json`` (the arguments and the rows) and ``study.csv``, each written whole."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "study.json", json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    fields = list(dict.fromkeys(k for row in rows for k in row))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "study.csv", text.getvalue())


def read_rows(path: Path) -> list[dict]:
    """The rows of a ``study.json``, each with its seed (older files name it in ``args``)."""
    study = json.loads(path.read_text())
    seed = int(study["args"].get("seed", 0))
    return [{**row, "seed": row.get("seed", seed)} for row in study["rows"]]


def main(argv: Sequence[str] | None = None) -> Path:
    """Train every arm (skipping finished ones), measure, write the table and the figure.

    Returns:
        Path of the figure.
    """
    args = parse_args(argv)
    if args.combine:
        rows = [row for path in args.combine for row in read_rows(path)]
    elif args.seeds:
        rows = [row for seed in args.seeds
                for row in run_seed(args, seed, args.out / f"seed{seed}")]
    else:
        rows = run_seed(args, args.seed, args.out)
    if args.combine or args.seeds:
        write_table(rows, args, args.out)
    return figure(rows, args.out / "study_reset_noise.png")


if __name__ == "__main__":
    print(main())
