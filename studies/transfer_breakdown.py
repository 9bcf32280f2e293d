"""Which part of a transfer study's held-out domain costs each policy its success.

Reads a folder written by ``studies/transfer_study.py`` (its ``transfer_study.json``: the
held-out domain, the arms' runs and test seeds) and plays every run's final policy (greedy,
the study's test seeds) in the held-out domain with one part of it set back at a time:

* ``held-out``: the domain as the study played it;
* ``physics nominal``: its randomisation off, its imperfections kept;
* ``<imperfection> as trained``: that imperfection at the level the run trained with (0 for a
  run that trained without it), the others kept;
* ``imperfections as trained``: every imperfection as trained, the physics still held out;
* ``nominal``: randomisation and imperfections off.

What a part costs is how much success setting it back returns. The rates are pooled over the
seeds of each arm (Wilson intervals). With ``--expert`` the task's scripted controller plays the
same domains and seeds as a further arm: it reads the true simulator state, so observation
noise never reaches it, and it trained on nothing, so "as trained" sets a part back to off.
Writes ``<out>/transfer_breakdown.json`` and ``<out>/transfer_breakdown.png``. Usage, from
the repository root:

    python studies/transfer_breakdown.py outputs/transfer_study [--episodes 200] [--expert] \\
        [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

import tasks
from harness.checkpoints import evaluate_checkpoint, task_env_factory
from harness.evaluation import evaluate
from harness.runs import resolve_checkpoint
from harness_common.files import write_json
from harness_common.plots import save_figure
from harness_common.stats import wilson_interval

STUDY_FILE = "transfer_study.json"
EXPERT = "scripted expert"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a folder written by transfer_study.py")
    parser.add_argument("--episodes", type=int, default=None,
                        help="test episodes per difficulty, domain and run (default: the study's)")
    parser.add_argument("--expert", action="store_true",
                        help="the task's scripted controller plays the same domains too")
    parser.add_argument("--out", type=Path, default=None, help="default: the study folder")
    args = parser.parse_args(argv)
    if args.episodes is not None and args.episodes < 1:
        parser.error(f"--episodes={args.episodes}; must be >= 1")
    return args


def breakdown_domains(held_out: Mapping[str, Any], trained: Mapping[str, Any]
                      ) -> dict[str, dict[str, Any]]:
    """The domains to play, by name: the held-out domain with one part set back at a time.

    Args:
        held_out: ``{"randomization": {...}, "imperfections": {...}}`` (either block may be
            missing: the run's own is then kept, as ``evaluate_checkpoint`` does).
        trained: The imperfections the run trained with (``{}`` for none).

    Returns:
        ``{name: domain}``, each domain task options over the run's as
        :func:`harness.evaluation.override_task_options` takes them (a block replaces the run's
        whole), in the order of the table.
    """
    randomization = held_out.get("randomization")
    imperfections = held_out.get("imperfections")
    domains: dict[str, dict[str, Any]] = {"held-out": dict(held_out)}
    if randomization:
        domains["physics nominal"] = {**held_out, "randomization": {}}
    if imperfections:
        for name in imperfections:
            reverted = {**imperfections, name: trained.get(name, 0)}
            domains[f"{name} as trained"] = {**held_out, "imperfections": reverted}
        domains["imperfections as trained"] = {**held_out, "imperfections": dict(trained)}
    domains["nominal"] = {"randomization": {}, "imperfections": {}}
    return domains


def read_study(folder: Path) -> dict[str, Any]:
    """The study's JSON.

    Raises:
        FileNotFoundError: No ``transfer_study.json`` in ``folder``, naming it.
        ValueError: A JSON without the held-out domain or the runs.
    """
    path = folder / STUDY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a folder that "
                                "studies/transfer_study.py wrote")
    study = json.loads(path.read_text())
    if "held_out" not in study.get("settings", {}) or not study.get("rows"):
        raise ValueError(f"{path} has no settings.held_out or no rows; is it a transfer study?")
    return study


def play_run(row: Mapping[str, Any], held_out: Mapping[str, Any], episodes: int,
             seed: int) -> dict[str, dict[str, Any]]:
    """Successes of one run's final policy in every domain of :func:`breakdown_domains`."""
    checkpoint = Path(row["run_dir"]) / "checkpoints" / "latest.json"
    _, metadata = resolve_checkpoint(checkpoint)
    trained = metadata["task_options"].get("imperfections") or {}
    out = {}
    for name, domain in breakdown_domains(held_out, trained).items():
        result, _ = evaluate_checkpoint(checkpoint, episodes, seed=seed, task_overrides=domain)
        out[name] = {"successes": result.successes, "episodes": len(result.episodes),
                     "mean_length": result.mean_length, "domain": domain}
    return out


def play_expert(row: Mapping[str, Any], held_out: Mapping[str, Any], episodes: int,
                seed: int) -> dict[str, dict[str, Any]]:
    """Successes of the task's scripted controller in every domain of
    :func:`breakdown_domains` (nothing trained: "as trained" is off), on the task and options
    ``row``'s run was trained with, the same seeds and difficulties as the policies; ``main``
    passes the plain arm's run, whose options hold no imperfection."""
    _, metadata = resolve_checkpoint(Path(row["run_dir"]) / "checkpoints" / "latest.json")
    difficulties = metadata.get("evaluation", {}).get("difficulties") or [
        metadata["task_options"].get("difficulty", 1.0)]
    out = {}
    for name, domain in breakdown_domains(held_out, {}).items():
        factory = task_env_factory(metadata, task_overrides=domain)
        envs: list[Any] = []

        def make_env(factory=factory, envs=envs):
            envs.append(factory())
            return envs[-1]

        def expert(observation, envs=envs):
            return tasks.ScriptedExpert(envs[-1])(observation)

        result = evaluate(expert, make_env, episodes, difficulties, seed)
        out[name] = {"successes": result.successes, "episodes": len(result.episodes),
                     "mean_length": result.mean_length, "domain": domain}
    return out


def pool(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per domain, the successes of an arm's runs added up, with the Wilson interval."""
    out = {}
    for name in runs[0]["domains"]:
        successes = sum(r["domains"][name]["successes"] for r in runs)
        trials = sum(r["domains"][name]["episodes"] for r in runs)
        out[name] = {"success": successes / trials, "successes": successes, "episodes": trials,
                     "interval": list(wilson_interval(successes, trials))}
    return out


def figure(arms: Mapping[str, Mapping[str, Any]], title: str, out: Path) -> Path:
    """One row per domain, one bar per arm, with the Wilson intervals."""
    names = list(next(iter(arms.values())))
    fig = Figure(figsize=(8, 0.25 * len(names) * len(arms) + 1.2), layout="constrained")
    axis = fig.subplots()
    height = 0.8 / len(arms)
    for i, (arm, pooled) in enumerate(arms.items()):
        y = [row + (i - (len(arms) - 1) / 2) * height for row in range(len(names))]
        values = [pooled[n]["success"] for n in names]
        errors = [[max(v - pooled[n]["interval"][0], 0.0) for n, v in zip(names, values,
                                                                           strict=True)],
                  [max(pooled[n]["interval"][1] - v, 0.0) for n, v in zip(names, values,
                                                                           strict=True)]]
        axis.barh(y, values, height * 0.95, xerr=errors, capsize=3, color=f"C{i}", label=arm)
        for yi, v in zip(y, values, strict=True):
            axis.text(0.01, yi, f"{v:.3f}", va="center", fontsize=8, color="white")
    axis.set_yticks(range(len(names)), names)
    axis.invert_yaxis()
    axis.set_xlim(0, 1.05)
    axis.set_xlabel("test success (greedy), pooled over seeds, 95% Wilson")
    fig.legend(loc="outside lower center", ncol=len(arms), fontsize=8)
    axis.grid(axis="x", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, out)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Play every run of the study in every domain, pool per arm, write the JSON and figure.

    Raises:
        FileNotFoundError, ValueError: Not a transfer study folder (see :func:`read_study`).
    """
    args = parse_args(argv)
    study = read_study(args.study)
    settings = study["settings"]
    episodes = args.episodes or settings["episodes_per_domain"]
    runs = []
    for row in study["rows"]:
        domains = play_run(row, settings["held_out"], episodes, settings["test_seed"])
        runs.append({"arm": row["arm"], "seed": row["seed"], "run_dir": row["run_dir"],
                     "domains": domains})
        print(f"{row['arm']} seed {row['seed']}: " + ", ".join(
            f"{name} {d['successes'] / d['episodes']:.3f}" for name, d in domains.items()),
            flush=True)
    if args.expert:
        plain = next((r for r in study["rows"] if r["arm"] == "plain"), study["rows"][0])
        domains = play_expert(plain, settings["held_out"], episodes, settings["test_seed"])
        runs.append({"arm": EXPERT, "seed": None, "run_dir": None, "domains": domains})
    arms = {arm: pool([r for r in runs if r["arm"] == arm])
            for arm in dict.fromkeys(r["arm"] for r in runs)}
    out = args.out or args.study
    out.mkdir(parents=True, exist_ok=True)
    result = {"study": str(args.study), "episodes_per_run": episodes,
              "test_seed": settings["test_seed"], "held_out": settings["held_out"],
              "arms": arms, "runs": runs}
    write_json(out / "transfer_breakdown.json", result)
    title = (f"{settings['task']}, {settings['algo']}, {settings['total_timesteps']:,} steps, "
             f"seeds {sorted({r['seed'] for r in study['rows']})}: the held-out domain, one part "
             "set back at a time")
    figure(arms, title, out / "transfer_breakdown.png")
    return result


if __name__ == "__main__":
    try:
        result = main()
    except (FileNotFoundError, ValueError) as error:
        print(f"transfer_breakdown.py: {error}", file=sys.stderr)
        sys.exit(1)
    names = list(next(iter(result["arms"].values())))
    width = max(len(n) for n in names)
    print(f"{'domain':{width}s}  " + "  ".join(f"{arm:>24s}" for arm in result["arms"]))
    for name in names:
        cells = ["{:.3f} [{:.3f}, {:.3f}]".format(arms[name]["success"], *arms[name]["interval"])
                 for arms in result["arms"].values()]
        print(f"{name:{width}s}  " + "  ".join(f"{c:>24s}" for c in cells))
