"""The library's imports only point down.

- No import cycle among coevolve/ modules, counting the imports inside functions (a deferred
  import still runs, and hiding a cycle behind one is how layers come to point up). Only
  ``if TYPE_CHECKING:`` blocks do not count: they never run.
- Nothing under coevolve/ imports Prefect or ``flows``: the orchestration layer imports the
  library, never the other way round (the commands that drive flows live in ``flows/cli``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Name)
        and test.id == "TYPE_CHECKING"
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def imported_names(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """Every import statement that runs, as (module, names): at module level, in functions,
    classes, ``try`` and ``if`` blocks; not in ``if TYPE_CHECKING:`` blocks."""
    out: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def _coevolve_imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """coevolve modules imported anywhere that runs (``from pkg import mod`` names the module)."""
    out: set[str] = set()
    for module, names in imported_names(tree):
        if not names:
            if module in modules:
                out.add(module)
            continue
        for name in names:
            sub = f"{module}.{name}"
            if sub in modules:
                out.add(sub)
            elif module in modules:
                out.add(module)
    return out


def _library_files() -> list[Path]:
    return sorted((ROOT / "coevolve").rglob("*.py"))


def import_graph() -> dict[str, set[str]]:
    files = _library_files()
    modules = {_module_name(f) for f in files}
    return {_module_name(f): _coevolve_imports(ast.parse(f.read_text()), modules) for f in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_detector_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_count_and_type_checking_blocks_do_not():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import coevolve.a\n"
        "if TYPE_CHECKING:\n    from coevolve.b import B\n"
        "def f():\n    from coevolve import c\n"
        "class K:\n    def g(self):\n        try:\n            import coevolve.d\n        except ImportError:\n            pass\n"
    )
    modules = {"coevolve", "coevolve.a", "coevolve.b", "coevolve.c", "coevolve.d"}
    assert _coevolve_imports(tree, modules) == {"coevolve.a", "coevolve.c", "coevolve.d"}


def test_no_import_cycle_among_coevolve_modules():
    graph = import_graph()
    assert "coevolve.explore" in graph and "coevolve.explorers.base" in graph["coevolve.explorers.rule"]
    assert "coevolve.events" in graph["coevolve.train"]  # a function-level import, counted
    assert cycles(graph) == []


def test_the_library_never_imports_prefect_or_flows():
    offenders = [
        f"{_module_name(f)} imports {module}"
        for f in _library_files()
        for module, _ in imported_names(ast.parse(f.read_text()))
        if module.split(".")[0] in ("prefect", "flows") or module.startswith("prefect_")
    ]
    assert offenders == []
