"""No kvwatch function runs over 60 lines, except a few declarative tables.

A function is measured from its ``def`` line to its last line (decorators aside), nested
functions included: a builder of route handlers is as long as the handlers it holds. Read
from the source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.imports import ROOT, module_name

LIMIT = 60

# Functions allowed to run longer: each is a table written out as code, one entry after
# another, with no branching to follow. Splitting one would scatter the table, not simplify it.
TABLES = {
    # The nine default alert policies, one ``alert(...)`` entry each with why it pages as it does.
    "kvwatch.alerting.policy._defaults",
    # Registers every probe metric: one name, help text and label set after another.
    "kvwatch.metrics.ProbeMetrics.__init__",
}


def functions(root: Path = ROOT) -> Iterator[tuple[str, int]]:
    """Every function and method under ``root`` as (qualified name, lines it spans)."""
    for path in sorted(root.rglob("*.py")):
        yield from _functions(ast.parse(path.read_text()), module_name(path, root))


def _functions(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}.{child.name}"
            assert child.end_lineno is not None
            yield name, child.end_lineno - child.lineno + 1
            yield from _functions(child, name)
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}.{child.name}")
        else:
            yield from _functions(child, prefix)


def long_functions(root: Path = ROOT) -> dict[str, int]:
    """The functions under ``root`` longer than the limit, with their length."""
    return {name: lines for name, lines in functions(root) if lines > LIMIT}


def test_no_function_outside_the_tables_runs_over_60_lines() -> None:
    """A function longer than a screen is split into named helpers, unless it is a table."""
    long = {name: n for name, n in long_functions().items() if name not in TABLES}
    assert long == {}


def test_every_listed_table_exists_and_is_still_over_60_lines() -> None:
    """The allow-list shrinks when a table is shortened, renamed or removed."""
    stale = TABLES - set(long_functions())
    assert stale == set()


def test_a_long_nested_function_is_found_by_its_qualified_name(tmp_path: Path) -> None:
    """The measure sees methods and nested functions, and counts a nested body in its parent."""
    package = tmp_path / "kvwatch"
    package.mkdir()
    body = "".join("        x = 1\n" for _ in range(LIMIT - 1))
    (package / "long.py").write_text(f"class C:\n    def m(self):\n{body}        return x\n")
    assert long_functions(package) == {"kvwatch.long.C.m": LIMIT + 1}
