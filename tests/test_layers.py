"""The layering rule of docs/architecture.md, checked on every import statement of the project,
including those inside functions: every module has a floor in ``FLOORS``, no module imports a
higher floor, there are no circles (a submodule importing its own package's ``__init__`` counts),
no function is over ``MAX_FUNCTION_LINES`` lines and no file over ``MAX_LINES`` (files are split
by job, not by a count: the bound only catches a file that holds several). The checks are plain
functions of a folder, so the last tests plant bad modules in a temporary tree and see each check
fail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("harness_common", "tasks", "success_detectors", "harness", "scripts", "benchmarks",
           "studies")
MAX_LINES = 700
MAX_FUNCTION_LINES = 80
# A key names one module exactly; a key ending in ".*" names a package and everything below it.
# Every module of FOLDERS must match a key (the longest match wins): a new module gets a floor
# by a line here, never by default. A module imports its own floor or lower ones.
FLOORS: dict[str, int] = {
    "harness_common.*": 0,
    "tasks.*": 0,
    "success_detectors.*": 1,
    "harness": 2,  # the package itself: registers the Gymnasium ids (imports tasks)
    "harness.conf": 2,  # the YAML configs' package (no code)
    "harness.provenance": 2,
    "harness.objectives": 2,
    "harness.objective_names": 2,  # the objectives' names, without torch (the config reads them)
    "harness.outcomes": 2,
    "harness.policies.*": 2,
    "harness.curriculum.*": 2,
    "harness.demos": 2,
    "harness.demo_episodes": 2,
    "harness.evaluation": 2,
    "harness.lerobot.*": 2,
    "harness.export": 2,
    "harness.deploy": 2,
    "harness.deploy_trial": 2,  # run as a script by harness.deploy (numpy and onnxruntime only)
    "harness.launchers": 2,
    "harness.wandb_run": 2,
    "harness.config.*": 2,  # the schema: checks, and builds none of a run's objects
    "harness.runs": 4,
    "harness.start_policy.*": 4,
    "harness.algos.*": 5,
    "harness.checkpoints": 6,
    "harness.report.*": 6,
    "harness.trainers": 6,
    "harness.apps.*": 7,
    "scripts.*": 8,
    "benchmarks.*": 8,
    "studies.*": 8,
}
# The ground floor's two packages do not import each other: tasks/ imports nothing of ours.
ISOLATED = ("tasks", "harness_common")


def module_files(root: Path = ROOT, folders: tuple[str, ...] = FOLDERS) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file below ``root/<folder>``."""
    files = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def floor_key(module: str, floors: dict[str, int]) -> str | None:
    """The ``floors`` key that places ``module`` (the longest match), or None when none does."""
    matches = [key for key in floors
               if key == module or (key.endswith(".*") and (module == key[:-2]
                                                            or module.startswith(key[:-1])))]
    return max(matches, key=len, default=None)


def floor_of(module: str, floors: dict[str, int] = FLOORS) -> int:
    key = floor_key(module, floors)
    if key is None:
        raise KeyError(f"{module} has no floor in FLOORS")
    return floors[key]


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules that ``module`` names in an import statement anywhere in its file.

    An import names the deepest of our modules its dotted name reaches: ``from P import name``
    names ``P.name`` when that is a module, else ``P`` itself (its ``__init__``), also when ``P``
    is the importing module's own package. Loading a module's parent packages, which Python does
    before any submodule, is not an edge: it would make every package that re-exports its
    submodules a circle with each of them.
    """
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
            names = [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    return {module: imports_of(module, path, files) for module, path in files.items()}


def unlisted_modules(files: dict[str, Path], floors: dict[str, int] = FLOORS) -> list[str]:
    return [module for module in files if floor_key(module, floors) is None]


def upward_imports(graph: dict[str, set[str]], floors: dict[str, int] = FLOORS) -> list[str]:
    return [f"{module} (floor {floor_of(module, floors)}) imports {target} "
            f"(floor {floor_of(target, floors)})"
            for module, targets in graph.items() for target in sorted(targets)
            if floor_of(target, floors) > floor_of(module, floors)]


def ground_floor_leaks(graph: dict[str, set[str]]) -> list[str]:
    return [f"{module} imports {target}" for module, targets in graph.items()
            for target in sorted(targets)
            if module.split(".")[0] in ISOLATED and target.split(".")[0] != module.split(".")[0]]


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle a depth-first walk of ``graph`` closes, as ``[a, b, ..., a]``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                circles.append([*trail[trail.index(target):], target])
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return circles


def long_files(files: dict[str, Path], root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    return [f"{path.relative_to(root)} ({n} lines)" for path in files.values()
            if (n := len(path.read_text().splitlines())) > limit]


def test_every_module_has_a_floor():
    missing = unlisted_modules(module_files())
    assert not missing, "no floor in FLOORS for:\n" + "\n".join(missing)


def test_no_module_imports_a_higher_floor():
    upward = upward_imports(import_graph(module_files()))
    assert not upward, "\n".join(upward)


def test_the_ground_floor_imports_nothing_of_ours():
    leaks = ground_floor_leaks(import_graph(module_files()))
    assert not leaks, "\n".join(leaks)


def test_there_are_no_import_circles():
    circles = import_circles(import_graph(module_files()))
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_the_config_imports_only_what_its_checks_read():
    """``harness.config`` is the schema: it may read constants and run checks of its floor's
    modules, but not import what builds a run's objects (curricula, evaluation, exports)."""
    allowed = ("tasks", "harness_common", "success_detectors", "harness.config",
               "harness.policies", "harness.objectives", "harness.objective_names",
               "harness.demos",
               "harness.lerobot.reader")
    leaks = [f"{module} imports {target}"
             for module, targets in import_graph(module_files()).items()
             if module.startswith("harness.config") for target in sorted(targets)
             if target != "harness" and not any(target == a or target.startswith(a + ".")
                                                for a in allowed)]
    assert not leaks, "\n".join(leaks)


def long_functions(files: dict[str, Path], root: Path = ROOT,
                   limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``file:line name (lines)`` of every function or method longer than ``limit`` lines."""
    found = []
    for path in files.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines})")
    return found


def test_no_source_file_holds_several_jobs_by_its_length():
    long = long_files(module_files())
    assert not long, "\n".join(long)


def test_no_function_of_the_harness_is_over_80_lines():
    assert MAX_FUNCTION_LINES == 80  # the number in this test's name
    harness = {name: path for name, path in module_files().items()
               if name.split(".")[0] == "harness"}
    long = long_functions(harness)
    assert not long, "\n".join(long)


# The checks on planted trees: each bad module is written into a small tree of its own.
PLANTED_FLOORS = {"low.*": 0, "high.*": 1}


def plant(root: Path, sources: dict[str, str]) -> dict[str, Path]:
    """Write ``{relative path: source}`` below ``root``; returns the tree's module files."""
    for relative, source in sources.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(source)
    return module_files(root, ("low", "high", "extra"))


def test_a_planted_upward_import_inside_a_function_is_reported(tmp_path):
    files = plant(tmp_path, {"low/__init__.py": "", "high/__init__.py": "",
                             "high/top.py": "VALUE = 1\n",
                             "low/base.py": "def f():\n    from high.top import VALUE\n"})
    graph = import_graph(files)
    assert upward_imports(graph, PLANTED_FLOORS) == [
        "low.base (floor 0) imports high.top (floor 1)"]


def test_a_planted_submodule_to_package_circle_is_reported(tmp_path):
    """The package re-exports ``a``, and ``a`` takes a name from its own package: a circle
    (which of the two runs first decides whether the name exists yet)."""
    files = plant(tmp_path, {"low/__init__.py": "", "low/pkg/__init__.py":
                             "from low.pkg.a import A\nNAME = 1\n",
                             "low/pkg/a.py": "from low.pkg import NAME\nA = NAME\n",
                             "low/pkg/b.py": "from . import a\n"})
    graph = import_graph(files)
    assert graph["low.pkg.b"] == {"low.pkg.a"}  # a submodule named by a relative import
    assert import_circles(graph) == [["low.pkg", "low.pkg.a", "low.pkg"]]


def test_a_package_that_only_re_exports_its_submodules_is_no_circle(tmp_path):
    files = plant(tmp_path, {"low/__init__.py": "", "low/pkg/__init__.py":
                             "from low.pkg.a import A\nfrom low.pkg.b import B\n",
                             "low/pkg/a.py": "A = 1\n",
                             "low/pkg/b.py": "from low.pkg.a import A\nB = A\n"})
    assert import_circles(import_graph(files)) == []


def test_a_planted_unlisted_module_is_reported(tmp_path):
    files = plant(tmp_path, {"low/__init__.py": "", "high/__init__.py": "",
                             "extra/__init__.py": "", "extra/stray.py": "import low\n"})
    assert unlisted_modules(files, PLANTED_FLOORS) == ["extra", "extra.stray"]
    with pytest.raises(KeyError, match="extra.stray has no floor"):
        upward_imports(import_graph(files), PLANTED_FLOORS)


def test_a_planted_long_file_is_reported(tmp_path):
    files = plant(tmp_path, {"low/__init__.py": "", "low/long.py": "x = 1\n" * (MAX_LINES + 1)})
    assert long_files(files, tmp_path) == [f"low/long.py ({MAX_LINES + 1} lines)"]


def test_a_planted_long_function_is_reported(tmp_path):
    body = "    x = 1\n" * MAX_FUNCTION_LINES
    files = plant(tmp_path, {"low/__init__.py": "", "low/long.py": f"def f():\n{body}\n"
                             f"def g():\n{body[:-10]}"})
    assert long_functions(files, tmp_path) == [f"low/long.py:1 f ({MAX_FUNCTION_LINES + 1})"]
