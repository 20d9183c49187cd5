"""Request helpers every simulated API shares: the endpoint a path names, credentials, JSON
bodies, chat messages, usage and SSE framing. Used by the OpenAI-compatible routes
(:mod:`kvwatch.simulator.app`) and the engine-native ones (:mod:`kvwatch.simulator.native`).
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvwatch.canary.model import Message
from kvwatch.simulator import errors
from kvwatch.simulator.model import Answer, EndpointState, Simulation
from kvwatch.simulator.spec import Flavour


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _endpoint(request: Request) -> EndpointState:
    sim: Simulation = request.app.state.simulation
    name = request.path_params["name"]
    state = sim.get(name)
    if state is None:
        raise HTTPException(404, f"no simulated endpoint named {name!r}")
    return state


def credential(state: EndpointState, request: Request) -> str | None:
    """The key a request presents (None without one): who sent it."""
    if state.spec.flavour is Flavour.ANTHROPIC:
        # Anthropic authenticates with x-api-key, not a bearer token.
        return request.headers.get("x-api-key")
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    return token if scheme.lower() == "bearer" and token else None


def _authorised(state: EndpointState, request: Request) -> bool:
    keys = state.spec.keys
    if not keys:
        return True
    given = (credential(state, request) or "").encode()
    # Every key compared, in constant time each: which one matched must not show in timing.
    return sum(hmac.compare_digest(given, key.encode()) for key in keys) > 0


def _error(state: EndpointState, status: int, message: str, param: str | None = None) -> Response:
    return JSONResponse(errors.error_body(state.spec.flavour, status, message, param=param), status)


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        raise _BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    return body


def _content_text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise _BadRequest(f"messages[{index}].content: only text parts are supported")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise _BadRequest(f"messages[{index}].content must be a string or a list of parts")


def _messages(raw: Any) -> tuple[Message, ...]:
    if not isinstance(raw, list) or not raw:
        raise _BadRequest("messages must be a non-empty list", "messages")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise _BadRequest(f"messages[{i}] must be an object with a string role", "messages")
        out.append(Message(role=item["role"], content=_content_text(item.get("content"), i)))
    return tuple(out)


def _max_tokens(body: dict[str, Any]) -> int | None:
    # vLLM reads max_completion_tokens first, then the deprecated max_tokens.
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _BadRequest(f"{key} must be a positive integer", key)
        return value
    return None


def _usage(answer: Answer) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
    }
    if answer.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": answer.cached_tokens}
    return usage


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()
