"""Fuzzing the config loader: any YAML document is a Config or a ConfigError, nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.config import ConfigError, parse_config

KEYS = [
    "database", "listen", "replica", "log_level", "alertmanager", "urls", "basic_auth",
    "password_file", "bearer_token", "defaults", "interval", "jitter", "timeouts", "under",
    "over", "baseline", "max_tokens", "marker_depths", "endpoints", "name", "url", "flavour",
    "model", "context_window", "kv_pool_tokens", "api_key", "api_key_file", "tokenizer",
    "probes", "labels", "web", "retention", "body_limit_bytes", "stream", "confirm",
]  # fmt: skip
VALUES = [
    "15m", "0s", "-1s", "1e400", "http://127.0.0.1:1/v1", "ftp://x", "${UNSET_VAR}",
    "${HOME:-x}", "$$", "openai", "vllm", "usage", "tiktoken:cl100k_base", "hf:/nope.json",
    "sqlite:///x.db", "postgresql+psycopg://u@h/d", "127.0.0.1:9464", "[::1]:1", "ok-name",
    "/etc/passwd", "/nonexistent/secret", "under",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(VALUES),
)
documents: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children, max_size=6),
    ),
    max_leaves=30,
)


@st.composite
def near_valid(draw: st.DrawFn) -> dict[str, Any]:
    """A valid skeleton with random values and keys mixed in: reaches deep validation."""
    endpoint: dict[str, Any] = {"name": "a", "url": "http://127.0.0.1:1/v1", "model": "m"}
    endpoint.update(draw(st.dictionaries(st.sampled_from(KEYS), documents, max_size=3)))
    doc: dict[str, Any] = {"database": "sqlite:///x.db", "endpoints": [endpoint]}
    doc.update(draw(st.dictionaries(st.sampled_from(KEYS), documents, max_size=3)))
    return doc


def check(text: str, base: Path) -> None:
    try:
        config = parse_config(text, source="<fuzz>", base_dir=base, env={"HOME": "/root"})
    except ConfigError as exc:
        assert str(exc)  # a sentence to show the user
        return
    config.resolved_endpoints()


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(documents)
def test_any_yaml_document_loads_or_raises_a_config_error(tmp_path: Path, doc: Any) -> None:
    """Random YAML values (any shape) never raise anything but ConfigError."""
    check(yaml.safe_dump(doc), tmp_path)


@SETTINGS
@given(near_valid())
def test_a_near_valid_config_loads_or_raises_a_config_error(tmp_path: Path, doc: Any) -> None:
    """Valid skeletons with random values and keys never raise anything but ConfigError."""
    check(yaml.safe_dump(doc), tmp_path)


@SETTINGS
@given(st.text(max_size=200))
def test_any_text_loads_or_raises_a_config_error(tmp_path: Path, text: str) -> None:
    """Arbitrary text (broken YAML, tabs, anchors, control characters) is a ConfigError."""
    check(text, tmp_path)
