"""Helpers every layer may import: crash-safe files and JSON (:mod:`harness_common.files`), small
statistics (:mod:`harness_common.stats`) and figures (:mod:`harness_common.plots`).

This package sits on the ground floor beside ``tasks/``: it imports nothing else of the project,
so ``success_detectors/``, ``harness/`` and ``scripts/`` can all import it downward
(docs/architecture.md).
"""
