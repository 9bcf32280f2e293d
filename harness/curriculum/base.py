"""The surface every curriculum shares: seeded sampling, the success table, metrics, state."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.curriculum.table import SuccessTable

Seed = int | Sequence[int]


def check_unit(name: str, value: float) -> float:
    """Return ``value`` as a float, raising if it is not in [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


class Curriculum(ABC):
    """Shared bookkeeping: seeded RNG, per-bin success table, signal fraction, state.

    Subclasses implement ``sample`` and may react to outcomes in ``_after_update``.

    Args:
        seed: Seed of the curriculum's own ``numpy.random.Generator``.
        num_bins: Bins of the success table that ``metrics`` reports (and ``success_band`` uses).
        prior: Beta prior pseudo-count of the success table.
        decay: Per-outcome discount of the success table.
    """

    def __init__(
        self,
        *,
        seed: Seed = 0,
        num_bins: int = 10,
        prior: float = 1.0,
        decay: float = 0.98,
    ) -> None:
        self.table = SuccessTable(num_bins, prior=prior, decay=decay)
        self._rng = np.random.default_rng(seed)
        self._updates = 0
        self._groups = 0
        self._signal_groups = 0

    @abstractmethod
    def sample(self) -> float:
        """Draw the difficulty, in [0, 1], of the next group or episode."""

    def update(self, difficulty: float, successes: Sequence[bool | float]) -> None:
        """Record the outcomes of one group (or one episode) played at ``difficulty``.

        Args:
            difficulty: The difficulty that ``sample`` returned, in [0, 1].
            successes: One outcome per attempt: booleans or success fractions in [0, 1].

        Raises:
            ValueError: If ``difficulty`` or an outcome is outside [0, 1], or ``successes`` is
                empty.
        """
        difficulty = check_unit("difficulty", difficulty)
        outcomes = np.asarray(successes, dtype=np.float64).reshape(-1)
        if outcomes.size == 0:
            raise ValueError("successes must hold at least one outcome, got an empty sequence")
        if np.any((outcomes < 0.0) | (outcomes > 1.0)) or np.any(np.isnan(outcomes)):
            raise ValueError(f"successes must be booleans or floats in [0, 1], got {successes!r}")
        index = self.table.bin_of(difficulty)
        self.table.record(index, outcomes)
        self._updates += 1
        if outcomes.size >= 2:
            self._groups += 1
            self._signal_groups += int(outcomes.min() != outcomes.max())
        self._after_update(index)

    def _after_update(self, index: int) -> None:  # noqa: B027 (optional hook)
        """Hook run after outcomes at bin ``index`` were recorded."""

    @property
    def frontier(self) -> float:
        """The hardest difficulty currently sampled."""
        return 1.0

    def reset_options(self, difficulty: float) -> dict[str, Any]:
        """Gymnasium ``reset`` options that play ``difficulty``: ``{"difficulty": difficulty}``.

        Randomisation ranges are automatic domain randomisation's
        (:class:`~harness.curriculum.adr.AutomaticDomainRandomization`), not the curriculum's.
        """
        return {"difficulty": difficulty}

    def metrics(self) -> dict[str, float]:
        """Per-bin success estimates and sample counts, frontier and signal fraction.

        ``curriculum/signal_fraction`` is the fraction of updates with at least two outcomes whose
        outcomes were not all equal (0 before any such update).
        """
        out: dict[str, float] = {}
        for i, (p, n) in enumerate(zip(self.table.estimate(), self.table.samples, strict=True)):
            out[f"curriculum/bin_{i}_success"] = float(p)
            out[f"curriculum/bin_{i}_samples"] = float(n)
        out["curriculum/frontier"] = float(self.frontier)
        out["curriculum/signal_fraction"] = self._signal_groups / max(self._groups, 1)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically, as a JSON-able dict."""
        return {
            "rng": self._rng.bit_generator.state,
            "table": self.table.state_dict(),
            "updates": self._updates,
            "groups": self._groups,
            "signal_groups": self._signal_groups,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` into a curriculum built with the same parameters."""
        self._rng.bit_generator.state = state["rng"]
        self.table.load_state_dict(state["table"])
        self._updates = int(state["updates"])
        self._groups = int(state["groups"])
        self._signal_groups = int(state["signal_groups"])
