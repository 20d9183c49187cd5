"""llama.cpp server: the OpenAI-compatible API, its tokenize dialect and its per-slot context.

Sources (tools/server/README.md, tools/server/server.cpp): ``GET /props`` returns
``default_generation_settings.n_ctx`` — the context of one slot, i.e. ``--ctx-size`` divided
by ``--parallel`` — and ``total_slots``; ``GET /slots`` lists every slot with its own ``n_ctx``
(501 when started with ``--no-slots``). A slot's KV cache is all one request can use, so the
per-slot ``n_ctx`` is both the window and the pool. Admission: a prompt of ``n_ctx`` tokens or
more is rejected with 400 ``exceed_context_size_error``; a shorter one is accepted and its
answer stops when the slot is full (measured on a 4,096 window, DESIGN §1).
"""

from __future__ import annotations

from typing import Any

import httpx

from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.base import Discovery
from kvwatch.engines.http import DEFAULT_BODY_LIMIT
from kvwatch.engines.openai import EngineCallError, OpenAIEngine


def _positive(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


class LlamaCppEngine(OpenAIEngine):
    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        base_url: str,
        model: str,
        api_key: str | None,
        body_limit_bytes: int = DEFAULT_BODY_LIMIT,
        **options: Any,
    ) -> None:
        super().__init__(
            client,
            base_url=base_url,
            model=model,
            api_key=api_key,
            body_limit_bytes=body_limit_bytes,
            rule=AcceptanceRule.PROMPT_BELOW_WINDOW,
            flavour="llamacpp",
            tokenize_shape="llamacpp",
            **options,
        )

    async def discover(self) -> Discovery:
        notes: list[str] = []
        try:
            status, props, _ = await self._discovery_call("GET", f"{self.root_url}/props")
        except EngineCallError as exc:
            return Discovery(detail=str(exc))
        if status != 200 or not isinstance(props, dict):
            return Discovery(detail=f"GET /props answered {status}")
        settings = props.get("default_generation_settings")
        n_ctx = _positive(settings.get("n_ctx")) if isinstance(settings, dict) else None
        slots_n_ctx: list[int] = []
        try:
            status, slots, _ = await self._discovery_call("GET", f"{self.root_url}/slots")
        except EngineCallError as exc:
            notes.append(str(exc))
        else:
            if status == 200 and isinstance(slots, list):
                slots_n_ctx = [
                    n for s in slots if isinstance(s, dict) and (n := _positive(s.get("n_ctx")))
                ]
            else:
                notes.append(f"GET /slots answered {status}")
        if slots_n_ctx:
            # The smallest slot binds: any request may land on it.
            n_ctx = min(slots_n_ctx)
        if n_ctx is None:
            notes.append("GET /props reports no default_generation_settings.n_ctx")
        total = _positive(props.get("total_slots"))
        if total is not None:
            notes.append(f"{total} slot(s), n_ctx per slot")
        alias = props.get("model_alias") or props.get("model_path")
        return Discovery(
            context_window=n_ctx,
            kv_pool_tokens=n_ctx,
            model=alias if isinstance(alias, str) else None,
            detail="; ".join(notes) or None,
        )
