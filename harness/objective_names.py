"""The names the maths of :mod:`harness.objectives` knows, importable without torch (the config
checks them when it is composed, ``--help`` included)."""

from __future__ import annotations

ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo", "critic", "reinforce")
AGGREGATIONS: tuple[str, ...] = ("seq_mean_token_mean", "token_sum_const", "token_mean")
# What one clipped ratio covers (harness.objectives.ratio_units): ``native`` is each head's own
# unit (a token, a Gaussian chunk entry, a whole flow chain); the others are cut from a
# decision's log-prob parts.
RATIO_UNITS: tuple[str, ...] = ("native", "decision", "step", "element", "chain_element")
