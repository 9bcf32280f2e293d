"""Helpers every layer may import: crash-safe files and JSON (:mod:`common.files`), small
statistics (:mod:`common.stats`) and figures (:mod:`common.plots`).

This package sits on the ground floor beside ``tasks/``: it imports nothing else of the project,
so ``success_detectors/``, ``harness/`` and ``scripts/`` can all import it downward
(docs/architecture.md).
"""
