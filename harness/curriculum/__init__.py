"""Difficulty curricula: choose how hard the next episode is, learn from its outcome.

Difficulty is a float in [0, 1] that tasks map onto their level parameters (spawn ranges, goal
distance, distractors, randomisation ranges). Every curriculum has the same small surface:

* ``sample() -> float``: the difficulty of the next group (or episode);
* ``update(difficulty, successes)``: the binary (or fractional) outcomes observed there;
* ``metrics() -> dict[str, float]``: ``curriculum/...`` keys for the run loop to log;
* ``state_dict()`` / ``load_state_dict(state)``: plain JSON-able dicts, RNG included, so that a
  resumed run samples exactly what the uninterrupted run would have.

Why a success band: a group of G attempts at a start state whose success probability is p gives
GRPO a learning signal only when its outcomes are not all equal, which happens with probability
``signal_probability(p, G) = 1 - p**G - (1 - p)**G``. That is near zero when p is near 0 or 1, so
``success_band`` spends its samples where p is mid-range and widens the range of difficulties as
the policy improves (in the spirit of ADR, Akkaya et al. 2019, and of DAPO's dynamic sampling).

Build one with ``make(name, **params)``, and ADR with ``make_adr(config.adr, seed)``. The
modules: :mod:`~harness.curriculum.table` (the per-bin success table and the signal
probability), :mod:`~harness.curriculum.base` (the shared surface),
:mod:`~harness.curriculum.schedules` (``fixed``, ``uniform``, ``linear``) and
:mod:`~harness.curriculum.success_band`. Alongside the difficulty curriculum,
:mod:`~harness.curriculum.adr` widens and narrows the randomisation ranges (automatic domain
randomisation), with its own ``sample``/``update``/``metrics``/``state_dict``.
"""

from __future__ import annotations

import inspect
from typing import Any

from harness.curriculum.adr import (
    AdrEpisode,
    AdrParameter,
    AutomaticDomainRandomization,
    NextResetOptions,
    make_adr,
)
from harness.curriculum.base import Curriculum
from harness.curriculum.schedules import FixedCurriculum, LinearCurriculum, UniformCurriculum
from harness.curriculum.success_band import SuccessBandCurriculum
from harness.curriculum.table import SuccessTable, no_signal_probability, signal_probability

__all__ = [
    "CURRICULA",
    "AdrEpisode",
    "AdrParameter",
    "AutomaticDomainRandomization",
    "Curriculum",
    "FixedCurriculum",
    "LinearCurriculum",
    "NextResetOptions",
    "SuccessBandCurriculum",
    "SuccessTable",
    "UniformCurriculum",
    "make",
    "make_adr",
    "no_signal_probability",
    "signal_probability",
]

CURRICULA: dict[str, type[Curriculum]] = {
    "fixed": FixedCurriculum,
    "uniform": UniformCurriculum,
    "linear": LinearCurriculum,
    "success_band": SuccessBandCurriculum,
}


def make(name: str, **params: Any) -> Curriculum:
    """Build the curriculum ``name`` from keyword parameters.

    Args:
        name: One of ``CURRICULA``: ``fixed``, ``uniform``, ``linear``, ``success_band``.
        **params: Parameters of the curriculum class, including ``seed``.

    Returns:
        The curriculum.

    Raises:
        ValueError: If ``name`` or a parameter name is unknown, or a parameter value is out of
            range.
    """
    if name not in CURRICULA:
        raise ValueError(f"unknown curriculum {name!r}; choose one of {sorted(CURRICULA)}")
    cls = CURRICULA[name]
    accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for curriculum {name!r}; expected some of {accepted}"
        )
    return cls(**params)
