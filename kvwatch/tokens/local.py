"""Counting with a local tokenizer: tiktoken encodings or a Hugging Face ``tokenizer.json``.

The text of each message is counted with the local tokenizer; the chat template around it is
not known locally, so its cost is estimated the way OpenAI documents it (about 3 tokens per
message plus the role, and 3 tokens priming the reply). The engine may also tokenize with a
vocabulary that differs from the configured one, so the count is an estimate
(``exact = False``), corrected like any other by the endpoint's calibration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from kvwatch.canary.model import Message
from kvwatch.tokens.estimate import EstimatingCounter

if TYPE_CHECKING:
    import tiktoken
    import tokenizers

A = TypeVar("A")
R = TypeVar("R")

TOKENS_PER_MESSAGE = 3
REPLY_PRIMING_TOKENS = 3
# Counting a megabyte of text takes a while; off the event loop, the daemon keeps serving.
_THREAD_THRESHOLD_CHARS = 64 * 1024


class MissingExtra(RuntimeError):
    """An optional dependency for a configured tokenizer is not installed."""


class _LocalCounter(EstimatingCounter):
    def _encode_len(self, text: str) -> int:
        raise NotImplementedError

    def _encode_lens(self, texts: list[str]) -> list[int]:
        return [self._encode_len(t) for t in texts]

    def _prompt(self, messages: Sequence[Message]) -> int:
        total = REPLY_PRIMING_TOKENS
        for message in messages:
            total += TOKENS_PER_MESSAGE + self._encode_len(message.role)
            total += self._encode_len(message.content)
        return total

    async def _raw_prompt(self, messages: Sequence[Message]) -> int:
        return await _maybe_in_thread(sum(len(m.content) for m in messages), self._prompt, messages)

    async def _raw_pieces(self, pieces: Sequence[str]) -> list[int]:
        return await _maybe_in_thread(sum(len(p) for p in pieces), self._encode_lens, list(pieces))


async def _maybe_in_thread(chars: int, fn: Callable[[A], R], arg: A) -> R:
    if chars < _THREAD_THRESHOLD_CHARS:
        return fn(arg)
    return await asyncio.to_thread(fn, arg)


class TiktokenCounter(_LocalCounter):
    """``tiktoken:<encoding>``, e.g. ``tiktoken:o200k_base``. ``encoding`` may be given
    directly (tests, or an encoding built from a local BPE file on an offline machine)."""

    def __init__(self, encoding_name: str, *, encoding: tiktoken.Encoding | None = None) -> None:
        if encoding is None:
            try:
                import tiktoken
            except ImportError as exc:
                raise MissingExtra(
                    "tokenizer tiktoken:... needs the tiktoken package: "
                    "pip install 'kvwatch[tiktoken]'"
                ) from exc
            try:
                encoding = tiktoken.get_encoding(encoding_name)
            except ValueError as exc:
                raise ValueError(f"unknown tiktoken encoding {encoding_name!r}") from exc
            except Exception as exc:  # the download of the BPE file failed
                raise ValueError(
                    f"cannot load tiktoken encoding {encoding_name!r}: {exc} (tiktoken fetches "
                    "encodings on first use; on an offline host fill TIKTOKEN_CACHE_DIR)"
                ) from exc
        super().__init__()
        self._encoding = encoding
        self.source = f"tiktoken:{encoding_name}"

    def _encode_len(self, text: str) -> int:
        # Text that looks like a special token ("<|endoftext|>") is counted as plain text,
        # which is how a chat API treats user content.
        return len(self._encoding.encode_ordinary(text))

    def _encode_lens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self._encoding.encode_ordinary_batch(texts)]


class HFTokenizerCounter(_LocalCounter):
    """``hf:<path to tokenizer.json>``, loaded with the ``tokenizers`` package."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise MissingExtra(
                "tokenizer hf:... needs the tokenizers package: pip install 'kvwatch[hf]'"
            ) from exc
        try:
            self._tokenizer: tokenizers.Tokenizer = Tokenizer.from_file(path)
        except Exception as exc:  # the Rust side raises a bare Exception for a bad file
            raise ValueError(f"cannot load tokenizer {path!r}: {exc}") from exc
        super().__init__()
        self.source = f"hf:{path}"

    def _encode_len(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _encode_lens(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(e.ids) for e in encodings]
