"""A tokenize reply read without building its token ids.

vLLM's ``/tokenize`` answers ``{"count": N, "max_model_len": M, "tokens": [id, ...]}`` and
llama.cpp's ``{"tokens": [id, ...]}``: every token id of the prompt, when kvwatch only needs
how many there are. ``json.loads`` makes a Python int for each id and a list to hold them:
for a 1M-token canary, 7.3 MB of JSON became a 44 MB peak of small objects and 0.69 s of
parsing on the event loop (measured here, ``python -m bench tokenids``). Small objects made
in bursts like that are what leaves CPython's arenas pinned over a long run (issue 25).

So the top-level ``"tokens"`` array, when it holds only integers, is counted in place (its
commas) and cut out before the rest is parsed. Anything else (ids with pieces, another
shape, a reply that is not JSON) is parsed whole, as before.
"""

from __future__ import annotations

import json
import re
from typing import Any

# The key of the ids' array. JSON strings cannot hold an unescaped quote, so this is a key,
# never text inside a value.
_KEY = re.compile(rb'"tokens"\s*:\s*\[')
_DIGIT = re.compile(rb"[0-9]")
# What cannot appear among integers: strings, objects, arrays, fractions and exponents,
# true, false and null. Each is one memchr over the span, far cheaper than a pattern
# matched id by id (4 times slower than json.loads itself at 1M ids, measured here).
_NOT_INTEGERS = (b'"', b"{", b"[", b".", b"e", b"E", b"t", b"f", b"n")


def parse_tokenize_reply(raw: bytes) -> tuple[Any, int | None]:
    """The reply's JSON (``None`` if it is not JSON) and how many integer ids its top-level
    ``"tokens"`` array holds; that array is left empty in the JSON. The count is ``None``
    when there is no such array (the JSON is then exactly ``json.loads(raw)``)."""
    key = _KEY.search(raw)
    end = -1 if key is None else raw.find(b"]", key.end())
    if key is not None and end >= 0:
        start = key.end()
        if not any(raw.find(c, start, end) >= 0 for c in _NOT_INTEGERS):
            try:
                payload = json.loads(raw[:start] + raw[end:])
            except ValueError:
                payload = None
            # Only the top level's own key: had a nested one been cut, the top level's
            # array would still be full (or absent).
            if isinstance(payload, dict) and payload.get("tokens") == []:
                if _DIGIT.search(raw, start, end) is None:
                    return payload, 0
                return payload, raw.count(b",", start, end) + 1
    try:
        return (json.loads(raw) if raw else None), None
    except ValueError:
        return None, None
