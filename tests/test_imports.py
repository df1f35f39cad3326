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


# The package's rooms (sub-packages and top-level modules), bottom first: each imports only
# rooms below it (docs/ARCHITECTURE.md draws them). Imports inside functions count; imports
# under `if TYPE_CHECKING:` (annotations only, never run) do not.
LAYERS = [
    "version",  # the version string (pyproject reads it)
    "core",  # errors, seeds and hashes, atomic writes
    "inputs",  # corpora -> examples -> batches
    "model",  # sites, capture, gates, objectives
    "checks",  # checks of options, paths and the model's config, before a model loads
    "scoring",  # the streaming pass and the contracts every analysis implements
    "stats",  # the statistics engine and the role engine
    "results",  # tables and the results directory
    "report",  # rendering
    "extend",  # the public API of plugins and studies: registering, options, patterns, sections
    "studies",  # one folder per analysis: its options, checks and probes too
    "core_options",  # the core options' checks, help texts and record rules
    "config",  # RunConfig: every option
    "session",  # a run past its checks: the model loaded, the stack resolved, the summary begun
    "passes",  # a run's engine passes: which analyses read which corpus, scored
    "api",  # a run: check, open the session, plan and score the passes, save
    "training",  # a run per checkpoint of a model's training, and its tables and report
    "cli",  # the command
    "__main__",
    "__init__",  # the public API
]


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` blocks."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(sub) for sub in ast.walk(node)}
    return inside


def room_graph() -> nx.DiGraph:
    """room -> room, with the importing modules on each edge ("via")."""
    found = modules()
    known = set(found)
    graph = nx.DiGraph()
    for name, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in imported(node, name, path.name == "__init__.py", known):
                a, b = room_of(name), room_of(target)
                if a != b:
                    graph.add_edge(a, b)
                    graph.edges[a, b].setdefault("via", set()).add(name)
    return graph


def test_rooms_import_only_downward():
    """No two rooms reach each other, and every import goes to a room below (LAYERS)."""
    graph = room_graph()
    rooms = {room_of(m) for m in modules()}
    assert rooms == set(LAYERS), f"rooms not in LAYERS: {sorted(rooms ^ set(LAYERS))}"
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"rooms that reach each other: {cycles}"
    rank = {room: i for i, room in enumerate(LAYERS)}
    upward = [
        f"{a} -> {b} (via {', '.join(sorted(graph.edges[a, b]['via']))})"
        for a, b in graph.edges
        if rank[b] > rank[a]
    ]
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_the_room_graph_sees_imports_in_functions():
    graph = room_graph()
    # `report.selection` reads the registry at call time, the engine reaches no option default
    assert graph.has_edge("report", "scoring")
    assert not graph.has_edge("scoring", "config")
