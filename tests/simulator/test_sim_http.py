"""The simulator over real HTTP: each fault's status, body shape, usage and stream frames."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sim_helpers import QUESTION, answer_text, as_json, chat_body, sized_messages, sse_payloads

from kvwatch.canary.markers import new_marker
from kvwatch.simulator.model import NOT_FOUND
from kvwatch.simulator.server import SHUTDOWN_GRACE_SECONDS, _bind, run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint

Start = Callable[..., Any]


def chat_url(name: str) -> str:
    return f"/{name}/v1/chat/completions"


async def test_models_lists_the_model_with_its_window(start: Start) -> None:
    """GET /NAME/v1/models is an OpenAI list with max_model_len = the advertised window."""
    sim, client = await start([SimEndpoint("a", model="m-7", window=4096)])
    response = await client.get("/a/v1/models")
    assert response.status_code == 200
    card = response.json()["data"][0]
    assert response.json()["object"] == "list"
    assert (card["id"], card["object"], card["owned_by"], card["max_model_len"]) == (
        "m-7",
        "model",
        "kvwatch-sim",
        4096,
    )
    assert sim.url_for("a") == f"{sim.base_url}/a/v1"


async def test_tokenize_and_usage_agree_exactly_for_the_same_messages(
    start: Start, marker: str
) -> None:
    """vLLM /tokenize, llama.cpp /apply-template + /tokenize and usage all count alike."""
    _, client = await start([SimEndpoint("a", window=8192)])
    messages = as_json(sized_messages(3210, marker))
    vllm = (
        await client.post(
            "/a/tokenize",
            json={"model": "sim-1", "messages": messages, "add_generation_prompt": True},
        )
    ).json()
    rendered = (await client.post("/a/apply-template", json={"messages": messages})).json()
    llamacpp = (
        await client.post("/a/tokenize", json={"content": rendered["prompt"], "add_special": True})
    ).json()
    completion = (
        await client.post(chat_url("a"), json={"messages": messages, "max_tokens": 16})
    ).json()
    assert vllm["count"] == len(vllm["tokens"]) == 3210
    assert vllm["max_model_len"] == 8192
    assert llamacpp["tokens"] == vllm["tokens"]
    assert completion["usage"]["prompt_tokens"] == 3210


async def test_tokenize_accepts_a_raw_prompt_and_llamacpp_pieces(start: Start) -> None:
    """The vLLM prompt shape counts raw text; llama.cpp with_pieces pairs ids with text."""
    _, client = await start([SimEndpoint("a")])
    counted = (await client.post("/a/tokenize", json={"prompt": "hello world"})).json()
    pieces = (
        await client.post("/a/tokenize", json={"content": "hello world", "with_pieces": True})
    ).json()
    assert counted["count"] == 2
    assert [p["piece"] for p in pieces["tokens"]] == ["hello", " world"]
    assert [p["id"] for p in pieces["tokens"]] == counted["tokens"]


async def test_a_healthy_endpoint_answers_the_marker_with_usage(start: Start, marker: str) -> None:
    """200, the marker verbatim, finish_reason stop, usage = prompt + completion."""
    _, client = await start([SimEndpoint("a", window=8192)])
    body = (await client.post(chat_url("a"), json=chat_body(4000, marker))).json()
    choice = body["choices"][0]
    assert body["object"] == "chat.completion"
    assert choice["message"] == {"role": "assistant", "content": marker}
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] == 4000
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_a_healthy_stream_sends_role_content_finish_usage_and_done(
    start: Start, marker: str
) -> None:
    """SSE: a role chunk, content chunks, a finish chunk, a usage chunk, then [DONE]."""
    _, client = await start([SimEndpoint("a", window=8192)])
    response = await client.post(chat_url("a"), json=chat_body(4000, marker, stream=True))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    frames = [json.loads(p) for p in payloads[:-1]]
    assert {f["object"] for f in frames} == {"chat.completion.chunk"}
    assert len({f["id"] for f in frames}) == 1
    assert frames[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(f["choices"][0]["delta"].get("content", "") for f in frames[:-2])
    assert content == marker
    assert frames[-2]["choices"][0]["finish_reason"] == "stop"
    assert frames[-1]["choices"] == []
    assert frames[-1]["usage"]["prompt_tokens"] == 4000


async def test_a_stream_without_include_usage_sends_no_usage_chunk(start: Start) -> None:
    """Without stream_options.include_usage the finish chunk is the last before [DONE]."""
    _, client = await start([SimEndpoint("a")])
    body = chat_body(500, stream=True, stream_options={"include_usage": False})
    frames = sse_payloads((await client.post(chat_url("a"), json=body)).text)
    assert json.loads(frames[-2])["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
async def test_admission_accepts_window_minus_max_tokens_and_rejects_one_more(
    start: Start, marker: str, stream: bool
) -> None:
    """W - M prompt tokens get 200; W - M + 1 get vLLM's 400 context-length body."""
    _, client = await start([SimEndpoint("a", window=4096)])
    ok = await client.post(chat_url("a"), json=chat_body(4096 - 16, marker, stream=stream))
    over = await client.post(chat_url("a"), json=chat_body(4096 - 15, marker, stream=stream))
    assert ok.status_code == 200 and answer_text(ok) == marker
    assert over.status_code == 400
    error = over.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == (
        "BadRequestError",
        400,
        "input_tokens",
    )
    assert error["message"].startswith("This model's maximum context length is 4096 tokens.")
    assert "your prompt contains 4081 input tokens" in error["message"]


async def test_stale_kv_leaks_a_marker_from_an_earlier_request_on_the_same_endpoint_only(
    start: Start,
) -> None:
    """Over the pool: 200, prompt_tokens 1, and the answer is this endpoint's earlier marker."""
    stale = SimEndpoint("a", window=8192, kv_pool=6144, fault=FaultMode.STALE_KV)
    _, client = await start([stale, dataclasses.replace(stale, name="b")])
    planted_a, planted_b, mine = new_marker(), new_marker(), new_marker()
    await client.post(chat_url("b"), json=chat_body(1500, planted_b))
    await client.post(chat_url("a"), json=chat_body(1500, planted_a))
    await client.post(chat_url("b"), json=chat_body(1200, new_marker()))
    for stream in (False, True):
        response = await client.post(chat_url("a"), json=chat_body(8000, mine, stream=stream))
        assert response.status_code == 200
        assert answer_text(response) == planted_a
    plain = (await client.post(chat_url("a"), json=chat_body(8000, mine))).json()
    assert plain["usage"]["prompt_tokens"] == 1


@pytest.mark.parametrize(
    ("fault", "report_usage", "marker_kept", "reported"),
    [
        (FaultMode.TRUNCATE_HEAD, "attended", False, 6144),
        (FaultMode.TRUNCATE_TAIL, "attended", True, 6144),
        (FaultMode.TRUNCATE_HEAD, "sent", False, 8000),
    ],
)
async def test_truncation_answers_200_from_the_kept_tokens(
    start: Start, marker: str, fault: FaultMode, report_usage: str, marker_kept: bool, reported: int
) -> None:
    """Head/tail truncation keeps kv_pool tokens silently; usage is attended or sent."""
    spec = SimEndpoint(
        "a",
        window=8192,
        kv_pool=6144,
        fault=fault,
        report_usage=report_usage,  # type: ignore[arg-type]
    )
    _, client = await start([spec])
    response = await client.post(chat_url("a"), json=chat_body(8000, marker))
    body = response.json()
    assert response.status_code == 200
    assert (body["choices"][0]["message"]["content"] == marker) is marker_kept
    assert body["usage"]["prompt_tokens"] == reported


async def test_accept_over_limit_answers_an_over_window_prompt(start: Start, marker: str) -> None:
    """No admission check: a prompt over the window gets 200."""
    _, client = await start([SimEndpoint("a", window=4096, fault=FaultMode.ACCEPT_OVER_LIMIT)])
    response = await client.post(chat_url("a"), json=chat_body(4096 - 15, marker))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == marker


async def test_stream_error_frame_sends_an_error_frame_inside_a_200_stream(start: Start) -> None:
    """Streaming over the pool: 200, role chunk, data: {"error": ...}, [DONE]; plain: 500."""
    spec = SimEndpoint("a", window=8192, kv_pool=6144, fault=FaultMode.STREAM_ERROR_FRAME)
    _, client = await start([spec])
    streamed = await client.post(chat_url("a"), json=chat_body(7000, stream=True))
    assert streamed.status_code == 200
    payloads = sse_payloads(streamed.text)
    assert len(payloads) == 3 and payloads[-1] == "[DONE]"
    assert json.loads(payloads[0])["choices"][0]["delta"]["role"] == "assistant"
    error = json.loads(payloads[1])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    plain = await client.post(chat_url("a"), json=chat_body(7000))
    assert plain.status_code == 500 and "error" in plain.json()
    within = await client.post(chat_url("a"), json=chat_body(6000, stream=True))
    assert "error" not in within.text


async def test_wrong_status_answers_over_window_with_500(start: Start) -> None:
    """Over the window: 500 with a generic error; within the window: 200."""
    _, client = await start([SimEndpoint("a", window=4096, fault=FaultMode.WRONG_STATUS)])
    over = await client.post(chat_url("a"), json=chat_body(4096 - 15))
    within = await client.post(chat_url("a"), json=chat_body(4096 - 16))
    assert over.status_code == 500
    assert "maximum context length" not in over.text
    assert within.status_code == 200


async def test_window_not_served_rejects_below_the_advertised_window(start: Start) -> None:
    """Within the window but over the pool: a 400 context-length error naming the pool."""
    spec = SimEndpoint("a", window=8192, kv_pool=6144, fault=FaultMode.WINDOW_NOT_SERVED)
    _, client = await start([spec])
    response = await client.post(chat_url("a"), json=chat_body(8192 - 16))
    assert response.status_code == 400
    assert "maximum context length is 6144 tokens" in response.json()["error"]["message"]
    assert (await client.post(chat_url("a"), json=chat_body(6000))).status_code == 200


async def test_no_recall_never_repeats_the_marker(start: Start, marker: str) -> None:
    """The weak model answers the not-found sentence even for a short prompt."""
    _, client = await start([SimEndpoint("a", fault=FaultMode.NO_RECALL)])
    body = (await client.post(chat_url("a"), json=chat_body(1000, marker, max_tokens=64))).json()
    assert body["choices"][0]["message"]["content"] == NOT_FOUND


async def test_throttled_answers_429_with_retry_after(start: Start) -> None:
    """Every chat request gets 429, a Retry-After header and an OpenAI rate-limit body."""
    _, client = await start([SimEndpoint("a", fault=FaultMode.THROTTLED)])
    response = await client.post(chat_url("a"), json=chat_body(500))
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) > 0
    assert response.json()["error"]["code"] == "rate_limit_exceeded"


async def test_server_error_answers_500(start: Start) -> None:
    """Every chat request gets 500."""
    _, client = await start([SimEndpoint("a", fault=FaultMode.SERVER_ERROR)])
    response = await client.post(chat_url("a"), json=chat_body(500))
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "InternalServerError"


async def test_an_api_key_is_required_when_configured(start: Start) -> None:
    """Without the bearer key: 401 invalid_api_key; with it: 200."""
    _, client = await start([SimEndpoint("a", api_key="s3cret")])
    missing = await client.post(chat_url("a"), json=chat_body(500))
    wrong = await client.get("/a/v1/models", headers={"Authorization": "Bearer nope"})
    right = await client.post(
        chat_url("a"), json=chat_body(500), headers={"Authorization": "Bearer s3cret"}
    )
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert right.status_code == 200
    assert (await client.get("/a/health")).status_code == 200


async def test_the_control_api_switches_a_fault_at_runtime(start: Start) -> None:
    """PUT /NAME/_sim/fault changes behaviour at once; an unknown fault is a 400."""
    sim, client = await start([SimEndpoint("a")])
    switched = await client.put("/a/_sim/fault", json={"fault": "throttled"})
    assert switched.json() == {"name": "a", "fault": "throttled"}
    assert (await client.post(chat_url("a"), json=chat_body(500))).status_code == 429
    bad = await client.put("/a/_sim/fault", json={"fault": "sleepy"})
    assert bad.status_code == 400 and "stale_kv" in bad.json()["error"]["message"]
    sim.set_fault("a", FaultMode.HEALTHY)
    assert (await client.post(chat_url("a"), json=chat_body(500))).status_code == 200


async def test_the_control_api_redeploys_an_endpoints_self_report_and_fault_at_once(
    start: Start,
) -> None:
    """PUT /NAME/_sim/fingerprint changes the version vLLM reports and its process start,
    and with ``fault`` the fault in the same step; a bad body is a 400."""
    _, client = await start([SimEndpoint("a")])
    before = (await client.get("/a/metrics")).text
    assert (await client.get("/a/version")).json() == {"version": "0.0.0-kvwatch-sim"}
    redeployed = await client.put(
        "/a/_sim/fingerprint", json={"version": "0.12.0", "fault": "throttled"}
    )
    body = redeployed.json()
    assert (body["version"], body["fault"]) == ("0.12.0", "throttled")
    assert (await client.get("/a/version")).json() == {"version": "0.12.0"}
    after = (await client.get("/a/metrics")).text
    start_line = [line for line in after.splitlines() if line.startswith("process_start_time")]
    assert start_line == [f"process_start_time_seconds {body['started_at']}"]
    assert start_line[0] not in before.splitlines()  # a new process
    assert (await client.post(chat_url("a"), json=chat_body(500))).status_code == 429
    same_process = await client.put("/a/_sim/fingerprint", json={"restart": False})
    assert same_process.json()["started_at"] == body["started_at"]
    bad = await client.put("/a/_sim/fingerprint", json={"version": 12})
    assert bad.status_code == 400


async def test_stats_count_prefilled_tokens_and_rejections_separately(start: Start) -> None:
    """Rejected requests add no prefilled tokens; served ones add their prompt tokens."""
    _, client = await start([SimEndpoint("a", window=4096), SimEndpoint("b")])
    await client.post(chat_url("a"), json=chat_body(1000))
    await client.post(chat_url("a"), json=chat_body(4096))
    await client.post("/a/tokenize", json={"prompt": "x"})
    stats = (await client.get("/_sim/stats")).json()
    assert stats["a"] == {
        "requests": 2,
        "prefilled_tokens": 1000,
        "rejected": 1,
        "tokenize_calls": 1,
        "peak_in_flight": 1,
        "fault": "healthy",
    }
    assert stats["b"]["requests"] == 0


async def test_unknown_endpoints_and_routes_get_json_404s(start: Start) -> None:
    """An unknown name or path is a 404 with a JSON error body."""
    _, client = await start([SimEndpoint("a")])
    for path in ("/nope/v1/models", "/a/v1/nothing"):
        response = await client.get(path)
        assert response.status_code == 404
        assert "error" in response.json()


async def test_malformed_requests_get_400_and_a_wrong_model_404(start: Start) -> None:
    """Bad JSON, bad max_tokens or no messages: 400; another model name: vLLM's 404."""
    _, client = await start([SimEndpoint("a")])
    bad_json = await client.post(chat_url("a"), content=b"{not json")
    bad_max = await client.post(chat_url("a"), json={**chat_body(500), "max_tokens": 0})
    no_messages = await client.post(chat_url("a"), json={"max_tokens": 5})
    wrong_model = await client.post(chat_url("a"), json={**chat_body(500), "model": "gpt-9"})
    assert bad_json.status_code == bad_max.status_code == no_messages.status_code == 400
    assert wrong_model.status_code == 404
    assert wrong_model.json()["error"]["message"] == "The model `gpt-9` does not exist."


async def test_max_completion_tokens_cuts_the_answer_with_finish_reason_length(
    start: Start,
) -> None:
    """max_completion_tokens is honoured like max_tokens."""
    _, client = await start([SimEndpoint("a")])
    body = {**chat_body(500), "max_completion_tokens": 2}
    del body["max_tokens"]
    choice = (await client.post(chat_url("a"), json=body)).json()["choices"][0]
    assert choice["finish_reason"] == "length"


async def test_slow_prefill_delays_the_answer_without_blocking_other_endpoints(
    start: Start,
) -> None:
    """A slow endpoint sleeps before its first byte while the others keep answering."""
    slow = SimEndpoint("slow", prefill_tokens_per_second=2000, ttfb_delay=0.2)
    _, client = await start([slow, SimEndpoint("fast")])
    began = time.monotonic()
    pending = asyncio.create_task(client.post(chat_url("slow"), json=chat_body(1000)))
    await asyncio.sleep(0.05)
    assert (await client.get("/fast/health")).status_code == 200
    assert not pending.done()
    assert (await pending).status_code == 200
    assert time.monotonic() - began >= 0.7  # 1000 / 2000 s of prefill + 0.2 s


async def test_a_200000_token_prompt_is_tokenized_and_answered(start: Start, marker: str) -> None:
    """A 200K-token canary round-trips through /tokenize and a completion."""
    _, client = await start([SimEndpoint("big", window=262_144)])
    messages = as_json(sized_messages(200_000, marker))
    counted = (await client.post("/big/tokenize", json={"messages": messages})).json()
    answer = (
        await client.post(chat_url("big"), json={"messages": messages, "max_tokens": 16})
    ).json()
    assert counted["count"] == 200_000
    assert answer["choices"][0]["message"]["content"] == marker
    assert answer["usage"]["prompt_tokens"] == 200_000
    assert QUESTION.strip() in messages[0]["content"]


def test_the_listening_socket_says_tcp_so_responses_are_not_held_by_nagle() -> None:
    """asyncio sets TCP_NODELAY only on sockets whose proto is TCP (40 ms per request without)."""
    sock = _bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


async def test_stopping_cuts_a_request_still_in_its_simulated_prefill() -> None:
    """A 60 s prefill does not hold the simulator's shutdown beyond its short grace."""
    endpoint = SimEndpoint(name="slow", window=4096, ttfb_delay=60)
    async with httpx.AsyncClient(timeout=120) as client:
        async with run_simulator([endpoint]) as sim:
            request = asyncio.create_task(
                client.post(f"{sim.url_for('slow')}/chat/completions", json=chat_body(64))
            )
            await asyncio.sleep(0.5)  # the request is in its prefill sleep
            began = time.monotonic()
        stopped_after = time.monotonic() - began
        try:
            response = await request
        except httpx.HTTPError:
            pass  # cut before uvicorn could say anything
        else:
            assert response.status_code == 500  # cut: uvicorn's reply to a cancelled request
    assert stopped_after < SHUTDOWN_GRACE_SECONDS + 10
