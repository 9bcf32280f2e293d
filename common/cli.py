"""Running a Hydra app as a function: ``main(argv) -> exit status`` for the scripts."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


def run_app(app: Callable[[], object], argv: Sequence[str] | None = None) -> int:
    """Run the ``@hydra.main`` function ``app`` on ``argv`` (default: the command line) and
    return its exit status: 0, or the status of the ``SystemExit`` it raised (1 for a message,
    as the scripts' ``fail`` does). ``sys.argv`` is restored afterwards."""
    saved = sys.argv
    sys.argv = [saved[0], *(saved[1:] if argv is None else argv)]
    try:
        app()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        sys.argv = saved
    return 0
