"""kvwatch's own probes aimed at real engines: config entries and a runner over them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from kvwatch.probe.model import Target
from kvwatch.probe.runner import ProbeRunner
from kvwatch.store.repository import Store
from tests.helpers.targets import config_for, targets_and_runner

# Gemma 3 270M repeats the prompt's opening sentence before the marker is complete: 16 answer
# tokens stop mid-marker, 32 hold it (docs/llamacpp-facts.md, "Recall").
MAX_TOKENS = 32
# Short, so a baseline costs a fraction of an under probe's prefill on two shared cores.
BASELINE_TOKENS = 256


def llamacpp_entry(url: str, name: str = "llama", **overrides: Any) -> dict[str, Any]:
    """A config entry for llama-server at ``url`` (its root): window left to discovery."""
    entry: dict[str, Any] = {
        "name": name,
        "url": f"{url.rstrip('/')}/v1",
        "model": "gemma-3-270m",
        "flavour": "llamacpp",
        "tokenizer": "server",
        "max_tokens": MAX_TOKENS,
        "baseline_tokens": BASELINE_TOKENS,
        "interval": "1m",
        "jitter": "0s",
    }
    entry.update(overrides)
    return entry


@dataclass(frozen=True, slots=True)
class Rig:
    targets: dict[str, Target]
    runner: ProbeRunner
    store: Store


@asynccontextmanager
async def probe_rig(entries: Sequence[Mapping[str, Any]], store: Store) -> AsyncIterator[Rig]:
    """Real targets (engine adapter, server token counter) and a runner storing into ``store``.

    ``confirm`` is off: a confirmation probe would repeat a multi-second prefill for nothing
    the test looks at.
    """
    config = config_for(entries, database="sqlite:///unused.db", defaults={"confirm": False})
    async with httpx.AsyncClient(timeout=None) as client:
        targets, runner, _metrics = targets_and_runner(config, store, client)
        yield Rig(targets, runner, store)
