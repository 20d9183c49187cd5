"""SGLang: the OpenAI-compatible API plus its server info (window, KV pool, scheduler limit).

Sources: ``GET /v1/models`` cards carry ``max_model_len = model_config.context_len``
(python/sglang/srt/entrypoints/http_server.py ``available_models``). ``GET /get_server_info``
(``/server_info`` in newer releases, same handler) returns the server args (``context_length``,
null unless set), merged with the scheduler's init info: ``max_total_num_tokens`` (the KV
pool in tokens) and ``max_req_input_len = min(context_len - 1, max_total_num_tokens - 1)``
(python/sglang/srt/managers/scheduler.py ``get_init_info``). A prompt of at least
``max_req_input_len`` tokens is aborted with a 400 "Input length (N tokens) exceeds the maximum
allowed length (M tokens)" unless ``--allow-auto-truncate`` is set, in which case it is
silently cut (python/sglang/srt/managers/utils.py ``validate_input_length``) — the edge probe
catches that as ``truncated``.

Fingerprint (kvwatch.fingerprint): the same handler adds ``"version": __version__``, and the
server args carry ``model_path`` (the weights) — both mean a redeploy when they change.
"""

from __future__ import annotations

from typing import Any

from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.base import Discovery, identity_of
from kvwatch.engines.openai import EngineCallError, OpenAIEngine, positive_int

SERVER_INFO_PATHS = ("/get_server_info", "/server_info")


class SGLangEngine(OpenAIEngine):
    FLAVOUR = "sglang"
    # TokenizerManager rejects input >= context_len ("is longer than the model's context
    # length") and input + max_new_tokens > context_len ("Requested token count exceeds
    # the model's maximum context length"): prompt + max_tokens <= window.
    RULE = AcceptanceRule.PROMPT_PLUS_MAX_TOKENS

    async def discover(self) -> Discovery:
        models = await super().discover()
        notes = [models.detail] if models.detail else []
        info: dict[str, Any] | None = None
        for path in SERVER_INFO_PATHS:
            try:
                status, payload, _ = await self._discovery_call("GET", f"{self.root_url}{path}")
            except EngineCallError as exc:
                notes.append(str(exc))
                break
            if status == 200 and isinstance(payload, dict):
                info = payload
                break
            notes.append(f"GET {path} answered {status}")
        if info is None:
            return Discovery(
                context_window=models.context_window,
                model=models.model,
                detail="; ".join(notes) or None,
            )
        pool = positive_int(info.get("max_total_num_tokens"))
        window = models.context_window or positive_int(info.get("context_length"))
        limit = positive_int(info.get("max_req_input_len"))
        if limit is not None:
            notes.append(f"scheduler admits prompts below {limit} tokens (max_req_input_len)")
        if pool is None:
            notes.append("server info reports no max_total_num_tokens")
        return Discovery(
            context_window=window,
            kv_pool_tokens=pool,
            model=models.model,
            detail="; ".join(notes) or None,
            identity=identity_of(version=info.get("version"), model_path=info.get("model_path")),
        )
