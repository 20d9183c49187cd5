"""Canary markers: unique per probe, recognisable anywhere, easy for a model to copy.

Shape: ``KVW-XXXX-XXXX-XXXX`` where each X is a Crockford base32 digit (no I, L, O, U), so
12 symbols carry 60 bits from the CSPRNG. Dashes every four symbols keep tokenizers from
fusing the code into rare multi-character tokens and make it easy to read back.

Matching is deliberately forgiving about *presentation* (case, spaces, dashes, dots,
quotes, markdown) and strict about *content*: every one of the 12 symbols must match.
"""

from __future__ import annotations

import re
import secrets

PREFIX = "KVW"
ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
SYMBOLS = 12
BITS = SYMBOLS * 5

_GROUP = "[0-9A-HJKMNP-TV-Z]{4}"
_MARKER_RE = re.compile(rf"\bKVW-{_GROUP}-{_GROUP}-{_GROUP}\b")
# Over the normalised text (upper case, only letters and digits kept). A lookahead, so that
# candidates may overlap: in "KVW KVW-7F3K-…" the first KVW must not swallow the real code.
_NORMALISED_RE = re.compile(r"(?=KVW([0-9A-Z]{12}))")
_CROCKFORD_ALIASES = str.maketrans({"O": "0", "I": "1", "L": "1"})


def new_marker() -> str:
    """A fresh marker with 60 bits from the operating system's CSPRNG."""
    symbols = "".join(secrets.choice(ALPHABET) for _ in range(SYMBOLS))
    return f"{PREFIX}-{symbols[0:4]}-{symbols[4:8]}-{symbols[8:12]}"


def is_marker(text: str) -> bool:
    """True when ``text`` is exactly one well-formed marker."""
    return _MARKER_RE.fullmatch(text) is not None


def find_markers(text: str) -> list[str]:
    """Well-formed markers in ``text``, in order of appearance (used by the simulator)."""
    return _MARKER_RE.findall(text)


def normalise(text: str) -> str:
    """Upper-case ``text`` and drop everything but letters and digits."""
    return "".join(ch for ch in text.upper() if ch.isascii() and ch.isalnum())


def canonical(marker: str) -> str:
    """The 12 symbols of a marker in canonical spelling: the key markers are stored under.

    Idempotent: the prefix is dropped only from a 15-symbol ``KVW…`` spelling, so a canonical
    body whose own first symbols are K, V, W (one marker in 32,768) keeps them.
    """
    body = normalise(marker)
    if len(body) == len(PREFIX) + SYMBOLS and body.startswith(PREFIX):
        body = body[len(PREFIX) :]
    return body.translate(_CROCKFORD_ALIASES)


def spelled(canonical_marker: str) -> str:
    """The issued spelling (``KVW-XXXX-XXXX-XXXX``) of a canonical marker."""
    body = canonical(canonical_marker)
    return f"{PREFIX}-{body[0:4]}-{body[4:8]}-{body[8:12]}"


def contains_marker(answer: str, marker: str) -> bool:
    """Whether ``answer`` repeats ``marker``, tolerating case, spacing and punctuation noise."""
    return canonical(marker) in markers_in_answer(answer)


def markers_in_answer(answer: str) -> list[str]:
    """Every marker-shaped code in an answer, canonicalised, first occurrence first.

    The answer is normalised first, so ``kvw 7f3k 9qx2 m4td``, ``**KVW-7F3K-9QX2-M4TD**`` and
    ``KVW7F3K9QX2M4TD.`` are all found. Symbols outside the alphabet after aliasing (U) do not
    form a marker.
    """
    found: list[str] = []
    for match in _NORMALISED_RE.finditer(normalise(answer)):
        body = match.group(1).translate(_CROCKFORD_ALIASES)
        if all(ch in ALPHABET for ch in body) and body not in found:
            found.append(body)
    return found
