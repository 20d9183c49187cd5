"""What an endpoint says about its window and KV pool, with its discovery source's figures
where the engine itself says nothing.

The order is the issue-22 rule: the configuration always wins (callers compare the spec's
``context_window``/``kv_pool_tokens`` first, as before); then the engine's own report, since
it states what it serves now (vLLM's ``--max-model-len auto`` picks the window at start-up);
the source's figure only when the engine is silent, since a gateway's list goes stale or
drops the field.
"""

from __future__ import annotations

import dataclasses

from kvwatch.config import EndpointSpec
from kvwatch.engines.base import Discovery
from kvwatch.probe.model import Target


def with_source_figures(found: Discovery, spec: EndpointSpec) -> Discovery:
    """``found`` with the source's window and pool in the fields it leaves empty; the detail
    says which figures came from the source, so a reader knows the engine did not state them."""
    borrowed = []
    window, pool = found.context_window, found.kv_pool_tokens
    if window is None and spec.source_context_window is not None:
        window = spec.source_context_window
        borrowed.append(f"window {window}")
    if pool is None and spec.source_kv_pool_tokens is not None:
        pool = spec.source_kv_pool_tokens
        borrowed.append(f"KV pool {pool}")
    if not borrowed:
        return found
    note = f"{' and '.join(borrowed)} as listed by discovery source {spec.source}"
    detail = f"{found.detail}; {note}" if found.detail else note
    return dataclasses.replace(found, context_window=window, kv_pool_tokens=pool, detail=detail)


async def engine_report(target: Target) -> Discovery:
    """The engine's self-report (one call), completed from the source's figures."""
    return with_source_figures(await target.engine.discover(), target.spec)
