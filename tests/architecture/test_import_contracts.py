"""The layers hold: read from the import graph of the source, without importing it."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.imports import ROOT, broken_contracts, cycles, graph


def test_no_layer_imports_what_it_must_not() -> None:
    """canary imports only canary; store and alerting only the probe model; engines no store."""
    assert broken_contracts(graph()) == []


def test_kvwatch_modules_import_each_other_in_no_circle() -> None:
    """No two kvwatch modules depend on each other, directly or through others."""
    assert cycles(graph()) == []


def test_a_canary_module_importing_the_store_is_reported(tmp_path: Path) -> None:
    """The checker fails on a deliberate violation, naming the import and the reason."""
    package = _tree(tmp_path, {"canary/verdicts.py": "from kvwatch.store import records\n"})
    assert broken_contracts(graph(package)) == [
        "kvwatch.canary.verdicts imports kvwatch.store.records: canary is the pure core"
    ]


def test_alerting_may_import_the_probe_model_but_not_the_runner(tmp_path: Path) -> None:
    """The one exception of the contract is the model."""
    evaluator = "from kvwatch.probe.model import Target\nimport kvwatch.probe.runner\n"
    package = _tree(tmp_path, {"alerting/evaluator.py": evaluator})
    assert broken_contracts(graph(package)) == [
        "kvwatch.alerting.evaluator imports kvwatch.probe.runner: "
        "alerting decides on results; it does not run probes"
    ]


def test_a_circle_through_a_deferred_import_is_found(tmp_path: Path) -> None:
    """An import inside a function still closes a circle."""
    package = _tree(
        tmp_path,
        {
            "probe/runner.py": "from kvwatch.probe import served\n",
            "probe/served.py": "def f():\n    from kvwatch.probe.runner import X\n",
        },
    )
    assert cycles(graph(package)) == [["kvwatch.probe.runner", "kvwatch.probe.served"]]


def test_the_probe_package_has_no_module_over_300_lines() -> None:
    """Each module of the path of one probe stays readable in one sitting."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "probe").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 300
    }
    assert long == {}


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A kvwatch package under ``root`` with the modules in the import paths above."""
    package = root / "kvwatch"
    for name in ("store/records.py", "probe/model.py", "probe/runner.py", "probe/served.py"):
        files.setdefault(name, "")
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in (path.parent, *path.parent.parents):
            if parent == root:
                break
            (parent / "__init__.py").touch()
        path.write_text(text)
    return package
