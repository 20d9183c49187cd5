"""The ``discovery:`` part of the configuration's schema: sources of endpoints beside the
static ``endpoints:`` list, each with the template applied to what it finds.

The three kinds follow what existing tooling already produces: Prometheus' ``file_sd`` and
``http_sd`` formats (https://prometheus.io/docs/prometheus/latest/http_sd/), and a gateway's
own model list. Fetching and parsing live in :mod:`kvwatch.discovery`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from kvwatch.config.sections import BasicAuth, EndpointSettings, _exclusive, _Strict
from kvwatch.config.types import (
    Duration,
    EndpointName,
    HttpUrl,
    NonBlank,
    Secret,
    SecretFilePath,
    base_dir,
    invalid,
)

GatewayApi = Literal["openai", "litellm", "openrouter"]


class FileSD(_Strict):
    # Globs, relative to the configuration file's directory; Prometheus' file_sd takes the
    # same (https://prometheus.io/docs/prometheus/latest/configuration/configuration/#file_sd_config).
    files: list[NonBlank] = Field(min_length=1)
    # Files are re-read when they change (checked on this interval), as a safety net.
    refresh_interval: Duration = 300.0

    @field_validator("files")
    @classmethod
    def _anchored(cls, files: list[str], info: ValidationInfo) -> list[str]:
        root = base_dir(info)
        return [pattern if pattern.startswith("/") else str(root / pattern) for pattern in files]


class HttpSD(_Strict):
    url: HttpUrl
    refresh_interval: Duration = 60.0
    bearer_token: Secret | None = None
    bearer_token_file: SecretFilePath | None = None
    basic_auth: BasicAuth | None = None

    @model_validator(mode="after")
    def _one_credential(self) -> HttpSD:
        _exclusive(self, "bearer_token", "bearer_token_file")
        has_bearer = self.bearer_token is not None or self.bearer_token_file is not None
        if has_bearer and self.basic_auth is not None:
            raise invalid("set either basic_auth or a bearer token, not both")
        return self


class Gateway(_Strict):
    """A gateway's model list; each model it lists becomes an endpoint at ``url``.

    ``url`` is the OpenAI-compatible base the probes use (as an endpoint's ``url``); the list
    is read from ``{url}/models`` (openai, openrouter) or ``{url}/model/info`` (litellm), with
    the template's API key.
    """

    url: HttpUrl
    api: GatewayApi
    refresh_interval: Duration = 60.0
    # Model-name globs (fnmatch); an empty include takes every model.
    include: list[NonBlank] = []  # noqa: RUF012 (pydantic copies field defaults)
    exclude: list[NonBlank] = []  # noqa: RUF012 (pydantic copies field defaults)


class DiscoverySource(_Strict):
    # Named in metrics, logs and the names of the endpoints it finds.
    name: EndpointName
    file_sd: FileSD | None = None
    http_sd: HttpSD | None = None
    gateway: Gateway | None = None
    template: EndpointSettings = EndpointSettings()

    @model_validator(mode="after")
    def _one_kind(self) -> DiscoverySource:
        kinds = [k for k in ("file_sd", "http_sd", "gateway") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise invalid("set exactly one of file_sd, http_sd or gateway")
        return self

    @property
    def kind(self) -> str:
        return "file_sd" if self.file_sd else "http_sd" if self.http_sd else "gateway"

    @property
    def refresh_interval(self) -> float:
        kind = self.file_sd or self.http_sd or self.gateway
        assert kind is not None  # _one_kind
        return kind.refresh_interval


def unique_sources(sources: list[DiscoverySource]) -> list[DiscoverySource]:
    seen: set[str] = set()
    for source in sources:
        if source.name in seen:
            raise invalid(f'lists discovery source "{source.name}" twice')
        seen.add(source.name)
    return sources
