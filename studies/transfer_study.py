"""Study: sim-to-sim transfer, with and without automatic domain randomisation and imperfections.

Two arms train with the same seed, task, algorithm and budget (``total_timesteps`` env steps):

* ``plain``: the nominal world only;
* ``adr+imperfections``: every training episode plays the imperfection wrappers
  (``--train-imperfections``: action noise, latency, control jitter, observation noise), and ADR
  widens the physical ranges the task has (among friction, mass, damping and object size),
  within ``--adr-bounds`` (default :data:`ADR_BOUNDS`); with ``--adr-noise`` also the scales of
  the continuous imperfections the arm trains with (action noise, control jitter, observation
  noise; a scale multiplies the configured level), within :data:`ADR_NOISE_BOUNDS`.

Each arm's final policy (``checkpoints/latest``, greedy) is then evaluated on the same test
seeds (the run's ``eval.seed``, ``--episodes`` of them) in two domains
(``harness.checkpoints.evaluate_checkpoint(task_overrides=...)``):

* **nominal**: randomisation and imperfections off;
* **held-out**: ``--held-out`` (default :data:`HELD_OUT`): randomisation ranges wider than ADR's
  bounds on both sides, and stronger imperfections, latency included, than the robust arm
  trained with: noise levels twice the trained ones, a scale of 2 that ADR's noise bounds (at
  most 1.6) never reach.

A randomised reset draws its parameters before the start state, so the two domains see the same
seeds but not the same start states: the two success rates are independent samples, and the
ratio held-out / nominal gets the MOVER-R interval of two independent proportions
(:func:`ratio_interval`). The target (``--target``, 0.9) asks the robust arm to keep that share of
its nominal success.

Writes ``<out>/<arm>_seed<s>/`` (the runs; a finished one is not trained again),
``<out>/transfer_study.json`` and ``<out>/transfer_study.png``. Usage, from the repository root:

    python studies/transfer_study.py --out outputs/transfer_study --seeds 0 \\
        --total-timesteps 150000 --episodes 200 --override task=reach algo=ppo \\
        task.max_episode_steps=25
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure

import tasks
from harness import trainers
from harness.checkpoints import evaluate_checkpoint
from harness.config import ConfigError, TrainConfig, compose
from harness.evaluation import override_task_options
from harness_common.files import read_metrics, write_json
from harness_common.plots import save_figure
from harness_common.stats import wilson_interval
from tasks.wrappers import SCALABLE

ARMS = ("plain", "adr+imperfections")
# ADR's hard bounds in training (it starts at [1, 1] and widens by adr.params.<range>.step):
# scales of the physical ranges, and with --adr-noise of the imperfection levels of
# TRAIN_IMPERFECTIONS (below the held-out domain's scale of 2, so that it stays unseen).
ADR_BOUNDS = {"friction": (0.7, 1.4), "mass": (0.7, 1.4), "damping": (0.7, 1.4),
              "object_size": (0.85, 1.15)}
ADR_NOISE_BOUNDS = {"action_noise": (0.5, 1.6), "control_jitter": (0.5, 1.6),
                    "observation_noise": (0.5, 1.6)}
TRAIN_IMPERFECTIONS = {"action_noise": 0.15, "action_latency": 2, "control_jitter": 0.15,
                       "observation_noise": 0.005}
# Beyond ADR's bounds on both sides, a latency never trained on, noise twice as strong.
HELD_OUT = {
    "randomization": {"enabled": True, "friction": [0.4, 2.0], "mass": [0.4, 2.0],
                      "damping": [0.4, 2.0], "object_size": [0.75, 1.3]},
    "imperfections": {"action_noise": 0.3, "action_latency": 3, "control_jitter": 0.3,
                      "observation_noise": 0.01},
}
NOMINAL: dict[str, dict[str, Any]] = {"randomization": {}, "imperfections": {}}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--held-out``, ``--adr-bounds`` and ``--train-imperfections`` take
    ``key=value`` items whose values are YAML (``randomization.friction=[0.3,2.0]``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/transfer_study"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--total-timesteps", type=int, default=150_000)
    parser.add_argument("--episodes", type=int, default=200, help="test episodes per domain")
    parser.add_argument("--target", type=float, default=0.9, help="held-out / nominal to keep")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides, both arms")
    parser.add_argument("--adr-noise", action="store_true",
                        help="ADR also scales the noise levels the robust arm trains with "
                             "(ADR_NOISE_BOUNDS)")
    parser.add_argument("--adr-bounds", nargs="*", default=None, metavar="RANGE=[MIN,MAX]",
                        help="ADR's ranges and bounds (default: ADR_BOUNDS, the ranges the task "
                             "has; with --adr-noise also ADR_NOISE_BOUNDS)")
    parser.add_argument("--train-imperfections", nargs="*", default=None, metavar="KEY=VALUE",
                        help="task.imperfections of the robust arm (default: "
                             "TRAIN_IMPERFECTIONS)")
    parser.add_argument("--held-out", nargs="*", default=None, metavar="BLOCK.KEY=VALUE",
                        help="the held-out domain (default: HELD_OUT); its randomisation "
                             "block is on")
    args = parser.parse_args(argv)
    if args.total_timesteps < 1 or args.episodes < 1:
        parser.error(f"--total-timesteps={args.total_timesteps} and --episodes="
                     f"{args.episodes} must be >= 1")
    if not 0 < args.target <= 1:
        parser.error(f"--target={args.target}; expected a fraction in (0, 1]")
    return args


def key_values(items: Sequence[str], what: str) -> dict[str, Any]:
    """``["a=1", "b.c=[1,2]"]`` -> ``{"a": 1, "b": {"c": [1, 2]}}`` (values parsed as YAML).

    Raises:
        ValueError: An item without ``=``, naming it and ``what``.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what}: {item!r} is not key=value")
        *parents, leaf = key.split(".")
        node = out
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = yaml.safe_load(text)
    return out


def ratio_interval(successes: int, trials: int, reference_successes: int,
                   reference_trials: int) -> tuple[float, float, float]:
    """Ratio of two independent proportions ``p1 / p0`` with its 95% MOVER-R interval.

    The method of variance estimates recovery for a ratio (MOVER-R: Donner & Zou 2012,
    "Closed-form confidence intervals for functions of the normal mean and standard
    deviation", Stat. Methods Med. Res. 21(4); Newcombe 2013, "Confidence Intervals for
    Proportions and Related Measures of Effect Size"), with Wilson intervals ``(l1, u1)`` of
    ``p1`` and ``(l0, u0)`` of ``p0``,

        L = (p1 p0 - sqrt((p1 p0)^2 - l1 u0 (2 p1 - l1)(2 p0 - u0))) / (u0 (2 p0 - u0))
        U = (p1 p0 + sqrt((p1 p0)^2 - u1 l0 (2 p1 - u1)(2 p0 - l0))) / (l0 (2 p0 - l0))

    Unlike the log (Katz) interval it stays informative at 0 or 100% success (100/100 over
    100/100 gives [0.963, 1.038]).

    Args:
        successes, trials: The numerator's outcomes (held-out domain).
        reference_successes, reference_trials: The denominator's (nominal domain).

    Returns:
        ``(ratio, low, high)``; all NaN when ``p0`` is 0 (no ratio to speak of), ``high`` inf
        when its Wilson lower bound is 0.
    """
    p1, p0 = successes / trials, reference_successes / reference_trials
    if p0 == 0:
        return math.nan, math.nan, math.nan
    l1, u1 = wilson_interval(successes, trials)
    l0, u0 = wilson_interval(reference_successes, reference_trials)
    low = ((p1 * p0 - math.sqrt(max((p1 * p0) ** 2 - l1 * u0 * (2 * p1 - l1) * (2 * p0 - u0),
                                    0.0)))
           / (u0 * (2 * p0 - u0)))
    denominator = l0 * (2 * p0 - l0)
    high = ((p1 * p0 + math.sqrt(max((p1 * p0) ** 2 - u1 * l0 * (2 * p1 - u1) * (2 * p0 - l0),
                                     0.0)))
            / denominator) if denominator > 0 else math.inf
    return p1 / p0, max(low, 0.0), high


def arm_config(args: argparse.Namespace, arm: str, seed: int) -> TrainConfig:
    """One arm's configuration: ``--override`` for both, ADR and imperfections for the robust.

    Raises:
        ConfigError: A bad override, ADR range or imperfection, naming the value.
    """
    overrides = [*args.override, f"seed={seed}", f"total_timesteps={args.total_timesteps}",
                 "eval.every_steps=0", "eval.final_episodes=20", "logger=none"]
    if arm == "plain":
        return compose(overrides)
    task = compose(overrides).task.name
    imperfections = (key_values(args.train_imperfections, "--train-imperfections")
                     if args.train_imperfections is not None else TRAIN_IMPERFECTIONS)
    bounds = (key_values(args.adr_bounds, "--adr-bounds") if args.adr_bounds is not None
              else adr_defaults(task, imperfections if args.adr_noise else {}))
    robust = [f"+adr.params.{name}.bounds={hydra_value(value)}" for name, value in
              bounds.items()]
    robust += [f"+task.imperfections.{key}={hydra_value(value)}"
               for key, value in imperfections.items()]
    return compose([*overrides, "adr.enabled=true", *robust])


def hydra_value(value: Any) -> str:
    """``value`` as a Hydra override's value (JSON: ``[0.7,1.4]``, ``true``, ``0.1``)."""
    return json.dumps(list(value) if isinstance(value, tuple) else value, separators=(",", ":"))


def adr_defaults(task: str, imperfections: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """The :data:`ADR_BOUNDS` of the ranges ``task``'s scene has (reach: no mass, no size) and
    the :data:`ADR_NOISE_BOUNDS` of the scalable imperfections that are on in ``imperfections``
    (pass ``{}`` for none)."""
    env = tasks.make(task)
    present = set(env.unwrapped.randomization_ranges())
    env.close()
    present |= {name for name in SCALABLE if imperfections.get(name, 0)}
    return {name: bounds for name, bounds in {**ADR_BOUNDS, **ADR_NOISE_BOUNDS}.items()
            if name in present}


def held_out_domain(args: argparse.Namespace, cfg: TrainConfig) -> dict[str, Any]:
    """The held-out domain, validated against the task (``override_task_options``).

    Raises:
        ValueError: An unknown option or field, a bad value (a range with low > high) or an
            option that changes what the policy sees (``obs_mode``, ``camera``, ``image_size``),
            naming it.
    """
    domain = (key_values(args.held_out, "--held-out") if args.held_out is not None
              else HELD_OUT)
    domain = {key: dict(value) if isinstance(value, Mapping) else value
              for key, value in domain.items()}
    if isinstance(domain.get("randomization"), dict):
        domain["randomization"] = {"enabled": True, **domain["randomization"]}
    override_task_options(cfg.task.name, cfg.task.env_options(), domain)
    return domain


def evaluate_arm(run_dir: Path, args: argparse.Namespace,
                 held_out: Mapping[str, Any]) -> dict[str, Any]:
    """The final policy on the nominal and held-out domains, same seeds, and the ratio."""
    checkpoint = run_dir / "checkpoints" / "latest.json"
    row: dict[str, Any] = {}
    for name, domain in (("nominal", NOMINAL), ("held_out", held_out)):
        result, _ = evaluate_checkpoint(checkpoint, args.episodes, task_overrides=domain)
        row[f"{name}_successes"] = result.successes
        row[f"{name}_success"] = result.success_rate
        row[f"{name}_interval"] = list(result.success_interval)
        row[f"{name}_mean_length"] = result.mean_length
    row["episodes"] = args.episodes
    row.update(ratio_entries(row["held_out_successes"], args.episodes,
                             row["nominal_successes"], args.episodes))
    return row


def ratio_entries(successes: int, trials: int, reference_successes: int,
                  reference_trials: int) -> dict[str, Any]:
    """``ratio`` and ``ratio_interval`` for the JSON: ``None`` (null) where there is no ratio
    (no nominal success)."""
    ratio, low, high = ratio_interval(successes, trials, reference_successes, reference_trials)
    if math.isnan(ratio):
        return {"ratio": None, "ratio_interval": None}
    return {"ratio": ratio, "ratio_interval": [low, high]}


def final_adr_ranges(run_dir: Path) -> dict[str, list[float]]:
    """The ADR ranges at the end of training (``adr/<range>_low|high``; empty without ADR)."""
    series = read_metrics(run_dir / "metrics.csv")
    names = sorted({key[4:].rsplit("_", 1)[0] for key in series if key.startswith("adr/")})
    return {name: [series[f"adr/{name}_low"][-1][1], series[f"adr/{name}_high"][-1][1]]
            for name in names}


def pooled(rows: list[dict[str, Any]], arm: str, target: float) -> dict[str, Any]:
    """One arm's outcomes over its seeds, pooled, and whether it meets ``target``."""
    mine = [r for r in rows if r["arm"] == arm]
    trials = sum(r["episodes"] for r in mine)
    out: dict[str, Any] = {"seeds": [r["seed"] for r in mine], "episodes_per_domain": trials}
    for name in ("nominal", "held_out"):
        successes = sum(r[f"{name}_successes"] for r in mine)
        out[f"{name}_success"] = successes / trials
        out[f"{name}_interval"] = list(wilson_interval(successes, trials))
    out.update(ratio_entries(sum(r["held_out_successes"] for r in mine), trials,
                             sum(r["nominal_successes"] for r in mine), trials))
    out["target_met"] = out["ratio"] is not None and out["ratio"] >= target
    return out


def figure(arms: Mapping[str, Mapping[str, Any]], target: float, title: str, out: Path) -> Path:
    """Left: nominal and held-out success per arm with Wilson intervals; right: the ratio with
    its MOVER-R interval against the target."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    names = list(arms)
    for offset, (domain, label, colour) in enumerate((("nominal", "nominal domain", "C0"),
                                                      ("held_out", "held-out domain", "C1"))):
        x = [i + (offset - 0.5) * 0.38 for i in range(len(names))]
        values = [arms[a][f"{domain}_success"] for a in names]
        # max(0, ...): a Wilson bound at 0 or 1 may miss the rate by a rounding error.
        errors = [[max(v - arms[a][f"{domain}_interval"][0], 0.0) for a, v in
                   zip(names, values, strict=True)],
                  [max(arms[a][f"{domain}_interval"][1] - v, 0.0) for a, v in
                   zip(names, values, strict=True)]]
        left.bar(x, values, 0.36, yerr=errors, capsize=5, color=colour, label=label)
        for xi, v, err in zip(x, values, errors[1], strict=True):
            left.text(xi + 0.02, v + err + 0.015, f"{v:.2f}", ha="center", fontsize=9)
    left.set_xticks(range(len(names)), names)
    left.set_ylim(0, 1.12)
    left.set_ylabel("test success (greedy), 95% Wilson")
    left.legend(loc="lower right", fontsize=8)
    left.grid(axis="y", alpha=0.3)
    for i, arm in enumerate(names):
        ratio = arms[arm]["ratio"]
        if ratio is None:
            right.text(i, target / 2, "no nominal\nsuccess", ha="center", fontsize=9)
            continue
        low, high = arms[arm]["ratio_interval"]
        right.errorbar([i], [ratio], yerr=[[max(ratio - low, 0.0)],
                                           [max(min(high, 2.0) - ratio, 0.0)]],
                       fmt="o", capsize=6, color=f"C{i + 2}")
        right.text(i + 0.08, ratio, f"{ratio:.2f}", va="center", fontsize=9)
    right.axhline(target, color="grey", linestyle="--", label=f"target {target:g}")
    right.set_xticks(range(len(names)), names)
    right.set_xlim(-0.5, len(names) - 0.5)
    right.set_ylabel("held-out / nominal success, 95% MOVER-R")
    right.legend(loc="lower right", fontsize=8)
    right.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, out)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Check every input, train each arm and seed (skipping finished runs), evaluate both
    domains, write the JSON and the figure.

    Returns:
        The study's JSON content.

    Raises:
        ConfigError, ValueError: A bad override, ADR range, imperfection or held-out domain
            (before anything trains), naming the value.
    """
    args = parse_args(argv)
    configs = {(arm, seed): arm_config(args, arm, seed) for seed in args.seeds for arm in ARMS}
    held_out = held_out_domain(args, configs[ARMS[0], args.seeds[0]])
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds:
        for arm in ARMS:
            run_dir = args.out / f"{arm.replace('+', '_')}_seed{seed}"
            if not (run_dir / "summary.json").exists():
                trainers.train(configs[arm, seed], run_dir)
            summary = json.loads((run_dir / "summary.json").read_text())
            rows.append({"arm": arm, "seed": seed, "run_dir": str(run_dir),
                         "env_steps": summary["env_steps"],
                         "train_wall_clock_s": summary["wall_clock_s"],
                         "adr_final_ranges": final_adr_ranges(run_dir),
                         **evaluate_arm(run_dir, args, held_out)})
            print(f"{arm} seed {seed}: nominal {rows[-1]['nominal_success']:.3f}, held-out "
                  f"{rows[-1]['held_out_success']:.3f}", flush=True)
    cfg = configs[ARMS[1], args.seeds[0]]
    arms = {arm: pooled(rows, arm, args.target) for arm in ARMS}
    study = {
        "settings": {"task": cfg.task.name, "difficulty": cfg.task.difficulty,
                     "algo": cfg.algo.name, "total_timesteps": args.total_timesteps,
                     "seeds": args.seeds, "episodes_per_domain": args.episodes,
                     "test_seed": cfg.eval.seed, "target": args.target,
                     "override": args.override,
                     "adr_bounds": {name: p.bounds for name, p in cfg.adr.params.items()},
                     "train_imperfections": cfg.task.imperfections,
                     "held_out": held_out, "argv": list(sys.argv[1:] if argv is None else argv)},
        "arms": arms,
        "rows": rows,
    }
    write_json(args.out / "transfer_study.json", study)
    limit = (f", {cfg.task.max_episode_steps}-step episodes" if cfg.task.max_episode_steps
             else "")
    title = (f"{cfg.task.name} (difficulty {cfg.task.difficulty:g}{limit}), {cfg.algo.name}, "
             f"{args.total_timesteps:,} steps, seeds {args.seeds}, {args.episodes} test "
             "episodes per domain and seed")
    figure(arms, args.target, title, args.out / "transfer_study.png")
    return study


if __name__ == "__main__":
    try:
        result = main()
    except (ConfigError, ValueError) as error:
        print(f"transfer_study.py: {error}", file=sys.stderr)
        sys.exit(1)
    for arm_name, arm in result["arms"].items():
        ratio = "n/a" if arm["ratio"] is None else "{:.3f} [{:.3f}, {:.3f}]".format(
            arm["ratio"], *arm["ratio_interval"])
        print("{}: nominal {:.3f} [{:.3f}, {:.3f}], held-out {:.3f} [{:.3f}, {:.3f}], ratio {}, "
              "target {}".format(arm_name, arm["nominal_success"], *arm["nominal_interval"],
                                 arm["held_out_success"], *arm["held_out_interval"], ratio,
                                 "met" if arm["target_met"] else "missed"))
