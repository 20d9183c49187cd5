"""Every row of DESIGN §2's verdict table, and the rule that nothing passes by default."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvwatch.canary.edge import judge_edge
from kvwatch.canary.model import (
    Exchange,
    ForeignMarker,
    Judgement,
    Message,
    PlannedPrompt,
    ProbeKind,
    Rejection,
    TransportError,
    Verdict,
)
from kvwatch.canary.verdicts import judge

MARKER = "KVW-7F3K-9QX2-M4TD"
OTHER = ForeignMarker("2222333344445555", 41, "glm-prod", datetime(2026, 12, 1, 3, 0, tzinfo=UTC))


def plan(kind: ProbeKind = ProbeKind.UNDER, planned: int = 4064, tolerance: int = 0):
    return PlannedPrompt(
        kind=kind,
        messages=(Message("user", "…"),),
        marker=MARKER,
        planned_tokens=planned,
        target_tokens=planned,
        exact=tolerance == 0,
        tolerance=tolerance,
        max_tokens=32,
    )


def ok(answer: str = MARKER, prompt_tokens: int = 4064, **kw) -> Exchange:
    base = {
        "status": 200,
        "answer": answer,
        "body_parsed": True,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 12,
        "streamed": True,
        "stream_terminated": True,
        "finish_reason": "stop",
    }
    base.update(kw)
    return Exchange(**base)


def rejected(status: int, rejection: Rejection = Rejection.CONTEXT_LENGTH) -> Exchange:
    return Exchange(status=status, rejection=rejection, error_body='{"error": "…"}')


UN, OV, BL = ProbeKind.UNDER, ProbeKind.OVER, ProbeKind.BASELINE

CASES = [
    # (name, kind, exchange, foreign, verdict)
    ("under passes with marker and exact usage", UN, ok(), (), Verdict.PASS),
    ("baseline passes with marker", BL, ok(), (), Verdict.PASS),
    ("over passes on a 400 context-length error", OV, rejected(400), (), Verdict.PASS),
    ("over passes on a 413 context-length error", OV, rejected(413), (), Verdict.PASS),
    ("over passes on TGI's 422", OV, rejected(422), (), Verdict.PASS),
    (
        "under 200 without marker",
        UN,
        ok(answer="I could not find a code."),
        (),
        Verdict.MARKER_MISSING,
    ),
    (
        "leak on under",
        UN,
        ok(answer="KVW-2222-3333-4444-5555"),
        (OTHER,),
        Verdict.FOREIGN_MARKER,
    ),
    ("leak on baseline", BL, ok(answer="x"), (OTHER,), Verdict.FOREIGN_MARKER),
    ("leak beats a missing usage", UN, ok(prompt_tokens=None), (OTHER,), Verdict.FOREIGN_MARKER),
    ("over accepted", OV, ok(), (), Verdict.OVER_ACCEPTED),
    (
        "over answered 200 with no completion",
        OV,
        Exchange(status=200, body_parsed=False, error_detail="2xx body is not JSON"),
        (),
        Verdict.WRONG_REJECTION,
    ),
    ("under truncated (fewer tokens reported)", UN, ok(prompt_tokens=1), (), Verdict.TRUNCATED),
    ("truncated even with the marker kept", UN, ok(prompt_tokens=2048), (), Verdict.TRUNCATED),
    ("collapsed template on baseline", BL, ok(prompt_tokens=3), (), Verdict.TRUNCATED),
    ("under rejected as too long", UN, rejected(400), (), Verdict.UNDER_REJECTED),
    ("over rejected with 500", OV, rejected(500, Rejection.OTHER), (), Verdict.WRONG_REJECTION),
    (
        "over rejected with other 4xx",
        OV,
        rejected(400, Rejection.OTHER),
        (),
        Verdict.WRONG_REJECTION,
    ),
    (
        "over 200 with an error frame",
        OV,
        ok(stream_error_frame=True),
        (),
        Verdict.WRONG_REJECTION,
    ),
    ("under stream error frame", UN, ok(stream_error_frame=True), (), Verdict.STREAM_ERROR),
    (
        "under stream without terminator",
        UN,
        ok(stream_terminated=False),
        (),
        Verdict.STREAM_ERROR,
    ),
    ("baseline without marker", BL, ok(answer="no idea"), (), Verdict.CANARY_INEFFECTIVE),
    ("timeout", UN, Exchange(transport_error=TransportError.TIMEOUT), (), Verdict.ERROR),
    (
        "connect failure on over",
        OV,
        Exchange(transport_error=TransportError.CONNECT),
        (),
        Verdict.ERROR,
    ),
    ("5xx on under", UN, rejected(503, Rejection.OTHER), (), Verdict.ERROR),
    ("5xx on baseline", BL, rejected(500, Rejection.OTHER), (), Verdict.ERROR),
    ("unparseable 2xx body", UN, Exchange(status=200, body_parsed=False), (), Verdict.ERROR),
    ("2xx without usage", UN, ok(prompt_tokens=None), (), Verdict.ERROR),
    ("other 4xx on under", UN, rejected(404, Rejection.OTHER), (), Verdict.ERROR),
    ("401", UN, rejected(401, Rejection.OTHER), (), Verdict.AUTH_ERROR),
    ("403 on over", OV, rejected(403, Rejection.OTHER), (), Verdict.AUTH_ERROR),
    ("429", UN, rejected(429, Rejection.OTHER), (), Verdict.THROTTLED),
]


@pytest.mark.parametrize(
    ("name", "kind", "exchange", "foreign", "verdict"), CASES, ids=[c[0] for c in CASES]
)
def test_each_situation_gets_its_verdict(name, kind, exchange, foreign, verdict):
    """The verdict table of DESIGN §2, row by row."""
    assert judge(plan(kind), exchange, foreign).verdict is verdict


def test_more_tokens_than_planned_passes_but_reports_the_drift():
    """Usage above plan is a counting finding, never an incident (DESIGN §3)."""
    j = judge(plan(UN), ok(prompt_tokens=4070))
    assert j.verdict is Verdict.PASS
    assert j.token_drift == 6
    assert "recalibrate" in j.reason


def test_an_estimated_plan_tolerates_small_shortfalls():
    """With a tolerance, a few tokens short is not truncation; beyond it, with the marker
    lost, it is (with the marker recalled, see test_estimated_verdicts)."""
    assert judge(plan(UN, tolerance=40), ok(prompt_tokens=4064 - 40)).verdict is Verdict.PASS
    lost = ok(answer="no idea", prompt_tokens=4064 - 41)
    assert judge(plan(UN, tolerance=40), lost).verdict is Verdict.TRUNCATED


def test_the_leak_reason_names_the_probe_endpoint_and_time_it_leaked_from():
    """A foreign marker turns a wrong answer into proof: the reason names its origin."""
    j = judge(plan(UN), ok(answer="x"), (OTHER,))
    assert "probe 41" in j.reason and "glm-prod" in j.reason and "2026-12-01T03:00" in j.reason
    assert j.foreign == [OTHER]


_statuses = st.one_of(st.none(), st.integers(100, 599))
_exchanges = st.builds(
    Exchange,
    status=_statuses,
    transport_error=st.one_of(st.none(), st.sampled_from(TransportError)),
    answer=st.one_of(st.none(), st.text(max_size=50)),
    body_parsed=st.booleans(),
    prompt_tokens=st.one_of(st.none(), st.integers(0, 10_000)),
    streamed=st.booleans(),
    stream_error_frame=st.booleans(),
    stream_terminated=st.booleans(),
    rejection=st.one_of(st.none(), st.sampled_from(Rejection)),
)


@given(st.sampled_from(ProbeKind), _exchanges)
def test_a_pass_always_rests_on_a_positive_check(kind, ex):
    """Property: whatever the exchange, pass implies the kind's positive evidence."""
    p = plan(kind)
    j = judge(p, ex)
    if j.verdict is not Verdict.PASS:
        return
    assert ex.transport_error is None and ex.status is not None
    if kind is ProbeKind.OVER:
        assert 400 <= ex.status < 500 and ex.rejection is Rejection.CONTEXT_LENGTH
    else:
        assert 200 <= ex.status < 300 and j.marker_found and ex.body_parsed
        assert ex.prompt_tokens is not None and ex.prompt_tokens >= p.planned_tokens
        assert not ex.stream_error_frame and (ex.stream_terminated or not ex.streamed)


# An engine without a hard limit (Ollama) cuts an over-long prompt to its window. Its over
# probe is sized at window + 1 and judged on the cut (issue 13).
WINDOW = 4096
CUT_CASES = [
    # (name, plan, exchange, foreign, verdict)
    ("cut to the window", plan(OV, 4097), ok("no code", 4096), (), Verdict.OVER_TRUNCATED),
    ("cut to half the window", plan(OV, 4097), ok("no code", 2050), (), Verdict.OVER_TRUNCATED),
    (
        "cut, with an estimated plan as wide as its tolerance",
        plan(OV, 4180, tolerance=42),
        ok("no code", 4096),
        (),
        Verdict.OVER_TRUNCATED,
    ),
    ("read whole", plan(OV, 4097), ok(prompt_tokens=4097), (), Verdict.OVER_ACCEPTED),
    (
        "read short of an estimate but beyond the window",
        plan(OV, 4180, tolerance=42),
        ok(prompt_tokens=4150),
        (),
        Verdict.OVER_ACCEPTED,
    ),
    ("cut, but leaking", plan(OV, 4097), ok(OTHER.marker, 4096), (OTHER,), Verdict.FOREIGN_MARKER),
    ("refused after all", plan(OV, 4097), rejected(400), (), Verdict.PASS),
    ("answered without usage", plan(OV, 4097), ok(prompt_tokens=None), (), Verdict.ERROR),
    (
        "answered with an error line",
        plan(OV, 4097),
        ok(stream_error_frame=True),
        (),
        Verdict.WRONG_REJECTION,
    ),
    ("under cut is still truncated", plan(UN), ok(prompt_tokens=2050), (), Verdict.TRUNCATED),
]


@pytest.mark.parametrize(
    ("name", "planned", "exchange", "foreign", "verdict"),
    CUT_CASES,
    ids=[c[0] for c in CUT_CASES],
)
def test_an_engine_that_truncates_by_design_gets_over_truncated_for_a_visible_cut(
    name, planned, exchange, foreign, verdict
):
    """On Ollama a cut over prompt is over_truncated; read whole or a leak is still critical."""
    assert judge(planned, exchange, foreign, truncates_to=WINDOW).verdict is verdict


def test_the_cut_is_over_accepted_on_an_engine_with_a_hard_limit():
    """Without truncates_to (every other engine) an answered over prompt is over_accepted."""
    assert judge(plan(OV, 4097), ok("no code", 4096)).verdict is Verdict.OVER_ACCEPTED


def test_the_over_truncated_reason_gives_the_planned_and_read_tokens_and_the_window():
    """The reason says how far the prompt was cut, so the evidence reads without the page."""
    j = judge(plan(OV, 4097), ok("no code", 2050), truncates_to=WINDOW)
    assert j.reason == (
        "engine read 2050 of 4097 planned prompt tokens, no more than its 4096-token window:"
        " it truncates instead of refusing"
    )


@given(st.sampled_from(ProbeKind), _exchanges, st.integers(1, 10_000))
def test_truncates_to_only_softens_an_accepted_over_probe(kind, ex, window):
    """Property: for any probe, knowing the engine truncates changes nothing but an
    over_accepted into over_truncated, and only when usage shows the prompt cut to the window."""
    p = plan(kind)
    hard = judge(p, ex).verdict
    soft = judge(p, ex, truncates_to=window).verdict
    if soft is Verdict.OVER_TRUNCATED:
        assert kind is ProbeKind.OVER and hard is Verdict.OVER_ACCEPTED
        assert ex.prompt_tokens is not None
        assert ex.prompt_tokens < p.planned_tokens and ex.prompt_tokens <= window
    elif hard is Verdict.OVER_ACCEPTED:
        assert soft in (Verdict.OVER_ACCEPTED, Verdict.ERROR)
    else:
        assert soft is hard


@pytest.mark.parametrize(
    ("kind", "exchange"),
    [(UN, ok()), (UN, ok(answer="no code")), (BL, ok(prompt_tokens=3)), (OV, ok())],
)
def test_a_stream_that_went_on_after_its_terminator_says_so_without_changing_the_verdict(
    kind, exchange
):
    """Events after the terminator are named in the reason, and the verdict stays the same."""
    plain = judge(plan(kind), exchange)
    talked = judge(plan(kind), dataclasses.replace(exchange, events_after_terminator=2))
    assert talked.verdict is plain.verdict
    assert talked.reason == (
        f"{plain.reason}; the stream went on after its terminator (2 events, not read)"
    )


# A report the engine cannot mean is no counting drift: whatever the kind, the probe does not
# pass, and its reason names the value (DESIGN §2, "never a pass by default").
SIZED = 4096  # the window the plans below were sized against
DOUBT = "the engine's usage report cannot be believed: "
BEYOND = DOUBT + "prompt_tokens 1000000000000 on a 4096-token window"
E12 = 10**12
# How each kind is planned: edge, like over, at least its size; bisect like under.
PLANNED_AS = {"under": UN, "baseline": BL, "edge": OV, "bisect": UN, "over": OV, "ollama-over": OV}


def judge_as(kind: str, planned: int, usage: int | str) -> Judgement:
    """Judge an answer as the runner does for ``kind``, its plan sized against SIZED.

    ``usage`` is the prompt count the engine reported, or (a string) the count that is no
    count which the adapter recorded instead. Over probes are answered without the marker.
    """
    p = dataclasses.replace(plan(PLANNED_AS[kind], planned), window=SIZED)
    answer = "no code" if kind in ("over", "ollama-over") else MARKER
    if isinstance(usage, str):
        ex = ok(answer=answer, prompt_tokens=None, unusable_usage=usage)
    else:
        ex = ok(answer=answer, prompt_tokens=usage)
    if kind == "edge":
        return judge_edge(p, ex)
    if kind == "bisect":
        return judge(dataclasses.replace(p, kind=ProbeKind.UNDER), ex)
    if kind == "ollama-over":
        return judge(p, ex, truncates_to=SIZED)
    return judge(p, ex)


IMPOSSIBLE_USAGE = [
    # (kind, planned prompt tokens, usage reported, verdict, reason)
    ("under", 4064, E12, Verdict.ERROR, BEYOND),
    ("under", 4064, 4097, Verdict.ERROR, DOUBT + "prompt_tokens 4097 on a 4096-token window"),
    ("baseline", 1536, E12, Verdict.ERROR, BEYOND),
    ("edge", 3001, E12, Verdict.ERROR, BEYOND),
    ("bisect", 2048, E12, Verdict.ERROR, BEYOND),
    ("under", 4064, "usage.prompt_tokens -7", Verdict.ERROR, DOUBT + "usage.prompt_tokens -7"),
    (
        "baseline",
        1536,
        'usage.prompt_tokens "1536"',
        Verdict.ERROR,
        DOUBT + 'usage.prompt_tokens "1536"',
    ),
    (
        "edge",
        3001,
        "usage.prompt_tokens 3001.5",
        Verdict.ERROR,
        DOUBT + "usage.prompt_tokens 3001.5",
    ),
    ("bisect", 2048, "usage.prompt_tokens true", Verdict.ERROR, DOUBT + "usage.prompt_tokens true"),
    # A prompt planned past the window (Ollama's over probe) may be read whole, not past itself.
    (
        "ollama-over",
        4097,
        E12,
        Verdict.ERROR,
        DOUBT + "prompt_tokens 1000000000000 for a 4097-token prompt on a 4096-token window",
    ),
    ("ollama-over", 4097, "prompt_eval_count -1", Verdict.ERROR, DOUBT + "prompt_eval_count -1"),
    # A hard-limit engine that answered an over probe is over_accepted whatever it counted.
    (
        "over",
        4049,
        E12,
        Verdict.OVER_ACCEPTED,
        "over-limit prompt accepted with HTTP 200; " + BEYOND,
    ),
]


@pytest.mark.parametrize(("kind", "planned", "usage", "verdict", "reason"), IMPOSSIBLE_USAGE)
def test_usage_the_engine_cannot_mean_is_never_a_pass_and_names_the_value(
    kind, planned, usage, verdict, reason
):
    """Prompt tokens past the window, negative or not an integer: no pass, the value named."""
    j = judge_as(kind, planned, usage)
    assert (j.verdict, j.reason) == (verdict, reason)


@pytest.mark.parametrize(
    ("kind", "planned", "reported"),
    [
        ("under", 4064, SIZED),
        ("baseline", 1536, 3000),
        ("edge", 3001, 3051),
        ("ollama-over", 4097, 4097),
    ],
)
def test_a_count_the_window_can_hold_is_still_drift_or_evidence(kind, planned, reported):
    """Up to the window (or the prompt planned past it) a count is believed, as before."""
    j = judge_as(kind, planned, reported)
    assert not j.reason.startswith(DOUBT)
    assert j.verdict in (Verdict.PASS, Verdict.OVER_ACCEPTED)
