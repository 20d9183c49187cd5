"""Alertmanager API v2: the wire format of an alert and one POST to one Alertmanager.

Follows Prometheus' notifier (``notifier/notifier.go``): a JSON list of postable alerts
(``labels``, ``annotations``, ``startsAt``, ``endsAt``, ``generatorURL``) POSTed to
``<url>/api/v2/alerts``; any 2xx is success. Unlike Prometheus, a 4xx is told apart from a
5xx: Alertmanager answers 4xx only to a payload it will never accept (a kvwatch bug, or
credentials it refuses), so retrying it is pointless, while a 5xx or a dropped connection
may heal by the next cycle. Which alerts are due, and when, is :mod:`kvwatch.alerting.delivery`.
"""

from __future__ import annotations

import enum
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from kvwatch import __version__
from kvwatch.httpcycles import event_hooks

ALERTS_PATH = "/api/v2/alerts"
# A batch per request, as Prometheus' notifier (MaxBatchSize): bounded bodies, fast rejections.
MAX_BATCH = 256
# Bytes of an error body kept for the log: enough to read Alertmanager's one-line reason.
_ERROR_EXCERPT = 300


class SettingsError(ValueError):
    """Alertmanager settings that cannot work; ``str()`` names the key path."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TLSSettings:
    ca_file: str | None = None  # verify the Alertmanager against this CA bundle
    cert_file: str | None = None  # client certificate (mutual TLS)
    key_file: str | None = None  # its key, when not inside cert_file
    insecure_skip_verify: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertmanagerSettings:
    """The ``alertmanager:`` block of the configuration, already validated and expanded."""

    urls: tuple[str, ...]  # every Alertmanager of an HA set; each receives every alert
    timeout: float = 10.0  # seconds per POST
    resend_interval: float = 60.0  # a firing alert is re-sent this often
    resolved_retention: float = 15 * 60.0  # a resolved alert is re-sent this long
    retry_interval: float = 10.0  # after a 5xx or a network error, try that Alertmanager again
    username: str | None = None  # basic auth
    password: str | None = None
    bearer_token: str | None = None
    tls: TLSSettings = field(default_factory=TLSSettings)

    def __post_init__(self) -> None:
        for i, url in enumerate(self.urls):
            parsed = httpx.URL(url)
            if parsed.scheme not in ("http", "https") or not parsed.host:
                raise SettingsError(f"alertmanager.urls[{i}]: must be an http(s) URL")
        for name in ("timeout", "resend_interval", "resolved_retention", "retry_interval"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"alertmanager.{name}: must be a positive duration")
        if self.bearer_token is not None and self.username is not None:
            raise SettingsError(
                "alertmanager: basic auth (username) and bearer_token are mutually exclusive"
            )
        if (self.username is None) != (self.password is None):
            raise SettingsError("alertmanager: username and password go together")
        if self.tls.key_file is not None and self.tls.cert_file is None:
            raise SettingsError("alertmanager.tls.key_file: needs tls.cert_file")


class Outcome(enum.Enum):
    SENT = "sent"  # 2xx
    REJECTED = "rejected"  # 4xx: dropped, never retried
    FAILED = "failed"  # 5xx, other status, network error: retried


@dataclass(frozen=True, slots=True)
class PostResult:
    outcome: Outcome
    detail: str  # status and body excerpt, or the network error; never credentials


def build_http_client(settings: AlertmanagerSettings) -> httpx.AsyncClient:
    """An HTTP client carrying the settings' auth and TLS options."""
    headers = {"User-Agent": f"kvwatch/{__version__}"}
    if settings.bearer_token is not None:
        headers["Authorization"] = f"Bearer {settings.bearer_token}"
    auth = None
    if settings.username is not None and settings.password is not None:
        auth = httpx.BasicAuth(settings.username, settings.password)
    return httpx.AsyncClient(
        headers=headers,
        auth=auth,
        verify=_ssl_context(settings.tls),
        timeout=settings.timeout,
        # Proxies and CA bundles come from the configuration only, as in Prometheus: an
        # inherited HTTPS_PROXY must not silently reroute pages.
        trust_env=False,
        event_hooks=event_hooks(),
    )


def _ssl_context(tls: TLSSettings) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file is not None:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def alerts_url(base: str) -> str:
    """``<base>/api/v2/alerts``, keeping a path prefix (``http://am/prefix``)."""
    url = httpx.URL(base)
    return str(url.copy_with(path=url.path.rstrip("/") + ALERTS_PATH))


def display_url(url: str) -> str:
    """``url`` without user info: safe for a metric label or a log line."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(username=None, password=None)) if parsed.userinfo else url


def rfc3339(moment: datetime) -> str:
    """Millisecond RFC 3339 in UTC, as Go's strfmt.DateTime writes it."""
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment.isoformat()} cannot be sent to Alertmanager")
    text = moment.astimezone(UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def postable_alert(
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    starts_at: datetime | None,
    ends_at: datetime,
    generator_url: str | None,
) -> dict[str, Any]:
    """One element of the POST body (the OpenAPI ``postableAlert``).

    Empty label values are left out: in Prometheus' data model an empty value is the same
    as no label, and a label that flips between "" and absent would split one alert in two.
    """
    alert: dict[str, Any] = {
        "labels": {k: v for k, v in sorted(labels.items()) if v != ""},
        "annotations": {k: v for k, v in sorted(annotations.items()) if v != ""},
    }
    if starts_at is not None:
        alert["startsAt"] = rfc3339(starts_at)
    alert["endsAt"] = rfc3339(ends_at)
    if generator_url:
        alert["generatorURL"] = generator_url
    return alert


class AlertmanagerClient:
    """POSTs alert batches to one Alertmanager; says whether to retry, never raises for I/O."""

    def __init__(self, url: str, http: httpx.AsyncClient) -> None:
        self.url = alerts_url(url)
        self.name = display_url(self.url)  # the ``alertmanager`` metric label
        self._http = http

    async def post(self, alerts: list[dict[str, Any]]) -> PostResult:
        try:
            response = await self._http.post(self.url, json=alerts)
        except httpx.HTTPError as exc:
            return PostResult(Outcome.FAILED, f"{type(exc).__name__}: {exc}")
        status = response.status_code
        if 200 <= status < 300:
            return PostResult(Outcome.SENT, f"HTTP {status}")
        detail = f"HTTP {status}: {response.text[:_ERROR_EXCERPT].strip()}"
        if 400 <= status < 500:
            return PostResult(Outcome.REJECTED, detail)
        return PostResult(Outcome.FAILED, detail)
