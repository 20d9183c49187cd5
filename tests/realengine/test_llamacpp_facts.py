"""Facts about llama.cpp's server that kvwatch relies on, pinned against the real thing.

Window 2048, one slot, Gemma 3 270M (see conftest). An upgrade of llama.cpp that moves the
acceptance boundary, the error body, the window's place in /props or the token accounting
fails here first. The facts and the experiments behind them: docs/llamacpp-facts.md.

Cost: the boundary prompts share their filler (same seed, same marker), so after the first
~2,000-token prefill the server's prompt cache makes the others cheap.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import httpx
import pytest

from kvwatch.canary.markers import contains_marker, new_marker
from tests.realengine.prompts import SizedPrompt, chat, count_prompt, sized_prompt, tokenize
from tests.realengine.server import WINDOW

BOS = 2  # Gemma's <bos>


@pytest.fixture
def client(llama_server_url: str) -> Iterator[httpx.Client]:
    # A client per test: after a streamed reply llama-server may drop the kept-alive
    # connection without notice, and a pooled client would then fail its next request.
    with httpx.Client(base_url=llama_server_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def boundary_prompts(llama_server_url: str) -> dict[int, SizedPrompt]:
    """Prompts of 2016, 2017, 2047 and 2048 tokens sharing one marker and one filler prefix."""
    marker = new_marker()
    with httpx.Client(base_url=llama_server_url, timeout=120) as c:
        return {
            size: sized_prompt(c, size, marker, random.Random(2048))
            for size in (2016, 2017, 2047, 2048)
        }


def test_props_reports_the_slot_window_under_default_generation_settings(
    client: httpx.Client,
) -> None:
    """/props carries n_ctx per slot in default_generation_settings, and /slots agrees."""
    props = client.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == WINDOW
    assert props["total_slots"] == 1
    assert "n_ctx" not in props
    slots = client.get("/slots").json()
    assert [slot["n_ctx"] for slot in slots] == [WINDOW]


def test_tokenize_adds_exactly_one_bos_when_add_special_is_set(client: httpx.Client) -> None:
    """/tokenize returns a bare id list; add_special prepends BOS and nothing else."""
    plain = tokenize(client, "Hello world", add_special=False)
    special = tokenize(client, "Hello world", add_special=True)
    assert special == [BOS, *plain]


def test_apply_template_renders_gemma_turns_without_the_templates_own_bos(
    client: httpx.Client,
) -> None:
    """The server strips the template's BOS text, so counting must add it back (add_special)."""
    reply = client.post("/apply-template", json={"messages": [{"role": "user", "content": "Hi."}]})
    assert reply.json() == {
        "prompt": "<start_of_turn>user\nHi.<end_of_turn>\n<start_of_turn>model\n"
    }


def test_usage_prompt_tokens_equals_apply_template_plus_tokenize_count(
    client: httpx.Client,
) -> None:
    """usage.prompt_tokens is exactly len(tokenize(apply_template(messages), add_special))."""
    prompt = sized_prompt(client, 300, new_marker(), random.Random(3))
    assert count_prompt(client, prompt.messages) == 300
    reply = chat(client, prompt.messages, max_tokens=4)
    assert reply.status_code == 200
    assert reply.json()["usage"]["prompt_tokens"] == 300


@pytest.mark.parametrize("max_tokens", [1, 16, 32])
def test_a_prompt_of_exactly_n_ctx_is_rejected_whatever_max_tokens(
    client: httpx.Client, boundary_prompts: dict[int, SizedPrompt], max_tokens: int
) -> None:
    """prompt >= n_ctx gets 400 exceed_context_size_error naming both counts."""
    reply = chat(client, boundary_prompts[2048].messages, max_tokens=max_tokens)
    assert reply.status_code == 400
    assert reply.json() == {
        "error": {
            "code": 400,
            "message": "request (2048 tokens) exceeds the available context size "
            "(2048 tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 2048,
            "n_ctx": WINDOW,
        }
    }


def test_a_prompt_one_below_n_ctx_is_accepted_and_cut_to_one_token(
    client: httpx.Client, boundary_prompts: dict[int, SizedPrompt]
) -> None:
    """prompt = n_ctx - 1 with max_tokens 32: HTTP 200, one completion token, "length"."""
    reply = chat(client, boundary_prompts[2047].messages, max_tokens=32)
    assert reply.status_code == 200
    body = reply.json()
    assert body["usage"]["prompt_tokens"] == 2047
    assert body["usage"]["completion_tokens"] == 1
    assert body["choices"][0]["finish_reason"] == "length"


def test_an_answer_is_cut_where_prompt_plus_completion_reaches_n_ctx(
    client: httpx.Client, boundary_prompts: dict[int, SizedPrompt]
) -> None:
    """prompt + max_tokens = n_ctx + 1 is accepted and loses one token, same finish_reason."""
    reply = chat(client, boundary_prompts[2017].messages, max_tokens=32)
    assert reply.status_code == 200
    body = reply.json()
    assert body["usage"]["prompt_tokens"] == 2017
    assert body["usage"]["completion_tokens"] == WINDOW - 2017
    assert body["choices"][0]["finish_reason"] == "length"


def test_a_prompt_leaving_exactly_max_tokens_gets_the_whole_answer_and_the_marker(
    client: httpx.Client, boundary_prompts: dict[int, SizedPrompt]
) -> None:
    """prompt + max_tokens = n_ctx (the under probe): the whole answer, the marker recalled."""
    prompt = boundary_prompts[2016]
    reply = chat(client, prompt.messages, max_tokens=32)
    assert reply.status_code == 200
    body = reply.json()
    assert body["usage"] | {"prompt_tokens_details": None} == {
        "prompt_tokens": 2016,
        "completion_tokens": 32,
        "total_tokens": 2048,
        "prompt_tokens_details": None,
    }
    assert contains_marker(body["choices"][0]["message"]["content"], prompt.marker)


def test_an_over_window_stream_is_refused_with_a_plain_json_400(
    client: httpx.Client, boundary_prompts: dict[int, SizedPrompt]
) -> None:
    """stream: true does not change the rejection: a JSON 400 body, no event stream."""
    body = {"messages": boundary_prompts[2048].messages, "max_tokens": 16, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        raw = reply.read()
    assert reply.status_code == 400
    assert json.loads(raw)["error"]["type"] == "exceed_context_size_error"


def _frames(client: httpx.Client, **options: object) -> list[str]:
    body = {
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        **options,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        return [line for line in reply.iter_lines() if line]


def test_a_stream_reports_usage_only_when_asked_in_a_last_chunk_without_choices(
    client: httpx.Client,
) -> None:
    """include_usage adds a final choices=[] chunk with usage before "data: [DONE]"."""
    frames = _frames(client, stream_options={"include_usage": True})
    assert frames[-1] == "data: [DONE]"
    finish, usage = (json.loads(frame.removeprefix("data: ")) for frame in frames[-3:-1])
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == 12
    assert usage["usage"]["completion_tokens"] == 4


def test_a_stream_without_include_usage_carries_no_usage(client: httpx.Client) -> None:
    """Without stream_options no chunk has usage (only llama.cpp's own timings)."""
    frames = _frames(client)
    assert frames[-1] == "data: [DONE]"
    chunks = [json.loads(frame.removeprefix("data: ")) for frame in frames[:-1]]
    assert all("usage" not in chunk for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_the_collapsed_gemma_template_turns_every_prompt_into_three_tokens_with_200(
    llama_server_collapsed_url: str,
) -> None:
    """--chat-template gemma renders the literal word: 3 prompt tokens, still HTTP 200."""
    messages = [{"role": "user", "content": f"Remember {new_marker()}. " * 50}]
    with httpx.Client(base_url=llama_server_collapsed_url, timeout=120) as c:
        assert c.post("/apply-template", json={"messages": messages}).json() == {"prompt": "gemma"}
        assert count_prompt(c, messages) == 3
        reply = chat(c, messages, max_tokens=4)
    assert reply.status_code == 200
    assert reply.json()["usage"]["prompt_tokens"] == 3
