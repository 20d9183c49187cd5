"""vLLM: the OpenAI-compatible API plus what vLLM says about its window and its KV pool.

Sources: ``ModelCard.max_model_len`` on ``GET /v1/models`` (vllm/entrypoints/openai/protocol.py);
``vllm:cache_config_info`` on ``GET /metrics``, an info gauge whose labels are the fields of
``CacheConfig`` stringified, among them ``block_size`` and ``num_gpu_blocks``
(vllm/v1/metrics/loggers.py ``log_metrics_info("cache_config", ...)``,
vllm/config/cache.py ``metrics_info``). The pool is ``num_gpu_blocks * block_size`` tokens;
with several engines (data parallel) each has its own pool and the smallest binds.

Fingerprint (kvwatch.fingerprint): ``GET /version`` answers ``{"version": VLLM_VERSION}``
(vllm/entrypoints/openai/api_server.py ``show_version``); ``/metrics`` is served from
prometheus_client's default registry, whose process collector exports
``process_start_time_seconds`` (the API server's start, so a restart with the same flags is
still seen); the cache config's ``num_gpu_blocks`` and ``block_size`` are the pool above.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.base import Discovery, identity_of
from kvwatch.engines.openai import EngineCallError, OpenAIEngine

CACHE_CONFIG_METRIC = "vllm:cache_config_info"
PROCESS_START_METRIC = "process_start_time_seconds"


def kv_pool_from_metrics(text: str) -> tuple[int | None, str | None]:
    """(pool tokens, why not) from a Prometheus exposition. Pure."""
    pools: list[int] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in (
                    CACHE_CONFIG_METRIC,
                    CACHE_CONFIG_METRIC.removesuffix("_info"),
                ):
                    continue
                blocks = _label_int(sample.labels, "num_gpu_blocks")
                size = _label_int(sample.labels, "block_size")
                if blocks is not None and size is not None:
                    pools.append(blocks * size)
    except ValueError as exc:  # not a Prometheus exposition at all
        return None, f"GET /metrics is not Prometheus text: {exc}"
    if not pools:
        return None, f"GET /metrics has no {CACHE_CONFIG_METRIC} with num_gpu_blocks and block_size"
    return min(pools), None


def process_start_from_metrics(text: str) -> float | None:
    """The serving process's start (epoch seconds) from a Prometheus exposition. Pure."""
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == PROCESS_START_METRIC:
                    return float(sample.value)
    except ValueError:
        return None
    return None


def _label_int(labels: dict[str, str], key: str) -> int | None:
    # Labels are str() of the config fields: "None" before the KV cache is profiled.
    value = labels.get(key, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


class VLLMEngine(OpenAIEngine):
    FLAVOUR = "vllm"
    # vLLM rejects prompt + max_tokens > max_model_len
    # (vllm/entrypoints/openai/serving_engine.py _validate_input, later renderers).
    RULE = AcceptanceRule.PROMPT_PLUS_MAX_TOKENS
    TOKENIZE_SHAPE = "vllm"

    async def discover(self) -> Discovery:
        models = await super().discover()
        try:
            status, _, raw = await self._discovery_call("GET", f"{self.root_url}/metrics")
        except EngineCallError as exc:
            return _merge(models, None, str(exc))
        if status != 200:
            return _merge(models, None, f"GET /metrics answered {status}")
        text = raw.decode("utf-8", errors="replace")
        pool, why = kv_pool_from_metrics(text)
        return _merge(
            models,
            pool,
            why,
            process_start=process_start_from_metrics(text),
            version=await self._version(),
        )

    async def _version(self) -> str | None:
        try:
            status, payload, _ = await self._discovery_call("GET", f"{self.root_url}/version")
        except EngineCallError:
            return None
        version = payload.get("version") if status == 200 and isinstance(payload, dict) else None
        return version if isinstance(version, str) else None


def _merge(
    models: Discovery,
    pool: int | None,
    why: str | None,
    *,
    process_start: float | None = None,
    version: str | None = None,
) -> Discovery:
    detail = "; ".join(d for d in (models.detail, why) if d) or None
    return Discovery(
        context_window=models.context_window,
        kv_pool_tokens=pool,
        model=models.model,
        detail=detail,
        identity=tuple(
            sorted((*models.identity, *identity_of(process_start=process_start, version=version)))
        ),
    )
