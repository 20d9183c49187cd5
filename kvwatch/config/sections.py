"""The endpoint part of the configuration's schema: ``defaults:`` and ``endpoints:``, with the
blocks they share (credentials, TLS, timeouts), as strict pydantic models.

Kept apart from :mod:`kvwatch.config.model` (the whole file) so that
:mod:`kvwatch.config.resolve`, which merges these into each endpoint, sits between the two.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvwatch.canary.burst import DEFAULT_PROMPT_TOKENS, DEFAULT_SIZES, MAX_SIZE, MIN_PROMPT_TOKENS
from kvwatch.canary.cache import DEFAULT_DOCUMENT_TOKENS, MIN_DOCUMENT_TOKENS
from kvwatch.config.types import (
    Duration,
    EndpointName,
    Flag,
    HttpUrl,
    Jitter,
    LabelName,
    MarkerDepth,
    NonBlank,
    PositiveInt,
    ReadableFile,
    Secret,
    SecretFilePath,
    TenantName,
    TokenizerSpec,
    invalid,
)

Flavour = Literal["openai", "vllm", "sglang", "llamacpp", "tgi", "ollama", "anthropic"]
LogLevel = Literal["debug", "info", "warning", "error"]

# The kinds a user schedules. "edge" is not among them: it runs with the capacity check
# whenever the engine reports a KV pool smaller than its window. "burst" is opt-in: it puts
# concurrent load on the engine, which a team should choose; so is "cache" (a document sent
# five or six times a cycle, most of it served from the engine's prefix cache).
ScheduledKind = Literal["under", "over", "baseline", "capacity", "burst", "cache"]
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
    # A whole burst cycle: the solo request, then every concurrent one (short prompts, but
    # an engine with few slots serves them in turn).
    burst: Duration = 300.0
    # A whole cache cycle: five or six requests about a few-thousand-token document.
    cache: Duration = 300.0


class TimeoutOverrides(_Strict):
    """An endpoint's ``timeouts``: each kind it leaves out keeps the default."""

    under: Duration | None = None
    over: Duration | None = None
    baseline: Duration | None = None
    capacity: Duration | None = None
    edge: Duration | None = None
    bisect: Duration | None = None
    burst: Duration | None = None
    cache: Duration | None = None


def _unique_depths(depths: list[float]) -> None:
    seen: set[float] = set()
    for depth in depths:
        if depth in seen:
            raise invalid(f"lists marker depth {depth} twice")
        seen.add(depth)


class Burst(_Strict):
    """The burst probe's shape: how many requests at once, cycle after cycle (``sizes``, in
    turn), and the prompt tokens of each request."""

    sizes: list[int] = Field(default=list(DEFAULT_SIZES))
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS

    @field_validator("sizes", mode="before")
    @classmethod
    def _sizes(cls, sizes: object) -> list[int]:
        if not isinstance(sizes, list) or not sizes:
            raise invalid("must be a non-empty list of burst sizes")
        seen: set[int] = set()
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, int) or not 2 <= size <= MAX_SIZE:
                raise invalid(
                    f"burst size {size!r} must be a whole number from 2 to {MAX_SIZE} "
                    "(1 is the solo request every cycle sends anyway)"
                )
            if size in seen:
                raise invalid(f"lists burst size {size} twice")
            seen.add(size)
        return sizes

    @field_validator("prompt_tokens", mode="before")
    @classmethod
    def _prompt_tokens(cls, tokens: object) -> int:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < MIN_PROMPT_TOKENS:
            raise invalid(f"must be a whole number of at least {MIN_PROMPT_TOKENS} tokens")
        return tokens


class Intervals(_Strict):
    """Per-kind intervals (``intervals: {capacity: 1m, under: 1h}``): a kind left out runs
    every ``interval``, except the self-report check, which is free and runs every minute
    (kvwatch.config.resolve.CAPACITY_INTERVAL_SECONDS)."""

    under: Duration | None = None
    over: Duration | None = None
    baseline: Duration | None = None
    capacity: Duration | None = None
    burst: Duration | None = None
    cache: Duration | None = None


class Budget(_Strict):
    """Prompt and answer tokens the canaries may spend on the endpoint per day
    (kvwatch.canary.spend)."""

    tokens_per_day: PositiveInt


class Cache(_Strict):
    """The cache probe's shape: the planted document's size and, optionally, how long after
    planting a document is asked about again (the returning session; off by default)."""

    document_tokens: int = DEFAULT_DOCUMENT_TOKENS
    return_after: Duration | None = None

    @field_validator("document_tokens", mode="before")
    @classmethod
    def _document_tokens(cls, tokens: object) -> int:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < MIN_DOCUMENT_TOKENS:
            raise invalid(f"must be a whole number of at least {MIN_DOCUMENT_TOKENS} tokens")
        return tokens


class Defaults(_Strict):
    interval: Duration = 900.0
    intervals: Intervals = Intervals()
    budget: Budget | None = None
    # Run the boundary canaries at once when the engine's self-report changes (a redeploy),
    # but not twice within the gap: a flapping engine must not burn the GPU.
    on_change: Flag = True
    on_change_min_gap: Duration = 600.0
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
    burst: Burst = Burst()
    cache: Cache = Cache()

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


class EndpointSettings(_Strict):
    """Every setting of an endpoint except what names and addresses it (name, url, model):
    the fields of an ``endpoints:`` entry and of a discovery source's ``template:``."""

    flavour: Flavour = "openai"
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
    intervals: Intervals | None = None
    budget: Budget | None = None
    on_change: Flag | None = None
    on_change_min_gap: Duration | None = None
    max_tokens: PositiveInt | None = None
    baseline_tokens: PositiveInt | None = None
    stream: Flag | None = None
    jitter: Jitter | None = None
    timeouts: TimeoutOverrides | None = None
    marker_depths: list[MarkerDepth] | None = Field(default=None, min_length=1)
    confirm: Flag | None = None
    served_window: Flag | None = None
    body_limit_bytes: PositiveInt | None = None
    burst: Burst | None = None
    cache: Cache | None = None

    @model_validator(mode="after")
    def _consistent(self) -> EndpointSettings:
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


class Endpoint(EndpointSettings):
    """An ``endpoints:`` entry: the settings, and what names and addresses the endpoint."""

    name: EndpointName
    url: HttpUrl
    model: NonBlank
