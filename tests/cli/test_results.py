"""`kvwatch results` and `kvwatch show` read the stored history back, in every format."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvwatch.cli import main
from tests.helpers.store import Store
from tests.web import conftest as web

LEAKED = web.LEAKED
history = web.history  # the frozen-history fixture of the web tests, shared here


@pytest.fixture
def config(tmp_path: Path, db_url: str, store: Store) -> Path:
    """A config file pointing at the test database (with one endpoint so it validates)."""
    path = tmp_path / "kvwatch.yaml"
    path.write_text(
        f"database: '{db_url}'\n"
        "endpoints:\n"
        "  - name: alpha\n"
        "    url: http://127.0.0.1:9/v1\n"
        "    model: glm-5.3\n"
        "    context_window: 8192\n"
    )
    return path


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_results_filter_and_print_json_lines(config: Path, history: dict[str, int]) -> None:
    """--endpoint/--kind/--verdict/--since filter; json prints one object per probe."""
    code, out, _ = _cli(
        "results", "--config", str(config), "--verdict", "foreign_marker", "--output", "json"
    )
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in rows] == [history["b-confirm"], history["b-under"]]
    assert rows[1] == {
        "id": history["b-under"],
        "started_at": "2026-03-01T12:04:00+00:00",
        "endpoint": "beta",
        "kind": "under",
        "state": "done",
        "verdict": "foreign_marker",
        "http_status": 200,
        "planned_prompt_tokens": 8176,
        "reported_prompt_tokens": 8176,
        "marker_found": False,
        "lost": None,
        "duration_seconds": 3.0,
        "replica": "kvwatch-0",
        "region": None,
        "tenant": None,
        "reason": "foreign_marker (test)",
    }
    code, out, _ = _cli(
        "results", "--config", str(config), "--endpoint", "alpha", "--kind", "over",
        "--since", "2026-03-01T12:00:30Z", "--output", "csv",
    )  # fmt: skip
    assert code == 0
    table = list(csv.DictReader(io.StringIO(out)))
    assert [(r["id"], r["verdict"], r["http_status"]) for r in table] == [
        (str(history["a-over"]), "pass", "400")
    ]


def test_results_filter_by_region(config: Path, store: Store) -> None:
    """--region lists the probes of one region, each naming it; show names it after replica."""
    eu_probe = web._probe(Store(store.engine, region="eu"), "alpha", "under", 0, LEAKED)
    web._probe(Store(store.engine, region="us"), "alpha", "under", 1, "KVW-AAAA-AAAA-AAA2")
    code, out, _ = _cli("results", "--config", str(config), "--region", "eu", "--output", "json")
    assert code == 0
    assert [(r["id"], r["region"]) for r in map(json.loads, out.splitlines())] == [(eu_probe, "eu")]
    code, out, _ = _cli("show", "--config", str(config), str(eu_probe))
    assert code == 0 and "  replica:       kvwatch-0 (region eu)" in out.splitlines()


def test_results_table_lists_newest_first_up_to_the_limit(
    config: Path, history: dict[str, int]
) -> None:
    """The table has a header and --limit rows, newest first, '-' for missing values."""
    code, out, _ = _cli("results", "--config", str(config), "--limit", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["id", "started_at", "endpoint", "kind"]
    assert [line.split()[0] for line in lines[1:]] == [
        str(history["b-running"]),
        str(history["b-confirm"]),
    ]
    assert lines[1].split()[5] == "-"  # the running probe has no verdict yet


def test_results_reject_bad_filters_with_a_sentence(config: Path) -> None:
    """Unknown verdicts and unreadable times are usage errors (exit 2), not tracebacks."""
    code, _, err = _cli("results", "--config", str(config), "--verdict", "fine")
    assert code == 2 and "'fine' is not one of" in err
    code, _, err = _cli("results", "--config", str(config), "--since", "last tuesday")
    assert code == 2
    assert (
        "--since 'last tuesday' is neither a duration (e.g. 24h) nor an ISO 8601 time "
        "(e.g. 2026-03-01T12:00:00Z)" in err
    )


def test_show_prints_all_evidence_of_a_leak(config: Path, history: dict[str, int]) -> None:
    """`show` names the leaked marker, its source probe, the confirmation and the excerpt."""
    code, out, _ = _cli("show", "--config", str(config), str(history["b-under"]))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"probe {history['b-under']}: foreign_marker (critical)"
    assert f"  confirmed by:  probe {history['b-confirm']}" in lines
    assert "  marker:        KVW-CCCC-CCCC-CCC1 MISSING (depth 0.00)" in lines
    assert (
        f"  LEAKED MARKER: {LEAKED} of probe {history['b-base']} (beta, "
        "issued 2026-03-01T12:03:00+00:00)" in lines
    )
    assert f'  answer:        "The code is {LEAKED}. Also: Alice\'s card 4111-1111"' in lines
    assert f"  trace id:      {web.TRACE_ID}" in lines


def test_show_says_a_probe_from_before_tracing_has_no_trace_id(
    config: Path, history: dict[str, int]
) -> None:
    """A row stored without a trace id prints a dash, not an empty or invented id."""
    code, out, _ = _cli("show", "--config", str(config), str(history["b-confirm"]))
    assert code == 0
    assert "  trace id:      -" in out.splitlines()


def test_show_json_is_the_api_shape(config: Path, history: dict[str, int]) -> None:
    """`show --output json` prints the /api/v1/probes/{id} object."""
    code, out, _ = _cli("show", "--config", str(config), str(history["a-over"]), "--output", "json")
    assert code == 0
    probe = json.loads(out)
    assert (probe["id"], probe["kind"], probe["http_status"], probe["error_body"]) == (
        history["a-over"],
        "over",
        400,
        '{"error": "context length exceeded"}',
    )
    assert probe["url"] == f"/probes/{history['a-over']}"


def test_show_of_an_unknown_probe_exits_1(config: Path, history: dict[str, int]) -> None:
    """A probe id that does not exist is said so on stderr with exit code 1."""
    code, _, err = _cli("show", "--config", str(config), "999999")
    assert (code, err) == (1, "no probe 999999\n")


def test_results_filter_by_tenant_and_show_names_both_tenants_of_a_leak(
    config: Path, store: Store
) -> None:
    """--tenant lists one tenant's probes; show prints the tenant and the leaked marker's."""
    from kvwatch.canary.model import ForeignMarker

    source = web._probe(store, "alpha", "baseline", 0, LEAKED, tenant="acme")
    victim = web._probe(store, "alpha", "under", 1, "KVW-AAAA-AAAA-AAA2", tenant="globex")
    leak = ForeignMarker(LEAKED, source, "alpha", web.T0, tenant="acme")
    store.finish_probe(victim, web._outcome(1, "cross_tenant_leak", 1.0, foreign_markers=[leak]))
    code, out, _ = _cli(
        "results", "--config", str(config), "--tenant", "globex", "--output", "json"
    )
    assert code == 0
    assert [(r["id"], r["tenant"]) for r in map(json.loads, out.splitlines())] == [
        (victim, "globex")
    ]
    code, out, _ = _cli("show", "--config", str(config), str(victim))
    lines = out.splitlines()
    assert code == 0 and "  tenant:        globex" in lines
    assert (
        f"  LEAKED MARKER: {LEAKED} of probe {source} (alpha, tenant acme, "
        "issued 2026-03-01T12:00:00+00:00)" in lines
    )
