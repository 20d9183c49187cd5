"""Alertmanager settings: exact errors, URLs, and the TLS context built from them."""

from __future__ import annotations

import ssl

import pytest

from kvwatch.alerting.alertmanager import (
    AlertmanagerSettings,
    SettingsError,
    TLSSettings,
    _ssl_context,
    alerts_url,
    display_url,
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"urls": ("am:9093",)}, "alertmanager.urls[0]: must be an http(s) URL"),
        ({"urls": ("ftp://am",)}, "alertmanager.urls[0]: must be an http(s) URL"),
        ({"resend_interval": 0}, "alertmanager.resend_interval: must be a positive duration"),
        (
            {"username": "u", "password": "p", "bearer_token": "t"},
            "alertmanager: basic auth (username) and bearer_token are mutually exclusive",
        ),
        ({"username": "u"}, "alertmanager: username and password go together"),
        (
            {"tls": TLSSettings(key_file="/k.pem")},
            "alertmanager.tls.key_file: needs tls.cert_file",
        ),
    ],
)
def test_it_rejects_settings_that_cannot_work(kwargs: dict[str, object], message: str) -> None:
    """Each impossible combination fails with its exact sentence."""
    settings = {"urls": ("http://am:9093",), **kwargs}
    with pytest.raises(SettingsError) as raised:
        AlertmanagerSettings(**settings)  # type: ignore[arg-type]
    assert str(raised.value) == message


def test_the_alerts_path_follows_a_path_prefix() -> None:
    """Alertmanager behind a prefix: <url>/api/v2/alerts, no double slash."""
    assert alerts_url("http://am:9093") == "http://am:9093/api/v2/alerts"
    assert alerts_url("https://gw/alertmanager/") == "https://gw/alertmanager/api/v2/alerts"


def test_the_display_url_drops_credentials() -> None:
    """User info never reaches a metric label or a log line."""
    assert display_url("http://u:secret@am:9093/api/v2/alerts") == "http://am:9093/api/v2/alerts"


def test_insecure_skip_verify_turns_off_certificate_and_hostname_checks() -> None:
    """The escape hatch does what it says, and only when asked."""
    assert _ssl_context(TLSSettings()).verify_mode is ssl.CERT_REQUIRED
    insecure = _ssl_context(TLSSettings(insecure_skip_verify=True))
    assert (insecure.verify_mode, insecure.check_hostname) == (ssl.CERT_NONE, False)


def test_a_missing_ca_file_fails_when_the_client_is_built() -> None:
    """A wrong ca_file path is an error at start-up, not a silent fallback to system CAs."""
    with pytest.raises(FileNotFoundError):
        _ssl_context(TLSSettings(ca_file="/nonexistent/ca.pem"))
