"""The simulated engine's pure logic: template, recall, KV pages, admission and faults."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_helpers import sized_messages

from kvwatch.canary.markers import new_marker
from kvwatch.canary.model import Message
from kvwatch.simulator import tokenizer
from kvwatch.simulator.model import (
    NOT_FOUND,
    Answer,
    ChatRequest,
    EndpointState,
    KVPagePool,
    Reject,
    StreamFailure,
    decide,
    recall,
    render_chat,
)
from kvwatch.simulator.spec import FaultMode, Flavour, SimEndpoint


def request(prompt_tokens: int, marker: str | None = None, **kw: object) -> ChatRequest:
    return ChatRequest(
        messages=sized_messages(prompt_tokens, marker),
        max_tokens=kw.get("max_tokens", 16),  # type: ignore[arg-type]
        stream=bool(kw.get("stream", False)),
    )


def endpoint(**kw: object) -> SimEndpoint:
    return SimEndpoint(name="e", **kw)  # type: ignore[arg-type]


def test_it_renders_messages_with_the_chatml_template() -> None:
    """Each message is wrapped in im_start/im_end and the assistant turn is opened."""
    text = render_chat([Message("system", "be brief"), Message("user", "hi")])
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert not render_chat([Message("user", "hi")], add_generation_prompt=False).endswith(
        "assistant\n"
    )


def test_it_recalls_the_first_marker_verbatim() -> None:
    """The model answers with exactly the first marker in what it attended to."""
    first, second = new_marker(), new_marker()
    assert recall(f"a {first} b {second}") == first
    assert recall("nothing to see") == NOT_FOUND
    assert recall(f"a {first}", can_recall=False) == NOT_FOUND


@given(st.text(max_size=200), st.integers(min_value=-2, max_value=250))
def test_char_offset_cuts_exactly_after_n_tokens(text: str, n: int) -> None:
    """Slicing at char_offset(text, n) keeps exactly the first n tokens."""
    assert text[: tokenizer.char_offset(text, n)] == "".join(tokenizer.tokenize(text)[: max(n, 0)])


def test_the_pool_keeps_the_smaller_of_64_pages_and_the_kv_pool() -> None:
    """Capacity is min(64 pages, kv_pool tokens' worth), and at least one page."""
    assert KVPagePool(6144).max_pages == 24
    assert KVPagePool(681_280).max_pages == 64
    assert KVPagePool(100).max_pages == 1


def test_the_pool_keeps_the_most_recent_pages_aligned_on_the_prompt_start() -> None:
    """A long prompt leaves only its last pages, cut at multiples of the page size."""
    pool = KVPagePool(1024, page_tokens=256)  # four pages
    text = "".join(f" w{i:05d}" for i in range(3000))  # " w", then five digits: 6 tokens each
    n = tokenizer.count(text)
    pool.write(text, n)
    pieces = tokenizer.tokenize(text)
    pages_total = -(-n // 256)
    expected = [
        "".join(pieces[p * 256 : (p + 1) * 256]) for p in range(pages_total - 4, pages_total)
    ]
    assert len(pool) == 4
    assert pool.recent_first() == "".join(reversed(expected))


def test_vllm_admission_accepts_window_minus_max_tokens_and_rejects_one_more() -> None:
    """prompt + max_tokens = window is served; one token more is a 400 before prefill."""
    spec, pool = endpoint(window=4096), KVPagePool(4096)
    served = decide(spec, FaultMode.HEALTHY, pool, request(4096 - 16, new_marker()))
    rejected = decide(spec, FaultMode.HEALTHY, pool, request(4096 - 15))
    assert isinstance(served, Answer) and served.prompt_tokens == 4080
    assert isinstance(rejected, Reject) and rejected.status == 400
    assert rejected.prefilled_tokens == 0
    assert "maximum context length is 4096 tokens" in rejected.body["error"]["message"]
    assert rejected.body["error"]["param"] == "input_tokens"


def test_llamacpp_admission_accepts_below_n_ctx_and_cuts_the_answer() -> None:
    """llama.cpp: n_ctx - 1 tokens get a one-token answer; n_ctx tokens get exceed_context_size."""
    spec, pool = endpoint(window=4096, flavour=Flavour.LLAMACPP), KVPagePool(4096)
    cut = decide(spec, FaultMode.HEALTHY, pool, request(4095, new_marker()))
    rejected = decide(spec, FaultMode.HEALTHY, pool, request(4096))
    assert isinstance(cut, Answer)
    assert (cut.completion_tokens, cut.finish_reason) == (1, "length")
    assert isinstance(rejected, Reject)
    assert rejected.body["error"]["type"] == "exceed_context_size_error"
    assert rejected.body["error"]["n_prompt_tokens"] == 4096
    assert rejected.body["error"]["n_ctx"] == 4096


def test_openai_flavour_rejects_with_context_length_exceeded() -> None:
    """The OpenAI flavour's rejection carries code context_length_exceeded."""
    decision = decide(
        endpoint(window=4096, flavour=Flavour.OPENAI),
        FaultMode.HEALTHY,
        KVPagePool(4096),
        request(4096),
    )
    assert isinstance(decision, Reject)
    assert decision.body["error"]["code"] == "context_length_exceeded"
    assert "(4096 in the messages, 16 in the completion)" in decision.body["error"]["message"]


def test_an_answer_longer_than_max_tokens_is_cut_with_finish_reason_length() -> None:
    """The answer stops at max_tokens tokens."""
    decision = decide(endpoint(), FaultMode.HEALTHY, KVPagePool(8192), request(200, max_tokens=3))
    assert isinstance(decision, Answer)
    assert decision.pieces == tuple(tokenizer.tokenize(NOT_FOUND)[:3])
    assert decision.finish_reason == "length"


def test_stale_kv_answers_from_earlier_pages_and_reports_one_prompt_token() -> None:
    """An over-pool prompt is swapped for a placeholder; an earlier request's marker leaks."""
    state = EndpointState(endpoint(window=8192, kv_pool=2048, fault=FaultMode.STALE_KV))
    earlier, mine = new_marker(), new_marker()
    state.handle(request(1000, earlier))
    decision = state.handle(request(4000, mine))
    assert isinstance(decision, Answer)
    assert decision.text == earlier
    assert (decision.prompt_tokens, decision.prefilled_tokens) == (1, 1)


def test_stale_kv_with_no_earlier_pages_finds_nothing() -> None:
    """On a fresh endpoint the placeholder attends over nothing."""
    decision = decide(
        endpoint(kv_pool=2048), FaultMode.STALE_KV, KVPagePool(2048), request(4000, new_marker())
    )
    assert isinstance(decision, Answer) and decision.text == NOT_FOUND


@pytest.mark.parametrize(
    ("fault", "keeps_marker"),
    [(FaultMode.TRUNCATE_HEAD, False), (FaultMode.TRUNCATE_TAIL, True)],
)
def test_truncation_keeps_kv_pool_tokens_of_the_right_end(
    fault: FaultMode, keeps_marker: bool
) -> None:
    """Head truncation drops the marker at the start; tail truncation keeps it."""
    marker = new_marker()
    decision = decide(endpoint(kv_pool=2048), fault, KVPagePool(2048), request(4000, marker))
    assert isinstance(decision, Answer)
    assert (decision.text == marker) is keeps_marker
    assert decision.prompt_tokens == decision.prefilled_tokens == 2048


def test_truncation_reports_the_full_count_when_usage_is_sent() -> None:
    """report_usage='sent' makes the engine lie: usage says every token was processed."""
    decision = decide(
        endpoint(kv_pool=2048, report_usage="sent"),
        FaultMode.TRUNCATE_HEAD,
        KVPagePool(2048),
        request(4000, new_marker()),
    )
    assert isinstance(decision, Answer)
    assert (decision.prompt_tokens, decision.prefilled_tokens) == (4000, 2048)


def test_accept_over_limit_answers_from_the_first_window_tokens() -> None:
    """No admission check: an over-window prompt is answered from its first window tokens."""
    marker = new_marker()
    decision = decide(
        endpoint(window=4096), FaultMode.ACCEPT_OVER_LIMIT, KVPagePool(4096), request(5000, marker)
    )
    assert isinstance(decision, Answer)
    assert decision.text == marker and decision.prompt_tokens == 4096


def test_window_not_served_rejects_as_if_the_window_were_the_pool() -> None:
    """A prompt within the window but over the pool gets a context error naming the pool."""
    decision = decide(
        endpoint(window=8192, kv_pool=6144),
        FaultMode.WINDOW_NOT_SERVED,
        KVPagePool(6144),
        request(7000),
    )
    assert isinstance(decision, Reject) and decision.status == 400
    assert "maximum context length is 6144 tokens" in decision.body["error"]["message"]


def test_stream_error_frame_fails_streams_and_500s_plain_requests() -> None:
    """Over the pool, a stream gets an error frame and a plain request a 500."""
    spec, pool = endpoint(kv_pool=2048), KVPagePool(2048)
    streamed = decide(spec, FaultMode.STREAM_ERROR_FRAME, pool, request(4000, stream=True))
    plain = decide(spec, FaultMode.STREAM_ERROR_FRAME, pool, request(4000))
    assert isinstance(streamed, StreamFailure)
    assert isinstance(plain, Reject) and plain.status == 500


def test_wrong_status_rejects_over_window_with_500() -> None:
    """An over-window prompt gets a generic 500, not a context-length 400."""
    decision = decide(
        endpoint(window=4096), FaultMode.WRONG_STATUS, KVPagePool(4096), request(4096)
    )
    assert isinstance(decision, Reject) and decision.status == 500


def test_faults_without_a_kv_rule_serve_over_pool_prompts_whole() -> None:
    """The pool only matters to the KV faults; a healthy endpoint reads the whole prompt."""
    marker = new_marker()
    decision = decide(
        endpoint(kv_pool=1024), FaultMode.HEALTHY, KVPagePool(1024), request(4000, marker)
    )
    assert isinstance(decision, Answer) and decision.text == marker


def test_decide_does_not_touch_the_pool_and_handle_records_only_served_prefill() -> None:
    """Rejections add no prefill and no pages; served requests add both."""
    state = EndpointState(endpoint(window=4096))
    decide(state.spec, state.fault, state.pool, request(1000))
    assert len(state.pool) == 0
    state.handle(request(5000))
    assert (state.stats.requests, state.stats.rejected, state.stats.prefilled_tokens) == (1, 1, 0)
    state.handle(request(1000))
    assert (state.stats.requests, state.stats.prefilled_tokens) == (2, 1000)
    assert len(state.pool) == 4


def test_an_endpoint_spec_validates_its_fields_and_coerces_strings() -> None:
    """Names must be URL-safe and not reserved; sizes positive; fault strings become enums."""
    assert endpoint(fault="stale_kv").fault is FaultMode.STALE_KV
    assert endpoint(window=4096).pool_tokens == 4096
    for bad in ({"window": 0}, {"kv_pool": -1}, {"report_usage": "both"}, {"ttfb_delay": -1}):
        with pytest.raises(ValueError):
            endpoint(**bad)
    for name in ("_sim", "a/b", "", "x y"):
        with pytest.raises(ValueError):
            SimEndpoint(name=name)
