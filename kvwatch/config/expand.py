"""``${VAR}`` expansion over the parsed YAML tree, and reading of ``*_file`` secrets.

Expansion runs on the parsed tree, string by string, so a variable's value can never add
YAML structure (a key, a list, an anchor) to the configuration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

# A key path inside the configuration: ("endpoints", 0, "api_key").
KeyPath = tuple[str | int, ...]

# "$$" is an escaped "$"; "${NAME}" and "${NAME:-default}" are references. Anything else
# starting with "${" is malformed and reported rather than passed through.
_REFERENCE = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}|(?P<bad>\$\{)"
)


@dataclass(frozen=True, slots=True)
class ExpansionError:
    path: KeyPath
    message: str


def expand_env(tree: object, env: Mapping[str, str]) -> tuple[object, list[ExpansionError]]:
    """``tree`` with every string value expanded, and the errors met on the way.

    A string that cannot be expanded is kept as written, so that the rest of the
    configuration can still be validated and every error reported in one go.
    """
    errors: list[ExpansionError] = []
    return _expand(tree, (), env, errors), errors


def _expand(
    node: object, path: KeyPath, env: Mapping[str, str], errors: list[ExpansionError]
) -> object:
    if isinstance(node, str):
        try:
            return expand_string(node, env)
        except UnsetVariableError as exc:
            errors.append(ExpansionError(path, str(exc)))
            return node
    if isinstance(node, list):
        return [_expand(item, (*path, index), env, errors) for index, item in enumerate(node)]
    if isinstance(node, dict):
        # Keys stay literal: they are schema names (or label names), never secrets.
        return {key: _expand(value, (*path, key), env, errors) for key, value in node.items()}
    return node


class UnsetVariableError(ValueError):
    pass


def expand_string(text: str, env: Mapping[str, str]) -> str:
    """Expand ``${NAME}``, ``${NAME:-default}`` and ``$$`` in ``text``."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group("bad") is not None:
            raise UnsetVariableError(
                "malformed variable reference; use ${NAME}, ${NAME:-default} or $$ for a literal $"
            )
        name = match.group("name")
        value = env.get(name)
        # Like the shell's ":-", an empty variable also takes the default.
        if value is None or (value == "" and match.group("default") is not None):
            default = match.group("default")
            if default is None:
                raise UnsetVariableError(f"environment variable {name} is not set")
            return default
        return value

    return _REFERENCE.sub(replace, text)


class SecretFileError(ValueError):
    pass


def read_secret_file(path: Path) -> SecretStr:
    """The secret held in ``path``, without the single trailing newline editors add."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecretFileError(exc.strerror or type(exc).__name__) from exc
    except UnicodeDecodeError as exc:
        raise SecretFileError("not UTF-8 text") from exc
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise SecretFileError("the file is empty")
    return SecretStr(text)
