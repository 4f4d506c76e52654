"""Raylane's subpackages import one another in layers, with no cycle; and so do the modules inside each subpackage.

A unit is a top-level module or subpackage of ``raylane`` (``raylane.config``, ``raylane.control``, ``raylane.cli``,
``raylane.errors``). Unit A imports unit B when any file of A has an ``import`` or ``from ... import`` of B
anywhere, inside functions too (relative imports resolved). The graph of those edges must have no strongly connected
component of more than one unit: a cycle means two layers that cannot be read, tested or changed apart, and an
import inside a function only hides it. The check reads the source with ``ast`` and needs no Ray.

The same holds one level down, file by file (``test_no_import_cycle_inside_a_subpackage``): within each subpackage
(``raylane.config``, ``raylane.sim``, ``raylane.cli``, ``raylane.scheduling.ordering``, ...), the nodes are its
direct members (each module, each subpackage as a whole, and its ``__init__``), and member A imports member B when a
file of A imports B or something of B, anywhere in the file: inside functions, and inside ``if TYPE_CHECKING:``
blocks too (they are not skipped: a type that one side needs of the other belongs in a module both import, or in a
Protocol). ``from raylane.sim import engine`` names the module ``engine``, not the package's ``__init__``. The top
level (``raylane`` itself) is the first check's.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "raylane"


def _module_name(path: Path, package: Path = PACKAGE) -> tuple[str, bool]:
    """The dotted name of a file under ``package`` and whether it is a package's ``__init__``."""
    parts = ["raylane", *path.relative_to(package).with_suffix("").parts]
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
        module, is_package = _module_name(path, package)
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


def _modules(package: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Every module under ``package`` by dotted name: its file and whether it is a package's ``__init__``."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        module, is_package = _module_name(path, package)
        out[module] = (path, is_package)
    return out


def _targets(node: ast.AST, module: str, is_package: bool, modules) -> list[str]:
    """The modules one import node loads by name: ``from P import x`` names ``P.x`` when that is a module, else
    ``P`` (``x`` is then a name defined in ``P``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    prefix = _imported(node, module, is_package)[0]
    return [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix for alias in node.names]


def _member(package: str, module: str) -> str | None:
    """The direct member of ``package`` that ``module`` lies in (``__init__`` for the package itself), or None."""
    if module == package:
        return "__init__"
    if module.startswith(package + "."):
        return module[len(package) + 1:].split(".")[0]
    return None


def member_graphs(package: Path = PACKAGE) -> dict[str, dict[tuple[str, str], set[str]]]:
    """Per subpackage (dotted name), the edges between its direct members, each with the files that make it."""
    modules = _modules(package)
    subpackages = [m for m, (_, is_package) in modules.items() if is_package and m != "raylane"]
    graphs: dict[str, dict[tuple[str, str], set[str]]] = {sub: defaultdict(set) for sub in subpackages}
    for module, (path, is_package) in modules.items():
        found = [target for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
                 if isinstance(node, (ast.Import, ast.ImportFrom))
                 for target in _targets(node, module, is_package, modules)]
        for sub in subpackages:
            source = _member(sub, module)
            if source is None:
                continue
            for target in found:
                member = _member(sub, target)
                if member is not None and member != source:
                    graphs[sub][(source, member)].add(str(path.relative_to(package)))
    return graphs


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


def test_nothing_imports_the_command_line():
    """``raylane.cli`` is the top layer: the simulator, the console and the control plane are libraries it uses, and
    none of them imports it (``raylane.sim`` once imported the CLI's error printing, which put it above
    ``raylane.control``)."""
    into = {a: sorted(files) for (a, b), files in import_graph().items() if b == "cli"}
    assert not into, into


def test_members_are_found_by_module_not_by_package():
    modules = {"raylane.sim": None, "raylane.sim.engine": None, "raylane.sim.types": None}

    def targets(code: str, module: str, is_package: bool = False) -> list[str]:
        return _targets(ast.parse(code).body[0], module, is_package, modules)

    assert targets("from raylane.sim import engine, Simulator", "raylane.sim.metrics") == [
        "raylane.sim.engine", "raylane.sim"]
    assert targets("from .types import SimResult", "raylane.sim.replay") == ["raylane.sim.types"]
    assert [_member("raylane.sim", m) for m in ("raylane.sim", "raylane.sim.types", "raylane.simx", "raylane")] == [
        "__init__", "types", None, None]
    assert _member("raylane.scheduling", "raylane.scheduling.ordering.las") == "ordering"


def test_no_import_cycle_inside_a_subpackage():
    graphs = member_graphs()
    assert "raylane.config" in graphs and graphs["raylane.config"], "no import found inside raylane.config"
    report = []
    for sub, edges in sorted(graphs.items()):
        nodes = {member for edge in edges for member in edge}
        for component in strongly_connected(nodes, edges):
            report.append(f"cycle in {sub} among " + ", ".join(sorted(component)) + ":")
            for (a, b), files in sorted(edges.items()):
                if a in component and b in component:
                    report.append(f"  {a} -> {b}: {', '.join(sorted(files))}")
    assert not report, "\n".join(report)
