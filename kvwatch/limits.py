"""Defaults and limits that more than one layer uses, each named once. Imports nothing.

The configuration's defaults for these (``web.answer_excerpt_chars``) point here, so the
daemon, the web layer and a test that builds either without a config agree.
"""

from __future__ import annotations

# Characters of each answer kept as evidence (and shown): enough to see what the model
# recalled, little enough of what may be another user's data.
ANSWER_EXCERPT_CHARS = 400
# Characters of an engine's error body an exchange keeps: a context-length rejection states
# the engine's limit somewhere in it, sometimes after a long preamble.
EXCHANGE_ERROR_CHARS = 4096
# Characters of an error body or detail stored with a probe (and put in its report): the
# statement of a limit, with room, not a whole HTML error page.
STORED_ERROR_CHARS = 2000
# Characters of an exception's text put into a verdict's reason or a log line.
SHORT_TEXT_CHARS = 200
# A discovered window above this is garbage, not a model: planning it would build a prompt
# of that size. (Configured windows are the operator's word and are not capped.)
MAX_PLAUSIBLE_WINDOW = 2**27


def bounded(text: str | None, limit: int) -> str | None:
    """``text`` cut to ``limit`` characters (marked with "…"); None for a limit of 0, which
    switches excerpts off: they may hold other users' data."""
    if text is None or limit <= 0:
        return None
    return text if len(text) <= limit else text[:limit] + "…"


def short(text: str) -> str:
    """``text`` cut for a reason or a log line."""
    return text if len(text) <= SHORT_TEXT_CHARS else text[:SHORT_TEXT_CHARS] + "…"
