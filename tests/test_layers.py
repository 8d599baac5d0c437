"""The house rules: floors without cycles, short modules and functions, a layout table that matches.

import-linter (``lint-imports``, run by ``scripts/test.sh``) holds the order of the floors; these
tests hold what it does not: no import cycle between floors or between modules at all, the size
limits, and the README's layout table naming every floor there is. A floor is a top-level package
(``streams``, ``features``, ``predictor``) or a subpackage of ``leap`` (``leap.core``, ``leap.fleet``,
...); the modules of ``leap/`` itself are the roof, the floor ``leap``.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60
#: Modules allowed past MAX_FILE_LINES, each with its reason: a cohesive module is not split to meet
#: a guide (a split that imports back, as predictor/artifact.py once did with lgbm.py, is worse).
FILE_LINE_ALLOWANCES: dict[str, tuple[int, str]] = {
    "predictor/lgbm.py": (700, "one estimator: its stages share the fitted state and the held-out rows, and its "
                          "artifact state is read and written beside them"),
}


def _packages() -> list[str]:
    """The top-level packages, as the import contract lists them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return list(config["root_packages"])


def _floor(module: str) -> str:
    """``leap.core`` for ``leap.core.settings``, ``streams`` for ``streams.app``, ``leap`` for the roof."""
    parts = module.split(".")
    if parts[0] == "leap" and len(parts) > 1 and (ROOT / "leap" / parts[1]).is_dir():
        return ".".join(parts[:2])
    return parts[0]


def _floors() -> set[str]:
    return {_floor(_module_name(path)) for path in _sources(include_tests=False)}


def _sources(include_tests: bool = True) -> Iterator[Path]:
    for package in [*_packages(), *(["tests"] if include_tests else [])]:
        yield from sorted((ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.Module) -> Iterator[str]:
    """Modules imported when the code runs: ``if TYPE_CHECKING:`` blocks are skipped."""

    def walk(nodes: list[ast.stmt]) -> Iterator[str]:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.orelse)
                continue
            for child in ast.walk(node):
                if isinstance(child, ast.Import):
                    yield from (alias.name for alias in child.names)
                elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                    yield child.module
                    yield from (f"{child.module}.{alias.name}" for alias in child.names)

    yield from walk(tree.body)


def _module_graph() -> dict[str, set[str]]:
    """Module -> first-party modules it imports at run time (production code only)."""
    paths = {_module_name(p): p for p in _sources(include_tests=False)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets = {t for t in _runtime_imports(ast.parse(path.read_text())) if t in paths and t != name}
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_packages() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in _module_graph().items():
        top = _floor(module)
        packages.setdefault(top, set()).update(_floor(t) for t in targets if _floor(t) != top)
    assert _cycles(packages) == []


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_module_graph()) == []


def test_production_code_never_imports_the_simulator() -> None:
    below_roof = _floors() - {"leap", "leap.bench", "leap.fleet"}
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in _module_graph().items() if _floor(module) in below_roof
        for target in targets if _floor(target) in ("leap.fleet", "leap.bench")
    )
    assert offenders == []


def test_files_and_functions_are_short() -> None:
    long_files, long_functions = [], []
    for path in _sources():
        text = path.read_text()
        rel = path.relative_to(ROOT)
        if text.count("\n") > FILE_LINE_ALLOWANCES.get(rel.as_posix(), (MAX_FILE_LINES, ""))[0]:
            long_files.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    assert long_files == []
    assert long_functions == []


def test_readme_layout_table_names_every_package() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1]
    listed = set(re.findall(r"\| `([a-z_/]+)/` \|", section))
    assert listed >= {floor.replace(".", "/") for floor in _floors()}
    assert all((ROOT / name).is_dir() for name in listed)
