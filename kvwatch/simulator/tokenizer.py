"""The simulator's tokenizer: deterministic, word-level, and fast on megabyte prompts.

It behaves like a BPE pre-tokenizer without merges: a run of letters with its leading space
is one token (split every eight letters, so long words cost more), every digit is a token,
every other symbol is a token, and a run of whitespace is one token. That keeps counts
additive over space-separated pieces (like real BPE tokenizers, mostly) without being
trivially "one token per word".
"""

from __future__ import annotations

import re
import zlib
from itertools import islice

_TOKEN_RE = re.compile(r" ?[A-Za-z]{1,8}|[A-Za-z]{1,8}| ?\d|\s+|[^\sA-Za-z\d]")

VOCAB_SIZE = 65_536


def tokenize(text: str) -> list[str]:
    """Split ``text`` into token strings; ``"".join(tokenize(t)) == t`` always holds."""
    return _TOKEN_RE.findall(text)


def count(text: str) -> int:
    return sum(1 for _ in _TOKEN_RE.finditer(text))


def token_ids(text: str) -> list[int]:
    """Stable ids for the token strings (a hash, so no vocabulary needs to be stored)."""
    return [zlib.crc32(tok.encode()) % VOCAB_SIZE for tok in tokenize(text)]


def char_offset(text: str, n_tokens: int) -> int:
    """Index in ``text`` where its token number ``n_tokens`` starts (0-based).

    Equivalently, ``text[:char_offset(text, n)]`` is exactly the first ``n`` tokens. Returns
    ``len(text)`` when ``text`` has ``n_tokens`` tokens or fewer. One pass, no token list, so
    cutting a megabyte prompt at a token boundary stays cheap.
    """
    if n_tokens <= 0:
        return 0
    match = next(islice(_TOKEN_RE.finditer(text), n_tokens, None), None)
    return len(text) if match is None else match.start()
