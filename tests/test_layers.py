"""The layering rule of docs/architecture.md, checked on every import statement of the project,
including those inside functions: no module imports a higher floor, and there are no circles."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness_common", "tasks", "success_detectors", "harness")
# Longest matching prefix wins. A module may import its own floor or lower ones.
FLOORS: dict[str, int] = {
    "harness_common": 0,
    "tasks": 0,
    "success_detectors": 1,
    "harness": 2,  # the package itself: registers the Gymnasium ids (imports tasks)
    "harness.objectives": 2,
    "harness.policies": 2,
    "harness.curriculum": 2,
    "harness.demos": 2,
    "harness.demo_episodes": 2,
    "harness.evaluation": 2,
    "harness.lerobot": 2,
    "harness.export": 2,
    "harness.deploy": 2,
    "harness.launchers": 2,
    "harness.wandb_run": 2,
    "harness.config": 2,  # the schema: checks, and builds none of a run's objects
    "harness.runs": 4,
    "harness.bc": 4,
    "harness.start_policy": 4,
    "harness.state_pretraining": 4,
    "harness.algos": 5,
    "harness.checkpoints": 6,
    "harness.report": 6,
    "harness.trainers": 6,
    "scripts": 7,
}
# The ground floor's two packages do not import each other: tasks/ imports nothing of ours.
ISOLATED = ("tasks", "harness_common")


def module_files() -> dict[str, Path]:
    files = {}
    for folder in (*PACKAGES, "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def floor_of(module: str) -> int:
    best = max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len)
    return FLOORS[best]


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules that ``module`` imports anywhere in its file."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    known = module_files()
    return {module: imports_of(module, path, known) for module, path in known.items()}


def test_no_module_imports_a_higher_floor():
    upward = [f"{module} (floor {floor_of(module)}) imports {target} (floor {floor_of(target)})"
              for module, targets in import_graph().items() for target in sorted(targets)
              if floor_of(target) > floor_of(module)]
    assert not upward, "\n".join(upward)


def test_the_ground_floor_imports_nothing_of_ours():
    leaks = [f"{module} imports {target}" for module, targets in import_graph().items()
             for target in sorted(targets)
             if module.split(".")[0] in ISOLATED and target.split(".")[0] != module.split(".")[0]]
    assert not leaks, "\n".join(leaks)


def test_there_are_no_import_circles():
    graph = import_graph()
    # A package's __init__ that re-exports its submodules is not a circle with them.
    edges = {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in graph.items()}
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                circles.append([*trail[trail.index(target):], target] if target in trail
                               else [node, target])
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_the_config_imports_only_what_its_checks_read():
    """``harness.config`` is the schema: it may read constants and run checks of its floor's
    modules, but not import what builds a run's objects (curricula, evaluation, exports)."""
    allowed = ("tasks", "harness_common", "success_detectors", "harness.config",
               "harness.policies", "harness.objectives", "harness.demos",
               "harness.lerobot.reader")
    leaks = [f"{module} imports {target}" for module, targets in import_graph().items()
             if module.startswith("harness.config") for target in sorted(targets)
             if target != "harness" and not any(target == a or target.startswith(a + ".")
                                                for a in allowed)]
    assert not leaks, "\n".join(leaks)


def test_no_source_file_is_over_400_lines():
    long = [f"{path.relative_to(ROOT)} ({n} lines)" for path in module_files().values()
            if (n := len(path.read_text().splitlines())) > 420]
    assert not long, "\n".join(long)
