"""Logged tracebacks carry no frame locals, and httpx request logging stays off."""

from __future__ import annotations

import logging
import secrets

import pytest
import structlog

from kvwatch.logs import configure

SECRET = f"kvw-secret-local-{secrets.token_hex(12)}"


def call_engine_with_a_key_in_scope() -> None:
    api_key = SECRET
    headers = {"Authorization": f"Bearer {api_key}"}
    raise ConnectionError(f"engine unreachable ({len(headers)} headers)")


@pytest.mark.parametrize("json", [True, False], ids=["json", "console"])
def test_a_logged_traceback_names_the_failure_but_shows_no_locals(
    capsys: pytest.CaptureFixture[str], json: bool
) -> None:
    """log.exception renders the frames and the error, never the variables in them."""
    configure("debug", json=json)
    try:
        log = structlog.get_logger("kvwatch.test")
        try:
            call_engine_with_a_key_in_scope()
        except ConnectionError:
            log.exception("probe_crashed", endpoint="gone")
        out = capsys.readouterr().out
    finally:
        structlog.reset_defaults()
    assert "call_engine_with_a_key_in_scope" in out
    assert "engine unreachable (1 headers)" in out
    assert SECRET not in out
    assert SECRET.rsplit("-", 1)[1] not in out


def test_httpx_and_httpcore_request_logging_is_off_even_at_debug_level() -> None:
    """At log_level debug, httpx and httpcore still log warnings only (no request lines)."""
    try:
        configure("debug")
        for name in ("httpx", "httpcore", "httpcore.http11", "httpcore.connection"):
            assert logging.getLogger(name).getEffectiveLevel() >= logging.WARNING, name
    finally:
        structlog.reset_defaults()
