"""What a group run's summary says against its start policy.

The start policy (the behaviour-cloned one in the main job) is evaluated greedy and sampled on
the validation seeds, which choose its better decoding (:func:`better_decoding`), and greedy and
sampled on the test seeds, which the final policy plays too. :func:`paired_gains` then gives the
final greedy policy's paired gain on the test seeds twice: against the start's greedy decoding
(``improvement``) and against its better one (``improvement_vs_best_start``). A cloned policy
often scores higher sampled than greedy, so the greedy gain alone can flatter fine-tuning; the
better decoding is chosen on the validation seeds so that the test seeds the gain pairs choose
nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from harness.evaluation import EvaluationResult
from harness_common.stats import paired_summary

log = logging.getLogger(__name__)

DECODINGS: tuple[str, ...] = ("greedy", "sampled")
# The paired figures the run also logs, as ``final/<key>``, at its last step.
LOGGED: tuple[str, ...] = ("improvement", "improvement_p_value", "improvement_vs_best_start",
                           "improvement_vs_best_start_p_value")


def better_decoding(greedy: EvaluationResult, sampled: EvaluationResult) -> str:
    """The start policy's better decoding on the validation seeds.

    Args:
        greedy: The start policy's greedy evaluation on the validation seeds.
        sampled: Its sampled evaluation on the same seeds.

    Returns:
        ``"sampled"`` when its success rate is strictly higher, else ``"greedy"`` (a tie keeps
        the decoding of the reported figure).
    """
    return "sampled" if sampled.success_rate > greedy.success_rate else "greedy"


def paired_gains(final: Sequence[bool], start: dict[str, Sequence[bool]],
                 decoding: str | None,
                 start_validation: dict[str, float] | None = None) -> dict[str, Any]:
    """The final greedy policy's paired gains over the start policy on the test seeds.

    Args:
        final: Per test episode, the final greedy policy's success.
        start: Per decoding (``"greedy"``, ``"sampled"``), the start policy's successes on the
            same test episodes; a decoding may be missing or empty (a run resumed from a
            checkpoint that did not keep it).
        decoding: The start's better decoding chosen on the validation seeds
            (:func:`better_decoding`), or ``None`` when it was not evaluated there: then only
            the greedy gain is given.
        start_validation: The start's validation success rate per decoding, reported beside
            ``decoding``.

    Returns:
        ``improvement``, ``improvement_interval``, ``improvement_p_value`` and ``discordant``
        (:func:`harness_common.stats.paired_summary`, final greedy against start greedy), and
        with ``decoding``: ``best_start_decoding``, ``improvement_vs_best_start`` with its
        ``_interval``, ``_p_value`` and ``discordant_vs_best_start`` (final greedy against the
        start's ``decoding``), and the start's validation success rates. Empty when the start
        did not play the same number of test episodes (no pairs).

    Raises:
        ValueError: ``decoding`` is not ``None`` nor one of :data:`DECODINGS`.
    """
    if decoding is not None and decoding not in DECODINGS:
        raise ValueError(f"decoding={decoding!r}; expected one of {DECODINGS} or None")
    if len(start.get("greedy", ())) != len(final):  # pairs need the same test seeds
        return {}
    gains = paired_summary(start["greedy"], final)
    baseline = start.get(decoding, ()) if decoding is not None else ()
    if len(baseline) != len(final):
        return gains
    best = paired_summary(baseline, final)
    validation = start_validation or {}
    return {
        **gains, "best_start_decoding": decoding,
        "improvement_vs_best_start": best["improvement"],
        "improvement_vs_best_start_interval": best["improvement_interval"],
        "improvement_vs_best_start_p_value": best["improvement_p_value"],
        "discordant_vs_best_start": best["discordant"],
        **{f"start_validation_{name}success_rate": validation[key]
           for key, name in (("greedy", ""), ("sampled", "sampled_")) if key in validation},
    }


class StartBaseline:
    """The start policy's figures that the final policy is paired with, kept in the checkpoint
    (:data:`harness.algos.group.checkpoints.RESUME_KEYS`) so that a resumed run reports them.

    Attributes:
        outcomes: Per decoding, the start policy's success per test episode.
        validation: Per decoding, its success rate on the validation seeds; ``None`` until
            :meth:`choose_decoding`, or after a resume from a checkpoint that did not keep it.
        decoding: Its better decoding there (:func:`better_decoding`), or ``None`` likewise.
    """

    def __init__(self) -> None:
        self.outcomes: dict[str, list[bool]] = {"greedy": [], "sampled": []}
        self.validation: dict[str, float] | None = None
        self.decoding: str | None = None

    def choose_decoding(self, greedy: EvaluationResult, sampled: EvaluationResult) -> None:
        """Keep the start's validation figures, greedy and ``sampled``, and the better
        decoding they choose."""
        self.validation = {"greedy": greedy.success_rate, "sampled": sampled.success_rate}
        self.decoding = better_decoding(greedy, sampled)

    def keep_test(self, greedy: EvaluationResult, sampled: EvaluationResult) -> None:
        """Keep the start's outcomes per test episode, greedy and ``sampled``."""
        self.outcomes = {"greedy": [e.success for e in greedy.episodes],
                         "sampled": [e.success for e in sampled.episodes]}

    def gains(self, final: EvaluationResult) -> dict[str, Any]:
        """:func:`paired_gains` of the final greedy evaluation ``final`` over this start."""
        return paired_gains([e.success for e in final.episodes], self.outcomes, self.decoding,
                            self.validation)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's fields of the start's figures."""
        return {"start_outcomes": self.outcomes["greedy"],
                "start_sampled_outcomes": self.outcomes["sampled"],
                "start_validation": self.validation, "best_start_decoding": self.decoding}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's fields (:meth:`state_dict`, migrated to the current
        format); one that did not keep the better decoding is said in a log line."""
        self.outcomes = {"greedy": list(state["start_outcomes"]),
                         "sampled": list(state["start_sampled_outcomes"])}
        self.validation, self.decoding = state["start_validation"], state["best_start_decoding"]
        if self.decoding is None:
            log.info("the checkpoint (format 2 or older) did not keep the start policy's better "
                     "decoding on the validation seeds: this run's summary gives its gain over "
                     "the start's greedy decoding only, without improvement_vs_best_start")
