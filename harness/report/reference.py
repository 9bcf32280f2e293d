"""The comparison of every arm with a reference arm (``--reference algo=grpo``).

For an algorithm or recipe comparison the question is not only each arm's final success but
whether it beats the reference and at what cost. Per arm this section gives:

* ``P(arm > reference)``: the probability that a run of the arm scores higher than a run of the
  reference (Agarwal et al. 2021; ties count half) with its bootstrap interval
  (:func:`harness.report.statistics.probability_of_improvement`);
* the paired difference on the seeds both arms ran: with the same seed every arm starts from the
  same cloned policy and the same test episodes, so ``arm - reference`` per seed removes the
  seed's own difficulty; its mean with a percentile bootstrap interval over seeds, and the wins,
  ties and losses;
* the median environment steps and wall clock of a run, and the wall clock relative to the
  reference's.

The reference defaults to the arm ``algo=grpo`` when the sweep has one (the group estimators'
default); a named reference that is not an arm is refused with the arms listed.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np

from harness.report.reading import Arm, ReportError
from harness.report.sections import _table
from harness.report.statistics import CONFIDENCE, probability_of_improvement

DEFAULT_REFERENCE = "algo=grpo"


def pick_reference(arms: dict[str, Arm], reference: str | None) -> str | None:
    """The reference arm's name: ``reference`` when it is an arm, ``algo=grpo`` when it is not
    given and the sweep has that arm, else ``None`` (no section).

    Raises:
        ReportError: ``reference`` names no arm (the arms are listed).
    """
    if reference is None:
        return DEFAULT_REFERENCE if DEFAULT_REFERENCE in arms and len(arms) > 1 else None
    if reference not in arms:
        raise ReportError(f"reference={reference!r} is not an arm of this sweep; the arms are "
                          f"{sorted(arms)}")
    return reference


def paired_difference(arm: Arm, reference: Arm, metric: str, reps: int,
                      seed: int) -> tuple[float, float, float, list[int]] | None:
    """Mean over shared seeds of ``arm - reference`` with a percentile bootstrap interval
    over seeds, and the per-seed signs; ``None`` when they share no seed.

    Returns:
        ``(mean, low, high, signs)``, signs being +1, 0 or -1 per shared seed in seed order.
    """
    ours = {run.seed: float(run.summary[metric]) for run in arm.runs if run.seed is not None}
    theirs = {run.seed: float(run.summary[metric]) for run in reference.runs
              if run.seed is not None}
    shared = sorted(set(ours) & set(theirs))
    if not shared:
        return None
    differences = np.array([ours[s] - theirs[s] for s in shared])
    rng = np.random.default_rng(seed)
    means = differences[rng.integers(0, len(differences), (reps, len(differences)))].mean(axis=1)
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    signs = [int(np.sign(d)) for d in differences]
    return float(differences.mean()), float(low), float(high), signs


def reference_section(arms: dict[str, Arm], reference: str | None, metric: str, reps: int,
                      seed: int, out: Path, plots: ModuleType) -> list[str]:
    """The section comparing every arm with the reference, and its figure (empty when there
    is no reference; see :func:`pick_reference`)."""
    name = pick_reference(arms, reference)
    if name is None:
        return []
    base = arms[name]
    base_scores = [float(r.summary[metric]) for r in base.runs]
    base_clock = _median(base, "wall_clock_s")
    rows, estimates, points = [], {}, {}
    for label, arm in arms.items():
        scores = [float(r.summary[metric]) for r in arm.runs]
        clock = _median(arm, "wall_clock_s")
        relative = f"{clock / base_clock:.2f}×" if base_clock else "n/a"
        if label == name:
            rows.append([f"`{label}` (reference)", len(arm.runs), "", "", "",
                         f"{_median(arm, 'env_steps'):,.0f}", f"{clock:,.0f}", relative])
            continue
        chance = probability_of_improvement(scores, base_scores, reps, seed)
        estimates[label] = (chance.point, chance.low, chance.high)
        points[label] = []
        paired = paired_difference(arm, base, metric, reps, seed)
        if paired is None:
            difference, record = "no shared seed", ""
        else:
            mean, low, high, signs = paired
            difference = f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"
            record = f"{signs.count(1)} / {signs.count(0)} / {signs.count(-1)}"
        rows.append([f"`{label}`", len(arm.runs),
                     f"{chance.point:.2f} [{chance.low:.2f}, {chance.high:.2f}]", difference,
                     record, f"{_median(arm, 'env_steps'):,.0f}", f"{clock:,.0f}", relative])
    figure = out / "plots" / "improvement_over_reference.png"
    plots.interval_estimates(estimates, points, figure, arms=[a for a in arms if a != name],
                             xlabel=f"P(arm > {name}) on final {metric}: point (|), 95% CI (bar)",
                             title=f"Probability of improvement over {name}")
    header = ["arm", "runs", "P(arm > reference) [95% CI]",
              "paired difference, mean over shared seeds [95% CI]", "seeds won / tied / lost",
              "env steps (median run)", "wall clock s (median run)", "wall clock vs reference"]
    return [
        f"## Against the reference arm `{name}`", "",
        _table(header, rows), "",
        f"P(arm > reference): the chance that a run of the arm ends with a higher final "
        f"`{metric}` than a run of the reference, ties counting half, with a bootstrap interval "
        "(runs resampled on each side). The paired difference uses the seeds both arms ran "
        "(the same seed starts every arm from the same cloned policy and plays the same test "
        "episodes); its interval resamples those seeds. Wall clock depends on the machine and on "
        "what else ran beside each job.", "",
        "![improvement over the reference](plots/improvement_over_reference.png)", "",
    ]


def _median(arm: Arm, key: str) -> float:
    values = [float(run.summary.get(key, 0.0) or 0.0) for run in arm.runs]
    return float(np.median(values)) if values else 0.0
