"""Fetching each kind of source's list: the I/O around :mod:`kvwatch.discovery.formats`.

A source's :meth:`Source.fetch` returns the endpoints it lists now, ``None`` when nothing
changed since the last good fetch (a file_sd file not touched), or raises
:class:`FetchError` with a reason for the failure metric. It never keeps a list itself: the
last good list lives in :class:`kvwatch.discovery.loop.DiscoveryLoop`.
"""

from __future__ import annotations

import asyncio
import glob
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import httpx
from pydantic import SecretStr

from kvwatch.config.discovery import DiscoverySource
from kvwatch.config.resolve import EndpointSpec
from kvwatch.config.sections import Defaults
from kvwatch.discovery.endpoints import from_groups, from_models
from kvwatch.discovery.formats import (
    ListError,
    TargetGroup,
    parse_models,
    parse_sd_json,
    parse_sd_text,
)

# How often a file_sd source looks at its files' modification times: changes are picked up
# within this, and re-read only when a file changed (or at refresh_interval regardless).
FILE_POLL_SECONDS = 5.0
# A listing is small: a source that cannot answer in this long is down.
FETCH_TIMEOUT_SECONDS = 30.0
# The most of a listing read: a runaway answer must not fill memory.
MAX_LIST_BYTES = 16 * 1024 * 1024
# Prometheus sends this on every http_sd request (https://prometheus.io/docs/prometheus/latest/http_sd/).
REFRESH_HEADER = "X-Prometheus-Refresh-Interval-Seconds"


class FetchError(Exception):
    """A refresh that failed; ``reason`` is the failure metric's label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Source(Protocol):
    name: str
    config: DiscoverySource
    defaults: Defaults
    # Seconds between two fetches.
    poll_seconds: float

    async def fetch(self) -> list[EndpointSpec] | None: ...


def build_source(config: DiscoverySource, defaults: Defaults, client: httpx.AsyncClient) -> Source:
    if config.file_sd is not None:
        return FileSource(config, defaults)
    if config.http_sd is not None:
        return HttpSource(config, defaults, client)
    return GatewaySource(config, defaults, client)


class FileSource:
    def __init__(
        self,
        config: DiscoverySource,
        defaults: Defaults,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert config.file_sd is not None
        self.name = config.name
        self.config = config
        self.defaults = defaults
        self.patterns = tuple(config.file_sd.files)
        self.refresh_seconds = config.file_sd.refresh_interval
        self.poll_seconds = min(FILE_POLL_SECONDS, self.refresh_seconds)
        self._clock = clock
        self._seen: tuple[tuple[str, int, int], ...] | None = None
        self._read_at = 0.0

    async def fetch(self) -> list[EndpointSpec] | None:
        return await asyncio.to_thread(self._fetch)

    def _fetch(self) -> list[EndpointSpec] | None:
        paths = sorted({p for pattern in self.patterns for p in glob.glob(pattern)})
        try:
            stamp = tuple((p, (s := Path(p).stat()).st_mtime_ns, s.st_size) for p in paths)
        except OSError as exc:
            raise FetchError("read", f"cannot read {exc.filename}: {exc.strerror}") from None
        due = self._clock() - self._read_at >= self.refresh_seconds
        if stamp == self._seen and not due:
            return None
        groups: list[TargetGroup] = []
        for path in paths:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise FetchError("read", f"cannot read {path}: {exc}") from None
            try:
                groups.extend(parse_sd_text(text))
            except ListError as exc:
                raise FetchError("invalid", f"{path}: {exc}") from None
        specs = _built(", ".join(paths), lambda: from_groups(self.config, self.defaults, groups))
        # Only a good read is remembered: a bad file is read (and reported) again next time.
        self._seen, self._read_at = stamp, self._clock()
        return specs


class HttpSource:
    def __init__(
        self, config: DiscoverySource, defaults: Defaults, client: httpx.AsyncClient
    ) -> None:
        http = config.http_sd
        assert http is not None
        self.name = config.name
        self.config = config
        self.defaults = defaults
        self.url = http.url
        self.poll_seconds = http.refresh_interval
        self.client = client
        headers = {REFRESH_HEADER: f"{http.refresh_interval:g}"}
        bearer = http.bearer_token or (
            http.bearer_token_file.value if http.bearer_token_file else None
        )
        if bearer is not None:
            headers["Authorization"] = f"Bearer {bearer.get_secret_value()}"
        self.headers = headers
        self.auth: tuple[str, str] | None = None
        if http.basic_auth is not None:
            auth = http.basic_auth
            password = auth.password or (auth.password_file.value if auth.password_file else None)
            assert password is not None  # the config requires one
            self.auth = (auth.username, password.get_secret_value())

    async def fetch(self) -> list[EndpointSpec]:
        body = await _get(self.client, self.url, self.headers, self.auth)
        try:
            groups = parse_sd_json(body)
        except ListError as exc:
            raise FetchError("invalid", f"{self.url}: {exc}") from None
        return _built(self.url, lambda: from_groups(self.config, self.defaults, groups))


class GatewaySource:
    def __init__(
        self, config: DiscoverySource, defaults: Defaults, client: httpx.AsyncClient
    ) -> None:
        gateway = config.gateway
        assert gateway is not None
        self.name = config.name
        self.config = config
        self.defaults = defaults
        self.api = gateway.api
        self.poll_seconds = gateway.refresh_interval
        self.client = client
        self.url = (
            f"{gateway.url}/model/info" if gateway.api == "litellm" else f"{gateway.url}/models"
        )
        key = _template_key(config)
        self.headers = {} if key is None else {"Authorization": f"Bearer {key.get_secret_value()}"}

    async def fetch(self) -> list[EndpointSpec]:
        body = await _get(self.client, self.url, self.headers, None)
        try:
            models = parse_models(self.api, body)
        except ListError as exc:
            raise FetchError("invalid", f"{self.url}: {exc}") from None
        return _built(self.url, lambda: from_models(self.config, self.defaults, models))


def _template_key(config: DiscoverySource) -> SecretStr | None:
    """The key the probes of this source's endpoints send: it lists their models too."""
    template = config.template
    if template.api_key_file is not None:
        return template.api_key_file.value
    if template.api_key is not None:
        return template.api_key
    for tenant in template.tenants or ():
        return tenant.api_key_file.value if tenant.api_key_file else tenant.api_key
    return None


async def _get(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], auth: tuple[str, str] | None
) -> bytes:
    try:
        async with client.stream(
            "GET", url, headers=headers, auth=auth, timeout=FETCH_TIMEOUT_SECONDS
        ) as response:
            if response.status_code != 200:
                raise FetchError("http_status", f"{url}: HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body.extend(chunk)
                if len(body) > MAX_LIST_BYTES:
                    raise FetchError("invalid", f"{url}: the list is over {MAX_LIST_BYTES} bytes")
            return bytes(body)
    except httpx.HTTPError as exc:
        raise FetchError("unreachable", f"{url}: {type(exc).__name__}: {exc}") from None


def _built(where: str, build: Callable[[], Sequence[EndpointSpec]]) -> list[EndpointSpec]:
    try:
        return list(build())
    except ListError as exc:
        raise FetchError("invalid", f"{where}: {exc}") from None
