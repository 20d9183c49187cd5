"""llama.cpp server: the OpenAI-compatible API, its tokenize dialect and its per-slot context.

Sources (tools/server/README.md, tools/server/server.cpp): ``GET /props`` returns
``default_generation_settings.n_ctx`` — the context of one slot, i.e. ``--ctx-size`` divided
by ``--parallel`` — and ``total_slots``; ``GET /slots`` lists every slot with its own ``n_ctx``
(501 when started with ``--no-slots``). A slot's KV cache is all one request can use, so the
per-slot ``n_ctx`` is both the window and the pool. Admission: a prompt of ``n_ctx`` tokens or
more is rejected with 400 ``exceed_context_size_error``; a shorter one is accepted and its
answer stops when the slot is full (measured on a 4,096 window, DESIGN §1).

Fingerprint (kvwatch.fingerprint): ``/props`` also carries ``build_info`` (the build number and
commit, tools/server/server.cpp ``handle_props``) and ``model_path``; ``n_ctx`` is the window.
"""

from __future__ import annotations

from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.base import Discovery, identity_of
from kvwatch.engines.openai import EngineCallError, OpenAIEngine, positive_int


class LlamaCppEngine(OpenAIEngine):
    FLAVOUR = "llamacpp"
    # A prompt below the slot's n_ctx is accepted whatever max_tokens says (module docstring).
    RULE = AcceptanceRule.PROMPT_BELOW_WINDOW
    TOKENIZE_SHAPE = "llamacpp"

    async def discover(self) -> Discovery:
        notes: list[str] = []
        try:
            status, props, _ = await self._discovery_call("GET", f"{self.root_url}/props")
        except EngineCallError as exc:
            return Discovery(detail=str(exc))
        if status != 200 or not isinstance(props, dict):
            return Discovery(detail=f"GET /props answered {status}")
        settings = props.get("default_generation_settings")
        n_ctx = positive_int(settings.get("n_ctx")) if isinstance(settings, dict) else None
        slots_n_ctx: list[int] = []
        try:
            status, slots, _ = await self._discovery_call("GET", f"{self.root_url}/slots")
        except EngineCallError as exc:
            notes.append(str(exc))
        else:
            if status == 200 and isinstance(slots, list):
                slots_n_ctx = [
                    n for s in slots if isinstance(s, dict) and (n := positive_int(s.get("n_ctx")))
                ]
            else:
                notes.append(f"GET /slots answered {status}")
        if slots_n_ctx:
            # The smallest slot binds: any request may land on it.
            n_ctx = min(slots_n_ctx)
        if n_ctx is None:
            notes.append("GET /props reports no default_generation_settings.n_ctx")
        total = positive_int(props.get("total_slots"))
        if total is not None:
            notes.append(f"{total} slot(s), n_ctx per slot")
        alias = props.get("model_alias") or props.get("model_path")
        return Discovery(
            context_window=n_ctx,
            kv_pool_tokens=n_ctx,
            model=alias if isinstance(alias, str) else None,
            detail="; ".join(notes) or None,
            identity=identity_of(
                build_info=props.get("build_info"), model_path=props.get("model_path")
            ),
        )
