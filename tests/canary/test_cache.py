"""The cache canary's pure parts: documents, the cycle's steps and its verdict."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from kvwatch.canary import markers
from kvwatch.canary.cache import (
    FACT_DEPTHS,
    Ask,
    Document,
    Sent,
    branch_of,
    control_of,
    draw_document,
    judge_cache,
    needs_control,
    plan_cycle,
    planted,
    returning,
    step_of,
)
from kvwatch.canary.model import CacheOutcome, Exchange, ForeignMarker, Verdict
from kvwatch.canary.scan import scan_answer

ISSUED = datetime(2026, 1, 1, tzinfo=UTC)


def _codes(n: int) -> list[str]:
    return [markers.new_marker() for _ in range(n)]


def _cycle(seed: int = 3) -> tuple[tuple[Ask, ...], dict[str, str]]:
    rng = random.Random(seed)
    a = draw_document(rng, "A", _codes(4), 600)
    a2 = branch_of(a, _codes(2))
    b = draw_document(rng, "B", _codes(4), 600)
    return plan_cycle(a, a2, b), planted([a, a2, b])


def _send(
    ask: Ask,
    answer: str | None,
    *,
    cached: int | None = 500,
    status: int = 200,
    foreign: tuple[ForeignMarker, ...] = (),
    codes: dict[str, str] | None = None,
) -> Sent:
    own = list(codes or planted([ask.document]))
    ex = Exchange(
        status=status,
        answer=answer,
        body_parsed=answer is not None,
        cached_prompt_tokens=None if ask.step == "cold" else cached,
        prompt_tokens=600,
        streamed=ask.step == "abort",
    )
    return Sent(ask, ex, scan_answer(answer, own, foreign))


def _right(asks: tuple[Ask, ...], codes: dict[str, str], **kw: object) -> list[Sent]:
    return [_send(a, f"The code is {a.expected}.", codes=codes, **kw) for a in asks]  # type: ignore[arg-type]


def test_a_document_plants_each_fact_once_in_order_of_depth() -> None:
    """Four fact lines, the first line names the document, the filler sized near the ask."""
    doc = draw_document(random.Random(1), "A", _codes(4), 800)
    text = doc.text()
    assert text.startswith(f"Document {doc.nonce}.")
    positions = [text.index(f"The {key} code is {code}.") for key, code in doc.facts]
    assert positions == sorted(positions) and len(positions) == len(FACT_DEPTHS)
    assert 600 <= len(text.split()) <= 800


def test_the_branch_shares_the_first_part_and_parts_before_its_third_fact() -> None:
    """A' is A up to the third fact; the later keys hold new codes."""
    a = draw_document(random.Random(2), "A", _codes(4), 800)
    a2 = branch_of(a, _codes(2))
    shared = a.text().index(f"The {a.facts[2][0]} code is")
    assert a2.text()[:shared] == a.text()[:shared]
    assert [k for k, _ in a2.facts] == [k for k, _ in a.facts]
    assert a2.facts[2][1] != a.facts[2][1] and a2.facts[3][1] != a.facts[3][1]


def test_a_control_asks_the_same_question_behind_another_first_line() -> None:
    """No prefix in common with the document it re-asks, so no cache can serve it."""
    asks, _ = _cycle()
    control = control_of(asks[2], "c0ffee")
    assert control.messages()[0].content.startswith("Control c0ffee.\nDocument")
    assert control.expected == asks[2].expected
    assert control.messages()[0].content.endswith(asks[2].messages()[0].content.split("\n")[-1])


def test_the_steps_ask_different_facts_of_a_and_b() -> None:
    """Cold and warm ask A different questions; the reuse asks B's last fact."""
    asks, _ = _cycle()
    assert [a.step for a in asks] == ["cold", "warm", "branch", "abort", "reuse"]
    assert asks[0].key != asks[1].key and asks[0].document is asks[1].document
    assert asks[4].key == asks[4].document.facts[3][0]


def test_a_cycle_answered_right_with_a_warm_hit_passes() -> None:
    """Every fact right, the warm step served from the cache: pass, with the hits named."""
    asks, codes = _cycle()
    judgement = judge_cache(_right(asks, codes), codes)
    assert judgement.verdict is Verdict.PASS
    assert "warm 500" in judgement.reason
    assert [s.outcome for s in judgement.cache] == [
        CacheOutcome.RIGHT,
        CacheOutcome.RIGHT,
        CacheOutcome.RIGHT,
        CacheOutcome.ABORTED,
        CacheOutcome.RIGHT,
    ]


@pytest.mark.parametrize(
    ("cached", "said"),
    [
        (None, "reported no cached tokens"),
        (0, "had 0 of its 600 prompt tokens served"),
        # llama.cpp on an SWA model without --swa-full: the template's few tokens only.
        (6, "had 6 of its 600 prompt tokens served"),
    ],
)
def test_a_warm_step_with_no_cache_hit_did_not_exercise_the_cache(
    cached: int | None, said: str
) -> None:
    """No hit reported, or none served: cache_not_exercised, never a pass."""
    asks, codes = _cycle()
    judgement = judge_cache(_right(asks, codes, cached=cached), codes)
    assert judgement.verdict is Verdict.CACHE_NOT_EXERCISED
    assert said in judgement.reason


def test_a_branch_answered_with_the_earlier_documents_code_is_cache_corrupt() -> None:
    """A' asked, A's code given, both controls right: cache_corrupt naming where the code
    was."""
    asks, codes = _cycle()
    sent = _right(asks, codes)
    branch = asks[2]
    a_code = asks[0].document.code(branch.key)
    sent[2] = _send(branch, f"The code is {a_code}.", codes=codes)
    for nonce in ("c0ffee", "f00d"):
        assert needs_control([step_of(s, codes) for s in sent]) == 2
        control = control_of(branch, nonce)
        sent.append(_send(control, f"It is {control.expected}", cached=0, codes=codes))
    assert needs_control([step_of(s, codes) for s in sent]) is None
    judgement = judge_cache(sent, codes)
    assert judgement.verdict is Verdict.CACHE_CORRUPT
    assert f"with the code planted as A {branch.key}" in judgement.reason
    assert "500 prompt tokens served from the cache" in judgement.reason
    assert "the cold step and 2 controls with no cache hit were right" in judgement.reason


def test_one_right_control_is_not_enough_to_blame_the_cache() -> None:
    """The case met on llama-server with Gemma 3 270M: cold right, warm wrong from the cache,
    one control right. A second control is asked for; judged without it, canary_ineffective."""
    asks, codes = _cycle()
    sent = _right(asks, codes)
    sent[1] = _send(asks[1], "The yellow code is KVW-Q1N3-Q9Z-Q8X.", codes=codes)
    control = control_of(asks[1], "c0ffee")
    sent.append(_send(control, f"The code is {control.expected}.", cached=0, codes=codes))
    assert needs_control([step_of(s, codes) for s in sent]) == 1
    judgement = judge_cache(sent, codes)
    assert judgement.verdict is Verdict.CANARY_INEFFECTIVE
    assert "1 of the 2 controls it needs were sent" in judgement.reason


def test_a_second_control_that_answers_wrong_makes_it_the_models_limit() -> None:
    """First control right, second wrong: the answer hangs on noise, canary_ineffective, and
    no third control is sent."""
    asks, codes = _cycle()
    sent = _right(asks, codes)
    sent[1] = _send(asks[1], "The yellow code is KVW-Q1N3-Q9Z-Q8X.", codes=codes)
    first, second = control_of(asks[1], "c0ffee"), control_of(asks[1], "f00d")
    sent.append(_send(first, f"The code is {first.expected}.", cached=0, codes=codes))
    sent.append(_send(second, "The yellow code is KVW-Q1N3-Q8Z-Q9R.", cached=0, codes=codes))
    assert needs_control([step_of(s, codes) for s in sent]) is None
    judgement = judge_cache(sent, codes)
    assert judgement.verdict is Verdict.CANARY_INEFFECTIVE
    assert "so did its control" in judgement.reason


def test_a_wrong_reuse_whose_control_is_wrong_too_is_the_models_limit() -> None:
    """The control fails as well: canary_ineffective, no page."""
    asks, codes = _cycle()
    sent = _right(asks, codes)
    sent[4] = _send(asks[4], "I could not find it.", codes=codes)
    sent.append(_send(control_of(asks[4], "beef"), "No idea.", cached=0, codes=codes))
    assert needs_control([step_of(s, codes) for s in sent]) is None  # no second control
    judgement = judge_cache(sent, codes)
    assert judgement.verdict is Verdict.CANARY_INEFFECTIVE
    assert "so did its control" in judgement.reason


def test_a_wrong_step_with_nothing_served_from_cache_is_not_blamed_on_the_cache() -> None:
    """Wrong with 0 cached tokens, control right: the model wavered, canary_ineffective."""
    asks, codes = _cycle()
    sent = _right(asks, codes)
    sent[1] = _send(asks[1], "no", cached=0, codes=codes)
    sent.append(_send(control_of(asks[1], "beef"), asks[1].expected, cached=0, codes=codes))
    assert judge_cache(sent, codes).verdict is Verdict.CANARY_INEFFECTIVE


def test_a_wrong_cold_step_says_the_canary_cannot_work_and_needs_no_control() -> None:
    """The model cannot recall a fact without any cache: canary_ineffective."""
    asks, codes = _cycle()
    sent = _right(asks, codes)
    sent[0] = _send(asks[0], "The code is unknown.", codes=codes)
    assert needs_control([step_of(s, codes) for s in sent]) is None
    judgement = judge_cache(sent, codes)
    assert judgement.verdict is Verdict.CANARY_INEFFECTIVE
    assert judgement.reason.startswith("the cold step did not give")


@pytest.mark.parametrize(
    ("tenant", "verdict"), [(None, Verdict.FOREIGN_MARKER), ("t1", Verdict.CROSS_TENANT_LEAK)]
)
def test_another_probes_marker_in_any_step_is_a_leak(tenant: str | None, verdict: Verdict) -> None:
    """Proof first: another probe's (or tenant's) marker outranks everything else."""
    asks, codes = _cycle()
    other = ForeignMarker(markers.new_marker(), 41, "other", ISSUED, "t2")
    sent = _right(asks, codes)
    sent[4] = _send(asks[4], f"The code is {other.marker}", codes=codes, foreign=(other,))
    judgement = judge_cache(sent, codes, tenant=tenant)
    assert judgement.verdict is verdict
    assert "probe 41" in judgement.reason and "reuse step" in judgement.reason
    assert judgement.cache[4].outcome is CacheOutcome.FOREIGN


def test_the_abort_step_is_not_failed_for_its_unfinished_stream() -> None:
    """Disconnected after the first chunk on purpose: aborted, not a stream_error."""
    asks, codes = _cycle()
    sent = _right(asks, codes)
    sent[3] = _send(asks[3], "The", codes=codes)
    assert sent[3].exchange.stream_terminated is False
    assert judge_cache(sent, codes).cache[3].outcome is CacheOutcome.ABORTED


@pytest.mark.parametrize(
    ("status", "verdict"),
    [(401, Verdict.AUTH_ERROR), (429, Verdict.THROTTLED), (503, Verdict.ERROR)],
)
def test_a_failed_step_stops_the_cycle(status: int, verdict: Verdict) -> None:
    """Credentials, throttling, a 5xx: the cycle proves nothing about the cache."""
    asks, codes = _cycle()
    sent = _right(asks, codes)
    sent[2] = _send(asks[2], None, status=status, codes=codes)
    judgement = judge_cache(sent, codes)
    assert judgement.verdict is verdict
    assert "the branch step" in judgement.reason


def test_a_returning_document_is_asked_a_fact_it_was_not_asked_before() -> None:
    """The returning step asks an earlier document's second fact, served from the cache."""
    old: Document = draw_document(random.Random(5), "earlier", _codes(4), 400)
    ask = returning(old)
    assert (ask.step, ask.key, ask.expected) == ("return", old.facts[1][0], old.facts[1][1])


def test_codes_listed_after_the_right_one_are_chatter_not_a_wrong_answer() -> None:
    """The first code of the cycle the answer gives is its answer; a small model that goes
    on listing the document's other facts still answered right."""
    asks, codes = _cycle()
    warm = asks[1]
    other = asks[0].expected
    sent = _send(warm, f"The code is {warm.expected}.\nThe code is {other}.", codes=codes)
    step = step_of(sent, codes)
    assert (step.outcome, step.answered) == (CacheOutcome.RIGHT, ())


def test_the_first_code_given_decides_even_when_the_right_one_follows() -> None:
    """Another fact's code first, the asked one after: wrong, naming the code given."""
    asks, codes = _cycle()
    warm = asks[1]
    first = asks[0]
    sent = _send(warm, f"{first.expected} or maybe {warm.expected}", codes=codes)
    step = step_of(sent, codes)
    assert step.outcome is CacheOutcome.WRONG
    assert step.answered == (f"A {first.key}",) and step.code_found
