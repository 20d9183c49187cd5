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


# A skewed tokenizer picks the tokens it splits (or merges into their predecessor) by this
# hash of the token's text, so the same text always gets the same count.
_SKEW_BUCKETS = 10_000
MAX_SKEW = 0.3


class Tokenizer:
    """One endpoint's vocabulary: the simulator's own, or one that counts ``skew`` more
    (positive) or fewer (negative) tokens for the same text.

    Real engines behind one API tokenize the same text differently by a few percent (another
    vocabulary, another version of the model); a client that estimates its count must
    learn the engine's. A skewed tokenizer splits a fraction ``skew`` of the plain tokens of
    two or more characters in two (``skew`` > 0), or merges a fraction ``-skew`` into the
    token before them (``skew`` < 0), chosen by a hash of each token's text: deterministic,
    and dependent on the content as real vocabularies are. ``"".join(tokenize(t)) == t``
    still holds, and ``count``, ``char_offset`` and ``token_ids`` agree with ``tokenize``.
    """

    def __init__(self, skew: float = 0.0) -> None:
        if not -MAX_SKEW <= skew <= MAX_SKEW:
            raise ValueError(f"token skew must be within ±{MAX_SKEW}")
        self.skew = skew
        self._threshold = round(abs(skew) * _SKEW_BUCKETS)

    def _picked(self, token: str) -> bool:
        return zlib.crc32(token.encode()) % _SKEW_BUCKETS < self._threshold

    def tokenize(self, text: str) -> list[str]:
        plain = tokenize(text)
        if self._threshold == 0:
            return plain
        out: list[str] = []
        if self.skew > 0:
            for token in plain:
                if len(token) > 1 and self._picked(token):
                    half = len(token) // 2
                    out += (token[:half], token[half:])
                else:
                    out.append(token)
            return out
        for token in plain:
            if out and self._picked(token):
                out[-1] += token
            else:
                out.append(token)
        return out

    def count(self, text: str) -> int:
        return count(text) if self._threshold == 0 else len(self.tokenize(text))

    def token_ids(self, text: str) -> list[int]:
        if self._threshold == 0:
            return token_ids(text)
        return [zlib.crc32(tok.encode()) % VOCAB_SIZE for tok in self.tokenize(text)]

    def char_offset(self, text: str, n_tokens: int) -> int:
        if self._threshold == 0:
            return char_offset(text, n_tokens)
        if n_tokens <= 0:
            return 0
        return sum(len(tok) for tok in islice(self.tokenize(text), n_tokens))


PLAIN = Tokenizer()
