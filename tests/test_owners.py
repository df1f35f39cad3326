"""One owner per fact (issue 20): checks over the source of `headprobe/` itself.

- no function longer than 60 lines;
- percentile intervals computed only in `headprobe/stats/engine.py`;
- an analysis's name spelled (as a string) only in its own module: the generic code reads
  names from the registry. A role's name (`RoleRule.role`, METHODS §6) is a fact of its own, spelled
  where that rule is made; the registry's input kinds (`registry.INPUTS`) are spelled in the registry.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from headprobe.scorers import registry

PACKAGE = Path(__file__).resolve().parents[1] / "headprobe"
MAX_LINES = 60


def sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_function_longer_than_60_lines():
    long = []
    for path, text in sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(
                        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)"
                    )
    assert not long, f"functions longer than {MAX_LINES} lines:\n" + "\n".join(long)


def test_percentiles_only_in_stats():
    pattern = re.compile(r"np\.(nan)?(percentile|quantile)")
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{i}"
        for path, text in sources().items()
        if path != PACKAGE / "stats" / "engine.py"
        for i, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "percentiles computed outside headprobe/stats/engine.py: " + ", ".join(found)


def string_constants(text: str) -> set[str]:
    """Every string literal of a module, docstrings excluded."""
    tree = ast.parse(text)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    }


def homes(analysis) -> set[Path]:
    """An analysis's own modules: its scorer's, its report section's where it names one, and the
    others it declares (`Analysis.homes`)."""
    modules = {analysis.scorer.__module__, *analysis.homes}
    if isinstance(analysis.report, str):
        modules.add(analysis.report.partition(":")[0])
    return {(PACKAGE.parent / (m.replace(".", "/") + ".py")).resolve() for m in modules}


def roles_made(text: str) -> set[str]:
    """The role names a module makes rules of: the literal first argument (or `role=`) of each
    `RoleRule(...)` call in it."""
    made = set()
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "RoleRule"
        ):
            role = (
                node.args[0]
                if node.args
                else next((k.value for k in node.keywords if k.arg == "role"), None)
            )
            if isinstance(role, ast.Constant) and isinstance(role.value, str):
                made.add(role.value)
    return made


def test_roles_made_reads_rule_calls():
    source = (
        'R = RoleRule("sink", 4, "#888", "d", f)\nS = registry.RoleRule(role="broad", order=5)\n'
        'T = RoleRule(name, 1, "#000", "d", f)\nU = Other("coreference")\n'
    )
    assert roles_made(source) == {"sink", "broad"}


def test_analysis_names_only_in_their_own_modules():
    owned = {
        a.name: homes(a)
        for a in registry.analyses()
        if a.scorer.__module__.startswith("headprobe.")
    }
    assert {"dependency", "coreference", "positional", "surface"} <= set(owned)
    registry_path = Path(registry.__file__).resolve()
    role_names = {rule.role for _, rule in registry.role_rules()}
    spelled = []
    for path, text in sources().items():
        constants = string_constants(text)
        if path.resolve() == registry_path:  # the registry's input kinds are its own fact
            constants -= set(registry.INPUTS)
        constants -= roles_made(text) & role_names  # a role's name where its rule is made
        for name, home in owned.items():
            if path.resolve() not in home and name in constants:
                spelled.append(f"{path.relative_to(PACKAGE.parent)} spells {name!r}")
    assert not spelled, "analysis names outside their own modules:\n" + "\n".join(spelled)
