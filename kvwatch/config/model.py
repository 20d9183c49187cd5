"""The configuration file's schema (DESIGN §7), as strict pydantic models.

Every model forbids unknown keys: a misspelt key is an error, never a silently ignored
setting. This module is the whole file; the endpoint part (``defaults:``, ``endpoints:``) is in
:mod:`kvwatch.config.sections`, and :mod:`kvwatch.config.resolve` merges its defaults into
each endpoint. Defaults are named once, in the models.
"""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import Field, field_validator, model_validator

from kvwatch.config.discovery import DiscoverySource, unique_sources
from kvwatch.config.resolve import EndpointSpec, resolve_endpoint
from kvwatch.config.sections import (
    Alertmanager,
    BasicAuth,
    Defaults,
    Endpoint,
    LogLevel,
    _exclusive,
    _Strict,
)
from kvwatch.config.types import (
    DatabaseUrl,
    Duration,
    Flag,
    HeaderName,
    ListenAddress,
    NonBlank,
    PositiveInt,
    Region,
    Secret,
    SecretFilePath,
    invalid,
    split_listen,
)
from kvwatch.limits import ANSWER_EXCERPT_CHARS


class Web(_Strict):
    """Who may read the UI and API, and how much of an answer kvwatch keeps."""

    bearer_token: Secret | None = None
    bearer_token_file: SecretFilePath | None = None
    basic_auth: BasicAuth | None = None
    # Put /metrics, /healthz and /readyz behind the same credentials.
    protect_metrics: Flag = False
    # Answer excerpts are evidence, but in the incident kvwatch exists to catch they hold
    # other users' data: keep (store and show) this many characters, or none at all.
    answer_excerpts: Flag = True
    answer_excerpt_chars: PositiveInt = ANSWER_EXCERPT_CHARS

    @model_validator(mode="after")
    def _one_credential(self) -> Web:
        _exclusive(self, "bearer_token", "bearer_token_file")
        has_bearer = self.bearer_token is not None or self.bearer_token_file is not None
        if has_bearer and self.basic_auth is not None:
            raise invalid("set either basic_auth or a bearer token, not both")
        return self


class Retention(_Strict):
    # How long probe results are kept; probes with a critical verdict are evidence of an
    # incident (a leak names other users' requests) and are kept longer.
    probes: Duration = 30 * 86400.0
    critical: Duration = 180 * 86400.0
    # How often the daemon prunes.
    every: Duration = 3600.0

    @model_validator(mode="after")
    def _critical_not_shorter(self) -> Retention:
        if self.critical < self.probes:
            raise invalid("critical must be at least as long as probes")
        return self


class Trace(_Strict):
    """The trace context every probe request carries (kvwatch.engines.tracing): W3C
    ``traceparent`` by default, B3's single header for gateways that read only that, or
    none. ``header`` renames it, for a gateway that forwards only a header of its own."""

    format: Literal["w3c", "b3", "off"] = "w3c"
    header: HeaderName | None = None

    @model_validator(mode="after")
    def _header_sent(self) -> Trace:
        if self.format == "off" and self.header is not None:
            raise invalid("header has no effect with format off: remove one of them")
        return self


class Config(_Strict):
    # repr=False: a database URL may carry a password.
    database: DatabaseUrl = Field(default="sqlite:///kvwatch.db", repr=False)
    listen: ListenAddress = "127.0.0.1:9464"
    # Stored with each probe; several replicas share one database.
    replica: NonBlank | None = None
    # Multi-region mode: the region this kvwatch probes from. Every region runs every slot,
    # and its alerts carry a `region` label; replicas share work only within their region.
    region: Region | None = None
    log_level: LogLevel = "info"
    alertmanager: Alertmanager = Alertmanager()
    defaults: Defaults = Defaults()
    retention: Retention = Retention()
    web: Web = Web()
    trace: Trace = Trace()
    endpoints: list[Endpoint] = []  # noqa: RUF012 (pydantic copies field defaults)
    # Sources of endpoints beside the static list (kvwatch.discovery).
    discovery: list[DiscoverySource] = []  # noqa: RUF012 (pydantic copies field defaults)

    @field_validator("discovery")
    @classmethod
    def _unique_sources(cls, sources: list[DiscoverySource]) -> list[DiscoverySource]:
        return unique_sources(sources)

    @property
    def replica_id(self) -> str:
        return self.replica if self.replica is not None else socket.gethostname()

    @property
    def listen_host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return split_listen(self.listen)[1]

    def resolved_endpoints(self) -> list[EndpointSpec]:
        """Every endpoint with its defaults merged in, every field concrete."""
        return [resolve_endpoint(endpoint, self.defaults) for endpoint in self.endpoints]

    def endpoint(self, name: str) -> EndpointSpec:
        """The resolved endpoint called ``name``; raises ``KeyError`` if there is none."""
        for spec in self.resolved_endpoints():
            if spec.name == name:
                return spec
        raise KeyError(name)
