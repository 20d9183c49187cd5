"""Hypothesis strategies for engine garbage: JSON-ish shapes, SSE streams, raw bytes.

None of them ever contains a kvwatch marker (``KVW-`` is kept out of every string), so a
probe judged on them can only pass if kvwatch invents a recall that did not happen.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from kvwatch.canary.markers import new_marker
from kvwatch.canary.model import Message, PlannedPrompt, ProbeKind

PLANNED_TOKENS = 100


def no_marker(text: str) -> bool:
    return "kvw" not in text.lower()


texts = st.text(max_size=40).filter(no_marker)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    texts,
    st.just(PLANNED_TOKENS),
)
# Keys engines use, so random shapes often come close to a real completion.
keys = st.one_of(
    st.sampled_from(
        [
            "choices", "message", "delta", "content", "usage", "prompt_tokens",
            "completion_tokens", "finish_reason", "index", "error", "code", "type", "text",
            "role", "detail", "msg",
        ]
    ),
    texts,
)  # fmt: skip
json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)
    ),
    max_leaves=25,
)


@st.composite
def completion_like(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed completion with the planned usage, whose answer lacks the marker."""
    return {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": draw(texts)},
                "finish_reason": draw(st.sampled_from(["stop", "length", None])),
            }
        ],
        "usage": {"prompt_tokens": PLANNED_TOKENS, "completion_tokens": draw(st.integers(0, 99))},
    }


@st.composite
def sse_streams(draw: st.DrawFn) -> bytes:
    """SSE framing around JSON-ish frames, sometimes terminated, sometimes cut or garbled."""
    frames = draw(st.lists(st.one_of(json_values, completion_like()), max_size=6))
    parts = [b"data: " + json.dumps(frame).encode() + b"\n\n" for frame in frames]
    if draw(st.booleans()):
        parts.append(b"data: [DONE]\n\n")
    raw = b"".join(parts)
    if raw and draw(st.booleans()):
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw + draw(st.binary(max_size=16))


garbage_bodies = st.one_of(
    st.binary(max_size=200),
    texts.map(str.encode),
    json_values.map(lambda v: json.dumps(v).encode()),
    completion_like().map(lambda v: json.dumps(v).encode()),
    sse_streams(),
).filter(lambda body: no_marker(body.decode("utf-8", "replace")))


def plan(kind: ProbeKind = ProbeKind.UNDER) -> PlannedPrompt:
    marker = new_marker()
    return PlannedPrompt(
        kind=kind,
        messages=(Message("user", f"Remember {marker}. What was the code?"),),
        marker=marker,
        planned_tokens=PLANNED_TOKENS,
        target_tokens=PLANNED_TOKENS,
        exact=True,
        tolerance=0,
        max_tokens=16,
    )
