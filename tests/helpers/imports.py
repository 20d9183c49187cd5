"""kvwatch's own import graph, read from the source with ``ast`` (nothing is imported).

Every ``import`` counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``): a deferred import still ties the two modules together. ``from a import b``
is an edge to ``a.b`` when that is a module, else to ``a``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "kvwatch"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _imported(
    node: ast.AST, here: str, is_package: bool, known: Mapping[str, Path]
) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = here.split(".")
            base = base if is_package else base[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, node.module] if node.module else base)
        else:
            source = node.module or ""
        for alias in node.names:
            candidate = f"{source}.{alias.name}"
            yield candidate if candidate in known else source


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each kvwatch module → the kvwatch modules it imports."""
    known = modules(root)
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for node in ast.walk(tree):
            for imported in _imported(node, name, path.name == "__init__.py", known):
                if imported in known and imported != name:
                    targets.add(imported)
        edges[name] = targets
    return edges


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


# The layering contracts: (importer package, imported package, allowed exceptions, why).
CONTRACTS: tuple[tuple[str, str, frozenset[str], str], ...] = (
    ("kvwatch.canary", "kvwatch", frozenset({"kvwatch.canary"}), "canary is the pure core"),
    (
        "kvwatch.store",
        "kvwatch.probe",
        frozenset({"kvwatch.probe.model"}),
        "the store keeps probes; it does not run them",
    ),
    (
        "kvwatch.alerting",
        "kvwatch.probe",
        frozenset({"kvwatch.probe.model"}),
        "alerting decides on results; it does not run probes",
    ),
    ("kvwatch.engines", "kvwatch.store", frozenset(), "engines talk HTTP, never to the database"),
)


def broken_contracts(edges: Mapping[str, set[str]]) -> list[str]:
    """One line per import that breaks a contract."""
    broken = []
    for importer, imported, allowed, why in CONTRACTS:
        for module in sorted(edges):
            if not in_package(module, importer):
                continue
            for target in sorted(edges[module]):
                if not in_package(target, imported):
                    continue
                if any(in_package(target, a) for a in allowed):
                    continue
                broken.append(f"{module} imports {target}: {why}")
    return broken
