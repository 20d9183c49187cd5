"""The configuration file's schema (DESIGN §7), as strict pydantic models.

Every model forbids unknown keys: a misspelt key is an error, never a silently ignored
setting. Defaults live here, named once; :mod:`kvwatch.config.resolve` merges them into
each endpoint.
"""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvwatch.config.resolve import EndpointSpec, resolve_endpoint
from kvwatch.config.types import (
    DatabaseUrl,
    Duration,
    EndpointName,
    Flag,
    HttpUrl,
    Jitter,
    LabelName,
    ListenAddress,
    MarkerDepth,
    NonBlank,
    PositiveInt,
    ReadableFile,
    Region,
    Secret,
    SecretFilePath,
    TenantName,
    TokenizerSpec,
    invalid,
    split_listen,
)

Flavour = Literal["openai", "vllm", "sglang", "llamacpp", "tgi", "ollama", "anthropic"]
LogLevel = Literal["debug", "info", "warning", "error"]

# The kinds a user schedules. "edge" is not among them: it runs with the capacity check
# whenever the engine reports a KV pool smaller than its window.
ScheduledKind = Literal["under", "over", "baseline", "capacity"]
DEFAULT_PROBES: tuple[ScheduledKind, ...] = ("under", "over", "baseline", "capacity")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _exclusive(model: BaseModel, first: str, second: str) -> None:
    if getattr(model, first) is not None and getattr(model, second) is not None:
        raise invalid(f"set either {first} or {second}, not both")


class BasicAuth(_Strict):
    username: NonBlank
    password: Secret | None = None
    password_file: SecretFilePath | None = None

    @model_validator(mode="after")
    def _one_password(self) -> BasicAuth:
        _exclusive(self, "password", "password_file")
        if self.password is None and self.password_file is None:
            raise invalid("password or password_file is required")
        return self


class TLS(_Strict):
    ca_file: ReadableFile | None = None
    cert_file: ReadableFile | None = None
    key_file: ReadableFile | None = None
    insecure_skip_verify: Flag = False

    @model_validator(mode="after")
    def _cert_with_key(self) -> TLS:
        if (self.cert_file is None) != (self.key_file is None):
            raise invalid("cert_file and key_file must be set together")
        return self


class Alertmanager(_Strict):
    urls: list[HttpUrl] = []
    resend_interval: Duration = 60.0
    timeout: Duration = 10.0
    basic_auth: BasicAuth | None = None
    bearer_token: Secret | None = None
    bearer_token_file: SecretFilePath | None = None
    tls: TLS = TLS()
    # kvwatch's own public base URL, for generatorURL links in alerts.
    external_url: HttpUrl | None = None

    @model_validator(mode="after")
    def _one_credential(self) -> Alertmanager:
        _exclusive(self, "bearer_token", "bearer_token_file")
        has_bearer = self.bearer_token is not None or self.bearer_token_file is not None
        if has_bearer and self.basic_auth is not None:
            raise invalid("set either basic_auth or a bearer token, not both")
        return self


class Timeouts(_Strict):
    # A 1M-token prefill can take minutes: "under" needs the most patience.
    under: Duration = 600.0
    over: Duration = 300.0
    baseline: Duration = 120.0
    capacity: Duration = 30.0
    # Just over the KV pool: as long a prefill as under.
    edge: Duration = 600.0
    # One step of the served-window search: up to as long a prefill as under.
    bisect: Duration = 600.0


class TimeoutOverrides(_Strict):
    """An endpoint's ``timeouts``: each kind it leaves out keeps the default."""

    under: Duration | None = None
    over: Duration | None = None
    baseline: Duration | None = None
    capacity: Duration | None = None
    edge: Duration | None = None
    bisect: Duration | None = None


def _unique_depths(depths: list[float]) -> None:
    seen: set[float] = set()
    for depth in depths:
        if depth in seen:
            raise invalid(f"lists marker depth {depth} twice")
        seen.add(depth)


class Defaults(_Strict):
    interval: Duration = 900.0
    max_tokens: PositiveInt = 32
    baseline_tokens: PositiveInt = 1536
    stream: Flag = True
    # None: not written by the user, so each endpoint's jitter follows its own interval
    # (see resolve.default_jitter); a jitter the user wrote is checked against the interval.
    jitter: Jitter | None = None
    timeouts: Timeouts = Timeouts()
    # Fraction of the filler placed before the marker; 0.0 puts it at the very start.
    marker_depths: list[MarkerDepth] = Field(default=[0.0], min_length=1)
    # Re-check a critical failure once before paging (DESIGN §2).
    confirm: Flag = True
    # After a window failure, search for the largest prompt the endpoint serves whole.
    served_window: Flag = True
    body_limit_bytes: PositiveInt = 4 * 1024 * 1024

    @model_validator(mode="after")
    def _depths(self) -> Defaults:
        _unique_depths(self.marker_depths)
        return self


class Tenant(_Strict):
    """A named credential of an endpoint: one customer identity kvwatch probes as."""

    name: TenantName
    api_key: Secret | None = None
    api_key_file: SecretFilePath | None = None

    @model_validator(mode="after")
    def _one_key(self) -> Tenant:
        _exclusive(self, "api_key", "api_key_file")
        if self.api_key is None and self.api_key_file is None:
            raise invalid("api_key or api_key_file is required")
        return self


class Endpoint(_Strict):
    name: EndpointName
    url: HttpUrl
    flavour: Flavour = "openai"
    model: NonBlank
    context_window: PositiveInt | None = None
    kv_pool_tokens: PositiveInt | None = None
    api_key: Secret | None = None
    api_key_file: SecretFilePath | None = None
    # Under and edge probes run under each tenant's credentials in turn, so an answer given
    # to one tenant that holds another's marker is caught as a cross-tenant leak.
    tenants: list[Tenant] | None = None
    tokenizer: TokenizerSpec = "server"
    probes: list[ScheduledKind] = Field(default=list(DEFAULT_PROBES), min_length=1)
    labels: dict[LabelName, str] = {}
    # Overrides of `defaults`; None means "inherit".
    interval: Duration | None = None
    max_tokens: PositiveInt | None = None
    baseline_tokens: PositiveInt | None = None
    stream: Flag | None = None
    jitter: Jitter | None = None
    timeouts: TimeoutOverrides | None = None
    marker_depths: list[MarkerDepth] | None = Field(default=None, min_length=1)
    confirm: Flag | None = None
    served_window: Flag | None = None
    body_limit_bytes: PositiveInt | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Endpoint:
        _exclusive(self, "api_key", "api_key_file")
        seen: set[str] = set()
        for kind in self.probes:
            if kind in seen:
                raise invalid(f'lists probe kind "{kind}" twice')
            seen.add(kind)
        if self.marker_depths is not None:
            _unique_depths(self.marker_depths)
        return self

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, tenants: list[Tenant] | None) -> list[Tenant] | None:
        if tenants is None:
            return None
        if len(tenants) < 2:
            # One identity cannot leak to another: a single key belongs in api_key.
            raise invalid("needs at least two tenants (a single key belongs in api_key)")
        names: set[str] = set()
        for tenant in tenants:
            if tenant.name in names:
                raise invalid(f'lists tenant "{tenant.name}" twice')
            names.add(tenant.name)
        return tenants


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
    answer_excerpt_chars: PositiveInt = 400

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
    endpoints: list[Endpoint] = []

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
