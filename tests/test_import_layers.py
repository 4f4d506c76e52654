"""Raylane's subpackages import one another in layers, with no cycle.

A unit is a top-level module or subpackage of ``raylane`` (``raylane.config``, ``raylane.control``,
``raylane.cli_cluster``). Unit A imports unit B when any file of A has an ``import`` or ``from ... import`` of B
anywhere, inside functions too (relative imports resolved). The graph of those edges must have no strongly connected
component of more than one unit: a cycle means two layers that cannot be read, tested or changed apart, and an
import inside a function only hides it. The check reads the source with ``ast`` and needs no Ray.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "raylane"


def _module_name(path: Path) -> tuple[str, bool]:
    """The dotted name of a file under ``PACKAGE`` and whether it is a package's ``__init__``."""
    parts = ["raylane", *path.relative_to(PACKAGE).with_suffix("").parts]
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The absolute module names one ``Import`` or ``ImportFrom`` node reaches (a name it imports may be a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "raylane" and len(parts) > 1 else None


def import_graph(package: Path = PACKAGE) -> dict[tuple[str, str], set[str]]:
    """Edges between units, each with the files (relative to ``package``) whose imports make it."""
    units = {p.stem if p.is_file() else p.name for p in package.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in sorted(package.rglob("*.py")):
        module, is_package = _module_name(path)
        source = _unit(module)
        if source is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported(node, module, is_package):
                target = _unit(name)
                if target in units and target != source:
                    edges[(source, target)].add(str(path.relative_to(package)))
    return edges


def strongly_connected(nodes: set[str], edges) -> list[set[str]]:
    """Tarjan's algorithm: the strongly connected components of more than one node."""
    successors: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        successors[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(successors[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def test_tarjan_finds_a_cycle_and_leaves_a_chain_alone():
    assert strongly_connected({"a", "b", "c"}, {("a", "b"), ("b", "c")}) == []
    assert strongly_connected({"a", "b", "c", "d"}, {("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [
        {"a", "b", "c"}]


def test_relative_imports_resolve_to_their_unit():
    def names(code: str, module: str, is_package: bool = False) -> list[str]:
        return _imported(ast.parse(code).body[0], module, is_package)

    assert names("from ..config import models", "raylane.control.actor") == [
        "raylane.config", "raylane.config.models"]
    assert names("from . import spec", "raylane.pipelines", is_package=True) == [
        "raylane.pipelines", "raylane.pipelines.spec"]
    assert names("from .errors import RaylaneError", "raylane.run") == ["raylane.errors", "raylane.errors.RaylaneError"]


def test_no_import_cycle_among_raylane_units():
    edges = import_graph()
    assert edges, "no import found: is PACKAGE the raylane package?"
    nodes = {unit for edge in edges for unit in edge}
    cycles = strongly_connected(nodes, edges)
    report = []
    for component in cycles:
        report.append("cycle among " + ", ".join(sorted(component)) + ":")
        for (a, b), files in sorted(edges.items()):
            if a in component and b in component:
                report.append(f"  {a} -> {b}: {', '.join(sorted(files))}")
    assert not cycles, "\n".join(report)
