"""Canary prompts of an exact size, counted by llama-server itself.

The count is the server's own: ``/apply-template`` renders the chat template, ``/tokenize``
with ``add_special`` counts the rendered text with the BOS the server adds. The tests pin
that this count is what ``usage.prompt_tokens`` reports, so sizing by it hits the window's
boundary to the token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import islice
from typing import Any

import httpx

from kvwatch.canary import filler
from kvwatch.canary.planning import Layout

ChatMessages = list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class SizedPrompt:
    marker: str
    messages: ChatMessages
    tokens: int


def templated(client: httpx.Client, messages: ChatMessages) -> str:
    """The prompt text the server's chat template renders for ``messages``."""
    reply = client.post("/apply-template", json={"messages": messages})
    reply.raise_for_status()
    prompt: str = reply.json()["prompt"]
    return prompt


def tokenize(client: httpx.Client, text: str, *, add_special: bool) -> list[int]:
    reply = client.post("/tokenize", json={"content": text, "add_special": add_special})
    reply.raise_for_status()
    tokens: list[int] = reply.json()["tokens"]
    return tokens


def count_prompt(client: httpx.Client, messages: ChatMessages) -> int:
    """Prompt tokens of a chat request, as the server will count them."""
    return len(tokenize(client, templated(client, messages), add_special=True))


def _messages(marker: str, pieces: list[str]) -> ChatMessages:
    return [{"role": m.role, "content": m.content} for m in Layout(marker, 0.0).messages(pieces)]


def sized_prompt(client: httpx.Client, target: int, marker: str, rng: random.Random) -> SizedPrompt:
    """A marker-at-the-start canary prompt of exactly ``target`` server-counted tokens."""
    stream = (piece for sentence in filler.sentences(rng) for piece in sentence)
    pieces = list(islice(stream, 2 * target))

    def count(k: int) -> int:
        return count_prompt(client, _messages(marker, pieces[:k]))

    fixed = count(0)
    if target < fixed:
        raise ValueError(f"{target} tokens is below the fixed part ({fixed})")
    # Filler words are almost always one token each, so the difference corrects the guess.
    k = target - fixed
    seen: dict[int, int] = {}
    for _ in range(10):
        k = max(k, 0)
        if k not in seen:
            seen[k] = count(k)
        total = seen[k]
        if total == target:
            return SizedPrompt(marker, _messages(marker, pieces[:k]), total)
        step = target - total
        if k + step in seen:
            break
        k += step
    # Straddling: k pieces overshoot and k-1 undershoot, so the last piece costs 2+ tokens.
    # From the largest prefix that fits, append whichever filler word still fits until exact.
    k = max((j for j in seen if seen[j] <= target), default=0)
    base, total = pieces[:k], seen.get(k, fixed)
    while total < target:
        for word in filler.vocabulary():
            grown = count_prompt(client, _messages(marker, [*base, word]))
            if grown <= target:
                base, total = [*base, word], grown
                break
        else:
            raise AssertionError(f"could not size a prompt to exactly {target} tokens")
    return SizedPrompt(marker, _messages(marker, base), total)


def chat(
    client: httpx.Client,
    messages: ChatMessages,
    *,
    max_tokens: int,
    **extra: Any,
) -> httpx.Response:
    """One greedy (temperature 0) non-streaming chat completion."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    return client.post("/v1/chat/completions", json=body)
