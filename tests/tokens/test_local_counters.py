"""Local tokenizer counters: tiktoken and Hugging Face tokenizers, built offline in the test."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiktoken
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from kvwatch.canary.model import Message
from kvwatch.tokens.local import (
    REPLY_PRIMING_TOKENS,
    TOKENS_PER_MESSAGE,
    HFTokenizerCounter,
    TiktokenCounter,
)

FILLER = (
    "The quiet harbour held its boats while the tide turned slowly under a grey sky. "
    "Merchants counted crates of salt and pepper and argued about the weather. "
) * 40
MESSAGES = [Message("system", "Answer briefly."), Message("user", "Remember KVW-ABCD-1234.")]


def _byte_encoding() -> tiktoken.Encoding:
    """A byte-level BPE with a handful of merges: enough to exercise the real library."""
    ranks = {bytes([i]): i for i in range(256)}
    for merge in (b"th", b"he", b"the", b" t", b"in", b"er"):
        ranks[merge] = len(ranks)
    return tiktoken.Encoding(
        name="test_bytes",
        pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\w+| ?\d+| ?[^\s\w]+|\s+""",
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": len(ranks)},
    )


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        [FILLER], trainer=trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"])
    )
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tok.save(str(path))
    return path


async def test_tiktoken_counts_pieces_exactly() -> None:
    """Piece counts are the encoding's own, one per piece, in order."""
    encoding = _byte_encoding()
    counter = TiktokenCounter("test_bytes", encoding=encoding)
    pieces = ["the harbour", " weather", "", "<|endoftext|> is text here"]
    assert await counter.count_pieces(pieces) == [len(encoding.encode_ordinary(p)) for p in pieces]
    assert counter.source == "tiktoken:test_bytes"
    assert counter.exact is False


async def test_tiktoken_prompt_count_adds_the_documented_template_estimate() -> None:
    """Prompt = content + role tokens + 3 per message + 3 for the reply priming."""
    encoding = _byte_encoding()
    counter = TiktokenCounter("test_bytes", encoding=encoding)
    expected = REPLY_PRIMING_TOKENS + sum(
        TOKENS_PER_MESSAGE
        + len(encoding.encode_ordinary(m.role))
        + len(encoding.encode_ordinary(m.content))
        for m in MESSAGES
    )
    assert await counter.count_prompt(MESSAGES) == expected


async def test_tiktoken_counts_a_large_prompt_off_the_event_loop() -> None:
    """A long prompt is counted (in a worker thread) with the same result."""
    encoding = _byte_encoding()
    counter = TiktokenCounter("test_bytes", encoding=encoding)
    big = [Message("user", FILLER * 30)]
    expected = REPLY_PRIMING_TOKENS + TOKENS_PER_MESSAGE + len(encoding.encode_ordinary("user"))
    expected += len(encoding.encode_ordinary(FILLER * 30))
    assert await counter.count_prompt(big) == expected


async def test_tiktoken_counts_are_corrected_by_what_the_engine_reported() -> None:
    """An engine whose vocabulary counts 5 % more is predicted after one report."""
    counter = TiktokenCounter("test_bytes", encoding=_byte_encoding())
    messages = [Message("user", FILLER)]
    raw = await counter.count_prompt(messages)
    counter.observe(raw, round(raw * 1.05))
    assert await counter.count_prompt(messages) == round(raw * 1.05)
    assert counter.tolerance(round(raw * 1.05)) < 0.05 * raw


def test_tiktoken_refuses_an_unknown_encoding() -> None:
    """A typo in the encoding name is a ValueError that names it."""
    with pytest.raises(ValueError, match="unknown tiktoken encoding 'o9k_base'"):
        TiktokenCounter("o9k_base")


async def test_hf_counts_pieces_and_prompts_with_the_trained_tokenizer(
    tokenizer_json: Path,
) -> None:
    """tokenizer.json is loaded from disk and counts without special tokens."""
    counter = HFTokenizerCounter(str(tokenizer_json))
    reference = Tokenizer.from_file(str(tokenizer_json))

    def n(text: str) -> int:
        return len(reference.encode(text, add_special_tokens=False).ids)

    pieces = ["The quiet harbour", " merchants argued", "salt"]
    assert await counter.count_pieces(pieces) == [n(p) for p in pieces]
    assert await counter.count_pieces([]) == []
    expected = REPLY_PRIMING_TOKENS + sum(
        TOKENS_PER_MESSAGE + n(m.role) + n(m.content) for m in MESSAGES
    )
    assert await counter.count_prompt(MESSAGES) == expected
    assert counter.source == f"hf:{tokenizer_json}"


def test_hf_refuses_a_missing_file(tmp_path: Path) -> None:
    """A wrong path is a ValueError naming the path."""
    missing = tmp_path / "nope.json"
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        HFTokenizerCounter(str(missing))
