"""The package's layout: no import circles (function-level imports count), no private names across modules.

The graph is read from the syntax trees, not from running imports, so an import hidden inside a function counts
as much as one at the top of a file: both are a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "membench"


@dataclass(frozen=True)
class Import:
    source: str       # the importing module, dotted
    target: str       # the imported module, dotted (a package's __init__ is the package's name)
    names: tuple[str, ...]  # names taken from it with `from target import ...` (empty for `import target`)
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def imports(root: Path) -> list[Import]:
    """Every import of a module of the package by a module of the package, wherever in the file it is written."""
    known = modules(root)
    top = root.name
    found = []
    for source, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == top or alias.name.startswith(top + "."):
                        found.append(Import(source, alias.name, (), node.lineno))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    # `from . import x` in a.b.c means a.b; in the package a.b's __init__ it means a.b itself.
                    package = source.split(".") if is_package else source.split(".")[:-1]
                    base = ".".join(package[:len(package) - (node.level - 1)])
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                if base != top and not base.startswith(top + "."):
                    continue
                for alias in node.names:
                    # `from membench import spec` imports the module membench.spec; `from membench.spec import Job`
                    # imports from membench.spec.
                    child = f"{base}.{alias.name}"
                    if child in known:
                        found.append(Import(source, child, (), node.lineno))
                    else:
                        found.append(Import(source, base, (alias.name,), node.lineno))
    return found


def graph(found: list[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for imp in found:
        if imp.target != imp.source:
            edges.setdefault(imp.source, set()).add(imp.target)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path that starts and ends on the same module, or None (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once every path from it is explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_has_no_import_circle():
    cycle = find_cycle(graph(imports(PACKAGE)))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(root: Path) -> list[str]:
    """Private names of one module used by another: imported by name, or read as an attribute of the module."""
    known = modules(root)
    found = [f"{imp.source}:{imp.line} imports {imp.target}.{name}"
             for imp in imports(root) for name in imp.names if is_private(name)]
    for source, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        bound = {}  # local name -> the package module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                bound.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                              if f"{node.module}.{a.name}" in known})
            elif isinstance(node, ast.Import):
                bound.update({a.asname: a.name for a in node.names if a.asname and a.name in known})
        found += [f"{source}:{node.lineno} reads {bound[node.value.id]}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in bound and bound[node.value.id] != source and is_private(node.attr)]
    return found


def test_no_private_name_is_used_by_another_module():
    private = private_uses(PACKAGE)
    assert not private, "\n".join(private)


def test_function_level_imports_are_counted(tmp_path):
    """The analysis sees a circle closed by an import inside a function, through relative and absolute forms."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import c\n")
    (pkg / "a.py").write_text("from .sub.c import thing\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n    return a\n")
    (pkg / "sub" / "c.py").write_text("def thing():\n    from ..b import f\n    return f\n")
    edges = graph(imports(pkg))
    assert edges == {"pkg.sub": {"pkg.sub.c"}, "pkg.a": {"pkg.sub.c"}, "pkg.b": {"pkg.a"}, "pkg.sub.c": {"pkg.b"}}
    assert find_cycle(edges) == ["pkg.a", "pkg.sub.c", "pkg.b", "pkg.a"]
    (pkg / "d.py").write_text("from pkg import b\nfrom pkg.sub.c import _hidden\n\ndef g():\n    return b._f\n")
    assert private_uses(pkg) == ["pkg.d:2 imports pkg.sub.c._hidden", "pkg.d:5 reads pkg.b._f"]


@pytest.mark.parametrize("edges", [{}, {"a": {"b"}, "b": {"c"}, "d": {"b", "c"}}])
def test_a_graph_without_circle_has_none(edges):
    assert find_cycle(edges) is None


# --- Layers: the floors of the house, from the ground up ---------------------------------------------------------
# Every folder and every module of the package's root is a part, and every part stands on one floor. A module imports
# its own part and the parts of the floors below it, never a part of its own floor or of one above (function-level
# imports count). `membench` is the package's __init__ (it imports the API inside `run_sweep`); only `cli`, `api`,
# `plan` and `child/` sit above the commands (`predict/`, `report/`, `gate/`).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("common",),                                # errors, files, typed JSON, units, vocabulary
    ("private", "spec"),                        # torch's private APIs; a run's vocabulary (RunSpec, Gpu, Mesh)
    ("results", "allocator", "workloads"),      # the record; the caching allocator; models and batches
    ("environment", "trackers", "optimizers"),  # where a run happened; measurement; optimizers by name
    ("step",),                                  # TrainState and the training step
    ("techniques",),                            # hooks on the step
    ("launch",),                                # the parent side of processes
    ("measure", "equivalence"),                 # the measuring session; the verdict
    ("predict",),                               # commands: predictions and fit
    ("report",),                                # commands: report
    ("gate", "plan"),                           # commands: check, compare; the planner
    ("child",),                                 # what runs inside the processes
    ("api",),                                   # the Python API
    ("membench",),                              # the package's __init__
    ("cli",),                                   # the command line
    ("__main__",),                              # python -m membench
)


def floor_of(module: str, top: str = "membench") -> tuple[int, str] | None:
    """(its floor, its part) for a module of the package; None where no row names its part."""
    part = module.split(".")[1] if "." in module else module.removeprefix(top) or "membench"
    for level, parts in enumerate(FLOORS):
        if part in parts:
            return level, part
    return None


# Beyond the floors, parts that never import some parts below them: what runs inside a process is child/'s, not
# launch/'s; the report reads records, not the machinery that made them; the gate holds results, it predicts nothing.
NEVER: dict[str, tuple[str, ...]] = {
    "membench.launch": ("membench.trackers", "membench.workloads"),
    "membench.report": ("membench.trackers", "membench.techniques", "membench.allocator", "membench.workloads"),
    "membench.results": ("membench.workloads",),
    "membench.allocator": ("membench.workloads",),
    "membench.gate": ("membench.predict", "membench.launch"),
}


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


# Arrows that still break a rule, each with what removes it. Keep this empty.
KNOWN: set[tuple[str, str]] = set()


def forbidden_imports(found: list[Import], known: set[tuple[str, str]] = frozenset()) -> list[str]:
    bad = []
    for imp in found:
        if (imp.source, imp.target) in known:
            continue
        for floor, never in NEVER.items():
            if under(imp.source, floor) and any(under(imp.target, n) for n in never):
                bad.append(f"{imp.source}:{imp.line} imports {imp.target} ({floor} never imports it)")
        source, target = floor_of(imp.source), floor_of(imp.target)
        if source is None or target is None or source[1] == target[1]:
            continue  # a part without a row fails test_every_part_has_a_floor; a part imports itself freely
        if target[0] >= source[0]:
            where = "its own floor" if target[0] == source[0] else "a floor above"
            bad.append(f"{imp.source}:{imp.line} imports {imp.target} ({target[1]} is on {where} of {source[1]})")
    return bad


def parts(root: Path) -> set[str]:
    """Every part of the package: its folders and the modules of its root ('membench' for its __init__)."""
    return {floor_part for name in modules(root) if (floor_part := name.split(".")[1] if "." in name else "membench")}


def test_every_part_has_a_floor():
    missing = sorted(part for part in parts(PACKAGE) if floor_of(f"membench.{part}") is None)
    assert not missing, f"parts with no row in FLOORS (add one): {missing}"


def test_no_layer_imports_what_sits_above_it():
    bad = forbidden_imports(imports(PACKAGE), KNOWN)
    assert not bad, "\n".join(bad)


def test_the_floors_catch_an_arrow_that_runs_back_up(tmp_path):
    """The check sees a lower floor reaching up, through a function-level import, from a folder and from a root
    module alike, and a part reaching sideways to another part of its own floor."""
    pkg = tmp_path / "membench"
    for folder in ("launch", "common", "predict"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "api.py").write_text("")
    (pkg / "step.py").write_text("def f():\n    from membench.predict import run\n    return run\n")
    (pkg / "private.py").write_text("from membench import spec\n")
    (pkg / "spec.py").write_text("")
    (pkg / "launch" / "sweep.py").write_text("def f():\n    from membench import api\n    return api\n")
    (pkg / "common" / "units.py").write_text("from membench.predict import run\n")
    (pkg / "predict" / "run.py").write_text("from membench.common import units\nfrom membench import step\n")
    (pkg / "gate").mkdir()
    (pkg / "gate" / "__init__.py").write_text("from membench.launch import sweep\n")
    assert forbidden_imports(imports(pkg)) == [
        "membench.common.units:1 imports membench.predict.run (predict is on a floor above of common)",
        "membench.gate:1 imports membench.launch.sweep (membench.gate never imports it)",
        "membench.launch.sweep:2 imports membench.api (api is on a floor above of launch)",
        "membench.private:1 imports membench.spec (spec is on its own floor of private)",
        "membench.step:2 imports membench.predict.run (predict is on a floor above of step)",
    ]
    (pkg / "newpart.py").write_text("")
    assert "newpart" in parts(pkg) and floor_of("membench.newpart") is None


def test_the_root_holds_at_most_a_dozen_modules_and_trackers_only_measure():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 12, root
    emulation = [p.name for p in (PACKAGE / "trackers").glob("*.py") if p.name.startswith(("cuda_", "fake"))]
    assert not emulation, f"prediction-only modules in trackers/: {emulation}"


MAX_FUNCTION_LINES = 80


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions longer than `limit` lines, decorators and docstring included: the length a reader has to hold."""
    found = []
    for name, path in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = node.end_lineno - start + 1
                if length > limit:
                    found.append(f"{name}.{node.name}:{node.lineno} is {length} lines")
    return found


def test_no_function_is_over_80_lines():
    # Cyclomatic complexity has its own gate: ruff's C901 at 25 (ruff.toml), which CI runs.
    assert long_functions(PACKAGE) == []


def test_the_length_check_finds_a_long_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}")
    assert long_functions(package) == [f"pkg.long.long:5 is {MAX_FUNCTION_LINES + 1} lines"]
