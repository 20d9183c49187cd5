"""A tokenize reply's integer ids are counted without being built, and anything that is not
a plain top-level array of integers is parsed whole, as json.loads would."""

from __future__ import annotations

import json
import random

import pytest

from kvwatch.engines.tokenids import parse_tokenize_reply


def test_a_vllm_reply_gives_its_count_and_the_number_of_ids() -> None:
    """vLLM's count, max_model_len and token_strs are kept; the ids are counted, not kept."""
    raw = b'{"count":3,"max_model_len":4096,"tokens":[101,-7,3],"token_strs":null}'
    payload, ids = parse_tokenize_reply(raw)
    assert ids == 3
    assert payload == {"count": 3, "max_model_len": 4096, "tokens": [], "token_strs": None}


@pytest.mark.parametrize(
    ("raw", "ids"),
    [
        (b'{"tokens":[]}', 0),
        (b'{"tokens": [ ]}', 0),
        (b'{"tokens":[42]}', 1),
        (b'{\n  "tokens": [\n    1,\n    2\n  ]\n}', 2),
    ],
)
def test_a_llamacpp_reply_is_counted_however_it_is_spaced(raw: bytes, ids: int) -> None:
    """Empty, one id, and pretty-printed arrays: the count of ids, the array left empty."""
    assert parse_tokenize_reply(raw) == ({"tokens": []}, ids)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"tokens":[{"id":198,"piece":"\\n"},{"id":9906,"piece":[72,105]}]}',
        b'{"tokens":[1.5,2]}',
        b'{"tokens":[1,null]}',
        b'{"tokens":[1,true]}',
        b'{"meta":{"tokens":[1,2]},"count":3}',
        b'{"detail":"bad \\"tokens\\": [1,2]"}',
        b'[{"id":1,"text":"a","start":0,"stop":1}]',
    ],
)
def test_anything_but_top_level_integer_ids_is_parsed_whole(raw: bytes) -> None:
    """Ids with pieces, non-integers, a nested or quoted "tokens", TGI's list: json.loads'."""
    assert parse_tokenize_reply(raw) == (json.loads(raw), None)


@pytest.mark.parametrize("raw", [b"", b"not json", b'{"tokens":[1,2]', b'{"tokens":[1,,2]}x'])
def test_a_reply_that_is_not_json_gives_nothing(raw: bytes) -> None:
    """No JSON, no count: the caller treats it as an engine without tokenize."""
    assert parse_tokenize_reply(raw) == (None, None)


def test_random_replies_count_exactly_what_json_loads_would_list() -> None:
    """Fifty random id lists (0 to 5,000 ids, any sign, spaced or not) count as their length."""
    rng = random.Random(7)
    for _ in range(50):
        tokens = [rng.randrange(-5, 200_000) for _ in range(rng.randrange(0, 5_000))]
        body = {"count": len(tokens), "tokens": tokens}
        raw = json.dumps(body, indent=rng.choice([None, 2])).encode()
        payload, ids = parse_tokenize_reply(raw)
        assert ids == len(tokens)
        assert payload == {"count": len(tokens), "tokens": []}
