"""Reading a configuration: YAML → ``${VAR}`` expansion → validation → cross-field checks.

Every problem found is collected and reported together in one :class:`ConfigError`, in the
order the keys appear in the file, so a user fixes a broken file in one pass.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from kvwatch.config.checks import cross_field_problems
from kvwatch.config.errors import ConfigError, format_path, sentence
from kvwatch.config.expand import KeyPath, expand_env
from kvwatch.config.model import Config

# libyaml's parser (PyPI's PyYAML wheels carry it) where present: a 1,000-endpoint file is
# parsed in 0.10 s instead of 0.61 s, with a transient peak of 6.5 MB of Python objects
# instead of 9.9 MB (every reload makes one; issue 25).
try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # a PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


def load_config(path: Path, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate the configuration at ``path``; raises :class:`ConfigError`.

    Relative paths inside it (secret files, TLS files, tokenizers) are taken relative to
    the directory the file is in, as given (a symlinked file keeps its link's directory).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or type(exc).__name__}"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: cannot read: not UTF-8 text"]) from None
    return parse_config(text, source=str(path), base_dir=path.absolute().parent, env=env)


def parse_config(
    text: str,
    *,
    source: str = "<string>",
    base_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Validate configuration ``text``; ``source`` names it in errors.

    ``base_dir`` anchors relative paths (default: the working directory); ``env`` supplies
    ``${VAR}`` values (default: the process environment).
    """
    data = _load_yaml(text, source)
    if data is None:
        raise ConfigError([f"{source}: the configuration is empty"])
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{source}: must be a mapping of settings at the top level, not {_kind(data)}"]
        )

    data = _string_keys(data)
    expanded, expansion_errors = expand_env(data, os.environ if env is None else env)
    problems: list[tuple[KeyPath, str]] = [(e.path, e.message) for e in expansion_errors]
    unexpanded = [e.path for e in expansion_errors]

    context = {"base_dir": base_dir if base_dir is not None else Path.cwd()}
    try:
        config = Config.model_validate(expanded, context=context)
    except ValidationError as exc:
        for error in exc.errors():
            # A value left unexpanded fails validation too; its expansion error says why.
            if not any(error["loc"][: len(p)] == p for p in unexpanded):
                problems.append((tuple(error["loc"]), sentence(error)))
    else:
        problems.extend(cross_field_problems(config))
        if not problems:
            return config

    order = _document_order(data)
    problems.sort(key=lambda problem: _position(problem[0], order))
    raise ConfigError([f"{format_path(path) or source}: {message}" for path, message in problems])


class _Loader(_SafeLoader):
    """PyYAML's safe loader, except that a key written twice is an error.

    PyYAML keeps the last value silently, which would let a pasted block quietly override
    a setting above it.
    """


def _construct_mapping(
    loader: _Loader, node: yaml.MappingNode, deep: bool = False
) -> dict[Hashable, object]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # "<<: *anchor" entries may be overridden by explicit keys
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, Hashable):
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f'duplicate key "{key}"', key_node.start_mark
                )
            seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _load_yaml(text: str, source: str) -> object:
    try:
        return yaml.load(text, Loader=_Loader)  # _Loader derives from SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and problem.startswith("but "):
            # e.g. "expected a single document in the stream but found another document"
            problem = f"{exc.context} {problem}"
        if problem.startswith("duplicate key"):
            raise ConfigError([f"{where}: {problem}"]) from None
        raise ConfigError([f"{where}: cannot parse YAML: {problem}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{source}: cannot parse YAML: {exc}"]) from None


def _string_keys(node: object) -> object:
    """``node`` with every mapping key as a string.

    YAML reads ``1:`` or ``yes:`` as an int or a bool; as strings they are reported like any
    other wrong key (``1: unknown key``), and an integer key is never mistaken for a list
    index in a key path.
    """
    if isinstance(node, dict):
        return {str(key): _string_keys(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_string_keys(item) for item in node]
    return node


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"


def _document_order(data: object) -> dict[KeyPath, int]:
    """Each key path in the parsed file, numbered in the order it was written."""
    order: dict[KeyPath, int] = {}

    def walk(node: object, path: KeyPath) -> None:
        order[path] = len(order)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*path, key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, (*path, index))

    walk(data, ())
    return order


def _position(path: KeyPath, order: dict[KeyPath, int]) -> int:
    # A missing key is not in the file: place it with the nearest ancestor that is.
    for length in range(len(path), -1, -1):
        if path[:length] in order:
            return order[path[:length]]
    return 0
