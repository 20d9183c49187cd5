"""Configuration errors as users read them: ``<key path>: <sentence>``.

pydantic reports errors as dicts with a location tuple and a generic English message; this
module turns each into one line that names the key the way it is written in YAML
(``endpoints[2].context_window``) and says what is expected.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic_core import ErrorDetails

from kvwatch.config.types import ERROR_TYPE


class ConfigError(Exception):
    """The configuration cannot be used; ``errors`` holds one line per problem."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


def format_path(loc: Sequence[str | int]) -> str:
    """``endpoints[0].labels.team`` for ``("endpoints", 0, "labels", "team")``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":
            # pydantic's marker for "the key of the mapping entry", already named by the path.
            continue
        else:
            text += f".{part}" if text else part
    return text


_SENTENCES = {
    "missing": "is required",
    "extra_forbidden": "unknown key",
    "string_type": "must be a string",
    "string_too_short": "must not be empty",
    "too_short": "must not be empty",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "dataclass_type": "must be a mapping",
}


def sentence(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == ERROR_TYPE:
        return error["msg"]
    if kind in _SENTENCES:
        return _SENTENCES[kind]
    if kind in ("literal_error", "enum"):
        expected = str(error.get("ctx", {}).get("expected", ""))
        choices = re.findall(r"'([^']*)'", expected)
        return f"must be one of: {', '.join(choices)}"
    # Anything not mapped above still reads as a sentence, just pydantic's own.
    message = error["msg"]
    return message[:1].lower() + message[1:]


def describe(error: ErrorDetails) -> str:
    return f"{format_path(error['loc'])}: {sentence(error)}"
