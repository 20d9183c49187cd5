"""Field types of the configuration, each with the one sentence it fails with.

Every validator here raises :func:`invalid` so the error text a user reads is written once,
next to the rule, instead of being reverse-engineered from pydantic's generic messages.
Paths are resolved against ``base_dir`` from the validation context (the directory of the
configuration file), so a configuration means the same thing whatever the working directory.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, SecretStr, ValidationInfo
from pydantic_core import PydanticCustomError

from kvwatch.config.durations import DurationError, parse_duration
from kvwatch.config.expand import SecretFileError, read_secret_file

# The pydantic error type of every error raised here; its message is the user's sentence.
ERROR_TYPE = "kvwatch"

RESERVED_LABELS = frozenset({"alertname", "severity", "endpoint", "model", "probe"})
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ENDPOINT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_REGION = re.compile(r"[A-Za-z0-9_.-]{1,63}")
_DIGITS = re.compile(r"\+?\d+")
# An HTTP field name (RFC 9110 §5.1: a token).
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
# Headers kvwatch or the HTTP layer writes on every request: a trace header under one of
# these names would overwrite a credential or break the request.
OWN_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "anthropic-version",
        "authorization",
        "connection",
        "content-length",
        "content-type",
        "host",
        "transfer-encoding",
        "user-agent",
        "x-api-key",
    }
)
# 1.0 puts a marker right before the question: with several depths, the marker a cut tail
# loses first (issue 12).
MAX_MARKER_DEPTH = 1.0
DATABASE_SCHEMES = ("sqlite", "postgresql+psycopg")


def invalid(message: str) -> PydanticCustomError:
    # The message goes through ctx so that braces in it are never read as a template.
    return PydanticCustomError(ERROR_TYPE, "{message}", {"message": message})


def base_dir(info: ValidationInfo) -> Path:
    context = info.context
    found = context.get("base_dir") if isinstance(context, dict) else None
    return found if isinstance(found, Path) else Path.cwd()


def _resolve(raw: str, info: ValidationInfo) -> Path:
    path = Path(raw).expanduser()
    return path if path.is_absolute() else base_dir(info) / path


def _duration(value: object) -> float:
    if not isinstance(value, str | int | float):
        raise invalid("must be a duration like 30s, 15m or 1h")
    try:
        return parse_duration(value)
    except DurationError as exc:
        raise invalid(str(exc)) from None


def _jitter(value: object) -> float:
    # Zero is a legitimate jitter (probe exactly on the interval); other durations must parse.
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, str) and value.strip() in ("0", "0s", "0ms"):
        return 0.0
    return _duration(value)


def _positive_int(value: object) -> int:
    # Numeric strings are accepted because ${VAR} expansion always yields a string.
    if isinstance(value, bool):
        raise invalid("must be a positive integer")
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        value = int(value)
    if not isinstance(value, int) or value <= 0:
        raise invalid("must be a positive integer")
    return value


def _flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise invalid("must be true or false")


def _marker_depth(value: object) -> float:
    message = f"must be a number between 0.0 and {MAX_MARKER_DEPTH}"
    if isinstance(value, bool):
        raise invalid(message)
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise invalid(message) from None
    if not isinstance(value, int | float) or not 0.0 <= value <= MAX_MARKER_DEPTH:
        raise invalid(message)
    return float(value)


def _http_url(value: object) -> str:
    message = "must be an http:// or https:// URL"
    if not isinstance(value, str) or any(ch.isspace() for ch in value):
        raise invalid(message)
    try:
        parts = urlsplit(value)
        port = parts.port  # raises on a port that is not a number in range
    except ValueError:
        raise invalid(f"{message} with a valid host and port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise invalid(message)
    if port == 0:
        raise invalid(f"{message} with a valid host and port")
    if parts.query or parts.fragment:
        raise invalid(f"{message} without a query or fragment")
    # Clients append API paths ("/chat/completions", "/api/v2/alerts") to the base URL.
    return value.rstrip("/")


def _listen(value: str) -> str:
    message = "must be host:port, like 127.0.0.1:9464 or [::1]:9464"
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise invalid(message)
    if host.startswith("[") or host.endswith("]"):
        try:
            ipaddress.IPv6Address(host.removeprefix("[").removesuffix("]"))
        except ValueError:
            raise invalid(message) from None
    elif ":" in host:
        # An unbracketed IPv6 address is ambiguous: which colon starts the port?
        raise invalid("must be host:port; write an IPv6 address in brackets, like [::1]:9464")
    if not 1 <= int(port) <= 65535:
        raise invalid("port must be between 1 and 65535")
    return value


def split_listen(value: str) -> tuple[str, int]:
    """``("::1", 9464)`` for ``"[::1]:9464"``; the value has been validated already."""
    host, _, port = value.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def _database_url(value: str) -> str:
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in DATABASE_SCHEMES or not rest:
        raise invalid("must be a sqlite:/// or postgresql+psycopg:// URL")
    return value


def _non_blank(value: str) -> str:
    if not value.strip():
        raise invalid("must not be empty")
    return value


def _endpoint_name(value: str) -> str:
    if not _ENDPOINT_NAME.fullmatch(value):
        raise invalid(
            "must be 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return value


def _tenant_name(value: str) -> str:
    # Tenant names are stored with every probe and marker and become alert label values.
    if not _ENDPOINT_NAME.fullmatch(value):
        raise invalid(
            "must be 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return value


def _region(value: str) -> str:
    if not _REGION.fullmatch(value):
        raise invalid("must be 1 to 63 letters, digits, '_', '.' or '-'")
    return value


def _header_name(value: str) -> str:
    if not _HEADER_NAME.fullmatch(value):
        raise invalid("is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")
    if value.lower() in OWN_HEADERS:
        raise invalid(f'"{value}" is a header kvwatch sets itself')
    return value.lower()


def _label_name(value: str) -> str:
    if not _LABEL_NAME.fullmatch(value):
        raise invalid(
            "is not a valid label name (letters, digits and '_', not starting with a digit)"
        )
    if value in RESERVED_LABELS:
        raise invalid("is reserved: kvwatch sets it on every alert")
    return value


def _tokenizer(value: str, info: ValidationInfo) -> str:
    if value in ("server", "usage"):
        return value
    kind, sep, argument = value.partition(":")
    if sep and kind == "tiktoken" and argument:
        if importlib.util.find_spec("tiktoken") is None:
            raise invalid("needs the tiktoken package: pip install 'kvwatch[tiktoken]'")
        import tiktoken

        names = sorted(tiktoken.list_encoding_names())
        if argument not in names:
            raise invalid(f"unknown tiktoken encoding {argument!r}; known: {', '.join(names)}")
        return value
    if sep and kind == "hf" and argument:
        if importlib.util.find_spec("tokenizers") is None:
            raise invalid("needs the tokenizers package: pip install 'kvwatch[hf]'")
        path = _resolve(argument, info)
        if not path.is_file() or not os.access(path, os.R_OK):
            raise invalid(f'cannot read tokenizer file "{argument}"')
        return f"hf:{path}"
    raise invalid(
        'must be "server", "usage", "tiktoken:<encoding>" or "hf:<path to tokenizer.json>"'
    )


@dataclass(frozen=True, slots=True)
class FileSecret:
    """A secret read from a file at load time; its repr shows where it came from, not it."""

    path: Path
    value: SecretStr


def _secret_file(value: object, info: ValidationInfo) -> FileSecret:
    if not isinstance(value, str) or not value.strip():
        raise invalid("must be a file path")
    path = _resolve(value, info)
    try:
        secret = read_secret_file(path)
    except SecretFileError as exc:
        raise invalid(f'cannot read secret file "{value}": {exc}') from None
    return FileSecret(path=path, value=secret)


def _readable_file(value: object, info: ValidationInfo) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise invalid("must be a file path")
    path = _resolve(value, info)
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise invalid(f'cannot read file "{value}": {exc.strerror or type(exc).__name__}') from None
    return path


def _non_empty_secret(value: SecretStr) -> SecretStr:
    if not value.get_secret_value():
        raise invalid("must not be empty")
    return value


Duration = Annotated[float, BeforeValidator(_duration)]
Jitter = Annotated[float, BeforeValidator(_jitter)]
PositiveInt = Annotated[int, BeforeValidator(_positive_int)]
Flag = Annotated[bool, BeforeValidator(_flag)]
MarkerDepth = Annotated[float, BeforeValidator(_marker_depth)]
HttpUrl = Annotated[str, BeforeValidator(_http_url)]
ListenAddress = Annotated[str, AfterValidator(_listen)]
DatabaseUrl = Annotated[str, AfterValidator(_database_url)]
NonBlank = Annotated[str, AfterValidator(_non_blank)]
EndpointName = Annotated[str, AfterValidator(_endpoint_name)]
Region = Annotated[str, AfterValidator(_region)]
TenantName = Annotated[str, AfterValidator(_tenant_name)]
LabelName = Annotated[str, AfterValidator(_label_name)]
HeaderName = Annotated[str, AfterValidator(_header_name)]
TokenizerSpec = Annotated[str, AfterValidator(_tokenizer)]
Secret = Annotated[SecretStr, AfterValidator(_non_empty_secret)]
SecretFilePath = Annotated[FileSecret, BeforeValidator(_secret_file)]
ReadableFile = Annotated[Path, BeforeValidator(_readable_file)]
