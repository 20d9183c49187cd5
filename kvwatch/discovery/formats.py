"""Reading what a discovery source lists: pure parsing, no I/O.

Two shapes are read:

- Prometheus' service-discovery format, the same for ``file_sd`` (JSON or YAML) and
  ``http_sd`` (JSON): ``[{"targets": ["host:port", ...], "labels": {"name": "value"}}]``
  (https://prometheus.io/docs/prometheus/latest/http_sd/, "HTTP_SD format").
- A gateway's model list, in one of three dialects (:func:`parse_models`).

A list that does not have its shape is refused whole with :class:`ListError`, whose message
says where: a source that serves half a list must not make kvwatch forget the other half.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from kvwatch.config.discovery import GatewayApi


class ListError(ValueError):
    """A list that is not what its source must serve; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class TargetGroup:
    """One entry of a Prometheus SD list: its addresses and the labels they share."""

    targets: tuple[str, ...]
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ListedModel:
    """One model a gateway lists, with the window it states (None: states none)."""

    model: str
    context_window: int | None = None


def parse_sd_json(text: str | bytes) -> list[TargetGroup]:
    """An http_sd answer: JSON only, as Prometheus reads it."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ListError(f"not JSON: {exc}") from None
    return sd_groups(data)


def parse_sd_text(text: str) -> list[TargetGroup]:
    """A file_sd file: YAML or JSON (JSON is YAML too)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ListError(f"not YAML or JSON: {_first_line(exc)}") from None
    # An empty file lists nothing, as an empty list does (a controller truncating then
    # writing would otherwise be an error between the two steps).
    return [] if data is None else sd_groups(data)


def sd_groups(data: object) -> list[TargetGroup]:
    """The target groups of decoded SD data; :class:`ListError` if it has another shape."""
    if not isinstance(data, list):
        raise ListError(f"must be a list of target groups, not {_kind(data)}")
    groups = []
    for index, entry in enumerate(data):
        where = f"group {index + 1}"
        if not isinstance(entry, dict):
            raise ListError(f"{where}: must be a mapping with targets and labels")
        unknown = sorted(set(entry) - {"targets", "labels"})
        if unknown:
            raise ListError(f'{where}: unknown key "{unknown[0]}"')
        targets = entry.get("targets")
        if not isinstance(targets, list) or not all(
            isinstance(t, str) and t.strip() for t in targets
        ):
            raise ListError(f'{where}: "targets" must be a list of "host:port" strings')
        labels = entry.get("labels") or {}
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise ListError(f'{where}: "labels" must map label names to string values')
        groups.append(TargetGroup(tuple(t.strip() for t in targets), dict(labels)))
    return groups


def parse_models(api: GatewayApi, text: str | bytes) -> list[ListedModel]:
    """A gateway's model list in its dialect.

    - ``openai``: ``GET /v1/models`` → ``{"data": [{"id", "max_model_len"?}]}``; vLLM's
      ``ModelCard`` and SGLang add ``max_model_len`` (vllm/entrypoints/openai/protocol.py),
      plain OpenAI-compatible gateways omit it.
    - ``litellm``: ``GET /model/info`` → ``{"data": [{"model_name", "litellm_params",
      "model_info": {"max_input_tokens"?}}]}`` (BerriAI/litellm,
      docs/my-website/docs/proxy/model_management.md, "Get Model Information - /model/info":
      model_info is the configured one merged with LiteLLM's cost map, so the field is null
      for a model the map lacks); one ``model_name`` appears once per deployment, and is
      listed once.
    - ``openrouter``: ``GET /api/v1/models`` → ``{"data": [{"id", "context_length",
      "top_provider": {"context_length"?, "max_completion_tokens", "is_moderated"}}]}``
      (https://openrouter.ai/docs/api-reference/list-available-models); the top provider's
      figure is the one a request is routed to, so it wins when given.
    """
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ListError(f"not JSON: {exc}") from None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ListError('must be a JSON object with a "data" list')
    models: dict[str, ListedModel] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ListError(f"data[{index}]: must be an object")
        listed = _listed(api, entry, index)
        models.setdefault(listed.model, listed)
    return list(models.values())


def _listed(api: GatewayApi, entry: dict[str, Any], index: int) -> ListedModel:
    key = "model_name" if api == "litellm" else "id"
    model = entry.get(key)
    if not isinstance(model, str) or not model.strip():
        raise ListError(f'data[{index}]: needs a "{key}" string')
    if api == "litellm":
        info = entry.get("model_info")
        window = _tokens(info.get("max_input_tokens")) if isinstance(info, dict) else None
    elif api == "openrouter":
        top = entry.get("top_provider")
        window = _tokens(top.get("context_length")) if isinstance(top, dict) else None
        window = window if window is not None else _tokens(entry.get("context_length"))
    else:
        window = _tokens(entry.get("max_model_len"))
    return ListedModel(model.strip(), window)


def _tokens(value: object) -> int | None:
    # Gateways null or zero the field when they do not know it (LiteLLM #27830): not a window.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"


def _first_line(exc: yaml.YAMLError) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
