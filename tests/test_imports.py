"""No import cycle among the modules of `headprobe/`.

The graph is read from the source with `ast`, so it holds every import, at module level and
inside functions alike, relative and absolute: `import headprobe.x`, `from headprobe import x`
(x a submodule: an edge to it), `from headprobe.x import name` (an edge to headprobe.x),
`from .x import name`. A package's `__init__` is the module named after the package; the
implicit import of a parent package by its submodules is not an edge (Python runs it first,
whoever imports what).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "headprobe"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The headprobe modules one module's source imports (anywhere in it)."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(_known_prefix(alias.name, known))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else _known_prefix(base, known))
    return {m for m in found if m and m != name}


def _known_prefix(dotted: str, known: set[str]) -> str:
    """The longest prefix of `dotted` that is a headprobe module ('' for other packages)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return ""


def import_graph() -> nx.DiGraph:
    found = modules()
    known = set(found)
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    for name, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target in imported(tree, name, path.name == "__init__.py", known):
            graph.add_edge(name, target)
    return graph


def test_the_graph_sees_every_kind_of_import():
    known = {
        "headprobe",
        "headprobe.a",
        "headprobe.b",
        "headprobe.pkg",
        "headprobe.pkg.c",
        "headprobe.pkg.d",
    }
    source = (
        "import os\nimport headprobe.a\nfrom headprobe import b\nfrom headprobe.pkg import c, CONST\n"
        "def f():\n    from .d import thing\n    from .. import a\n    from . import c\n"
    )
    got = imported(ast.parse(source), "headprobe.pkg.d", False, known)
    assert got == {"headprobe.a", "headprobe.b", "headprobe.pkg", "headprobe.pkg.c"}
    got = imported(ast.parse("from . import d\nfrom .c import x\n"), "headprobe.pkg", True, known)
    assert got == {"headprobe.pkg.d", "headprobe.pkg.c"}
    graph = import_graph()
    assert graph.has_edge("headprobe", "headprobe.api")  # headprobe/__init__.py
    assert graph.has_edge("headprobe.report", "headprobe.report.build")


def test_no_import_cycle():
    graph = import_graph()
    cycles = sorted(nx.simple_cycles(graph), key=len)
    if cycles:
        shown = "\n".join(" -> ".join(cycle + [cycle[0]]) for cycle in cycles[:20])
        pytest.fail(
            f"{len(cycles)} import cycle(s) among headprobe modules, shortest first:\n{shown}"
        )
