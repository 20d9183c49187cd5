"""Hostile and broken endpoints: every bad answer ends in a non-pass verdict that says why.

Each behaviour of :mod:`tests.helpers.hostile` is probed through the real path (config →
engine adapter → runner → judge → SQLite store) with the client the daemon builds; the
``usage`` tokenizer plans the prompt, so the hostile peer only has to answer the chat call.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.engines.clients import build_http_client
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import SimEndpoint
from kvwatch.store.records import ProbeRow
from kvwatch.store.repository import Store
from tests.helpers.hostile import BEHAVIOURS, hostile_server, self_signed_context
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, targets_and_runner

DEADLINE = "3s"
E = Verdict.ERROR

# behaviour -> (verdict, words the stored reason or error detail must contain)
EXPECTED: dict[str, tuple[Verdict, str]] = {
    "html-error-page": (E, "2xx body is not JSON"),
    "invalid-json": (E, "2xx body is not JSON"),
    "wrong-shape": (E, "2xx body has no choices array"),
    "sse-cut-mid-event": (Verdict.STREAM_ERROR, "stream ended without [DONE] (inside an event"),
    "sse-without-done": (Verdict.STREAM_ERROR, "stream ended without [DONE] (between events"),
    "gigantic-body": (E, "read cap"),
    "slow-drip": (E, f"within the {DEADLINE[:-1]} s deadline"),
    "wrong-content-type": (E, "2xx body is not JSON"),
    "redirect-loop": (E, "HTTP 302: redirected to /redirect-loop/v1/chat/completions"),
    "redirect-elsewhere": (E, "HTTP 307: redirected to http://127.0.0.2:"),
    "connection-reset": (E, "transport failure (read)"),
    "headers-then-silence": (E, f"within the {DEADLINE[:-1]} s deadline"),
    "empty-choices": (E, "2xx body has an empty choices array"),
    "non-utf8": (E, "2xx body is not JSON"),
    "chunked-broken": (E, "transport failure (read)"),
    "content-length-mismatch": (E, "without sending complete message body"),
    "no-content": (E, "2xx body is not JSON (0 bytes)"),
    # A null content is an empty answer: the marker is missing, which is the finding.
    "null-content": (Verdict.MARKER_MISSING, "lacks the marker"),
    "negative-usage": (E, "the engine's usage report cannot be believed: usage.prompt_tokens -7"),
    "huge-sse-lines": (E, "SSE event larger than 1048576 characters"),
    "http09-garbage": (E, "transport failure (read)"),
    "gzip-bomb": (E, "read cap"),
    "sse-frames-not-json": (E, "SSE frame is not JSON: hello world"),
    # What follows [DONE] (here the marker itself) is not part of the answer, in any read.
    "sse-text-after-done": (
        Verdict.MARKER_MISSING,
        "lacks the marker; the stream went on after its terminator (3 events, not read)",
    ),
    # Usage the engine cannot mean: no pass, even with the marker recalled.
    "impossible-usage": (
        E,
        "the engine's usage report cannot be believed: prompt_tokens 1000000000000 on a "
        "4096-token window",
    ),
    "string-usage": (
        E,
        'the engine\'s usage report cannot be believed: usage.prompt_tokens "4096"',
    ),
    "tls-to-plain-http": (E, "SSL"),
    "tls-self-signed": (E, "CERTIFICATE_VERIFY_FAILED"),
}


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str
    row: ProbeRow


def entry(name: str, url: str) -> dict[str, Any]:
    return {
        "name": name,
        "url": url,
        "model": "hostile-1",
        "context_window": 4096,
        "tokenizer": "usage",
        "probes": ["under"],
        "timeouts": {"under": DEADLINE},
        "confirm": False,
        "interval": "1m",
        "jitter": "0s",
    }


async def probe_everything(store: Store, certs: Path) -> dict[str, Outcome]:
    elsewhere = [SimEndpoint("elsewhere", model="hostile-1", window=4096)]
    async with (
        run_simulator(elsewhere, host="127.0.0.2") as sim,
        hostile_server(elsewhere=sim.url_for("elsewhere")) as plain,
        hostile_server(ssl_context=self_signed_context(certs)) as tls,
        build_http_client() as client,
    ):
        urls = {name: plain.url_for(name) for name in BEHAVIOURS}
        urls["tls-to-plain-http"] = plain.url_for("wrong-shape").replace("http:", "https:")
        urls["tls-self-signed"] = tls.url_for("wrong-shape")
        config = config_for(
            [entry(name, url) for name, url in urls.items()], database="sqlite:///unused.db"
        )
        targets, runner, _ = targets_and_runner(config, store, client)
        reports = await asyncio.gather(
            *(runner.run(targets[name], ProbeKind.UNDER) for name in urls)
        )
    outcomes = {}
    for name, report in zip(urls, reports, strict=True):
        row = get_probe(store, report.probe_id)
        assert row is not None
        outcomes[name] = Outcome(report.verdict, report.reason, row)
    return outcomes


@pytest.fixture(scope="module")
def outcomes(sqlite_store: Store) -> dict[str, Outcome]:
    """Every behaviour probed once, concurrently (the slow ones only cost one deadline)."""
    with tempfile.TemporaryDirectory() as certs:
        return asyncio.run(probe_everything(sqlite_store, Path(certs)))


def test_the_matrix_covers_every_behaviour_of_the_hostile_server() -> None:
    """No behaviour of the hostile server goes untested, and there are at least twenty."""
    assert set(BEHAVIOURS) <= set(EXPECTED)
    assert len(EXPECTED) >= 20


@pytest.mark.parametrize("behaviour", sorted(EXPECTED))
def test_a_hostile_answer_ends_in_its_non_pass_verdict_with_a_useful_reason(
    outcomes: dict[str, Outcome], behaviour: str
) -> None:
    """The probe is stored done, never as a pass, and its reason names what was wrong."""
    verdict, words = EXPECTED[behaviour]
    got = outcomes[behaviour]
    evidence = f"{got.verdict}: {got.reason} | detail: {got.row.error_detail}"
    assert got.verdict is not Verdict.PASS, evidence
    assert got.verdict is verdict, evidence
    assert got.row.verdict == verdict.value
    assert words in f"{got.reason}\n{got.row.error_detail}", evidence
