"""The burst canary's pure parts: tasks, reading the answer, and the cycle's verdict."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from kvwatch.canary import markers
from kvwatch.canary.burst import (
    MAX_CONTROLS,
    MAX_SIZE,
    WORDS,
    BurstTask,
    Sent,
    control_of,
    draw_tasks,
    filler_pieces,
    judge_burst,
    needs_controls,
    read_word,
    size_for,
)
from kvwatch.canary.model import (
    BurstOutcome,
    Exchange,
    ForeignMarker,
    TransportError,
    Verdict,
)
from kvwatch.canary.scan import scan_answer

ISSUED = datetime(2026, 1, 1, tzinfo=UTC)


def _tasks(size: int = 3, seed: int = 7) -> tuple[BurstTask, ...]:
    issued = [markers.new_marker() for _ in range(size + 1)]
    return draw_tasks(random.Random(seed), issued, size)


def _ok(task: BurstTask) -> str:
    return f"{task.marker} {task.word}"


def _other_word(task: BurstTask, tasks: tuple[BurstTask, ...]) -> str:
    return next(w for w in WORDS if w not in {t.word for t in tasks})


def _sent(
    tasks: tuple[BurstTask, ...],
    answers: list[str | None],
    *,
    status: int = 200,
    foreign: dict[int, ForeignMarker] | None = None,
) -> list[Sent]:
    own = [t.marker for t in tasks]
    out = []
    for task, answer in zip(tasks, answers, strict=True):
        ex = Exchange(status=status, answer=answer, body_parsed=answer is not None)
        found = [foreign[task.index]] if foreign and task.index in foreign else []
        out.append(Sent(task, ex, scan_answer(answer, own, found)))
    return out


def _foreign(tenant: str | None = None) -> ForeignMarker:
    return ForeignMarker(markers.new_marker(), 41, "other", ISSUED, tenant)


def test_every_request_right_passes():
    """Each request with its own marker and its task's answer: pass."""
    tasks = _tasks()
    judgement = judge_burst(_sent(tasks, [_ok(t) for t in tasks]))
    assert judgement.verdict is Verdict.PASS
    assert [r.outcome for r in judgement.burst] == [BurstOutcome.RIGHT] * 4
    assert judgement.marker_found


def test_an_answer_holding_another_members_marker_is_a_burst_leak():
    """Request 2 answered with request 3's marker and answer: burst_leak, naming both."""
    tasks = _tasks()
    answers = [_ok(t) for t in tasks]
    answers[2] = _ok(tasks[3])
    judgement = judge_burst(_sent(tasks, answers))
    assert judgement.verdict is Verdict.BURST_LEAK
    assert judgement.burst[2].siblings == (3,)
    assert "request 2 of a burst of 3 was answered with the marker of request 3" in (
        judgement.reason
    )


def test_a_leak_of_the_solo_requests_marker_into_the_burst_is_a_burst_leak():
    """The solo request's pages reaching a member is a leak within the cycle too."""
    tasks = _tasks()
    answers = [_ok(t) for t in tasks]
    answers[1] = f"{tasks[1].marker} {tasks[0].marker} {tasks[1].word}"
    assert judge_burst(_sent(tasks, answers)).verdict is Verdict.BURST_LEAK


def _with_controls(
    tasks: tuple[BurstTask, ...], answers: list[str | None], alone: dict[int, str | None]
) -> list[Sent]:
    """The cycle's requests, then each member of ``alone`` sent again alone with that answer."""
    sent = _sent(tasks, answers)
    own = [t.marker for t in tasks]
    for index, answer in alone.items():
        ex = Exchange(status=200, answer=answer, body_parsed=answer is not None)
        sent.append(Sent(control_of(tasks[index]), ex, scan_answer(answer, own)))
    return sent


def test_a_member_wrong_in_the_burst_and_right_alone_is_burst_wrong():
    """Marker kept, word another request's, on one member; right when sent again alone:
    burst_wrong, with what it said."""
    tasks = _tasks()
    answers = [_ok(t) for t in tasks]
    answers[3] = f"{tasks[3].marker} {tasks[1].word}"
    judgement = judge_burst(_with_controls(tasks, answers, {3: _ok(tasks[3])}))
    assert judgement.verdict is Verdict.BURST_WRONG
    assert [(r.index, r.outcome, r.control) for r in judgement.burst[3:]] == [
        (3, BurstOutcome.WRONG, False),
        (3, BurstOutcome.RIGHT, True),
    ]
    assert judgement.burst[4].size == 1
    assert judgement.reason == (
        f"1 of 3 concurrent requests answered wrong while the solo request was right: "
        f'request 3 answered "{tasks[1].word}" where its animal is "{tasks[3].word}", and '
        "answered right when sent again alone"
    )


def test_a_member_that_loses_its_marker_and_gets_it_back_alone_is_burst_wrong():
    """The right word without the marker is still a wrong answer."""
    tasks = _tasks()
    answers = [_ok(t) for t in tasks]
    answers[1] = f"The animal is the {tasks[1].word}."
    judgement = judge_burst(_with_controls(tasks, answers, {1: _ok(tasks[1])}))
    assert judgement.verdict is Verdict.BURST_WRONG
    assert "request 1 did not give back its marker, and answered right" in judgement.reason


def test_a_member_wrong_alone_too_is_the_models_failure_not_the_batchs():
    """Gemma 3 270M dropped a character of one marker, in the burst and alone alike: the
    model cannot do that prompt, so canary_ineffective, never burst_wrong."""
    tasks = _tasks()
    answers = [_ok(t) for t in tasks]
    # The code's first symbol dropped: dropping its last could be read back from the word
    # after it when the word starts with that letter (the match ignores spacing).
    marker = tasks[2].marker
    dropped = f"{marker[:4]}{marker[5:]} {tasks[2].word}"
    answers[2] = dropped
    judgement = judge_burst(_with_controls(tasks, answers, {2: dropped}))
    assert judgement.verdict is Verdict.CANARY_INEFFECTIVE
    assert judgement.reason == (
        "1 of 3 concurrent requests answered wrong while the solo request was right, but it "
        "sent again alone answered wrong too (request 2 did not give back its marker): the "
        "model cannot do the task on those prompts, whatever the batch"
    )


def test_one_member_right_alone_among_others_wrong_alone_is_burst_wrong():
    """A batch that breaks requests shows in any one the model answers right alone."""
    tasks = _tasks(size=5)
    answers = [_ok(tasks[0]), "no idea", "no idea", _ok(tasks[3]), _ok(tasks[4]), "no idea"]
    sent = _with_controls(tasks, answers, {1: "no idea", 2: _ok(tasks[2]), 5: "no idea"})
    judgement = judge_burst(sent)
    assert judgement.verdict is Verdict.BURST_WRONG
    assert judgement.reason.startswith("3 of 5 concurrent requests answered wrong")
    assert "request 2 did not give back its marker, and answered right" in judgement.reason


def test_more_wrong_members_than_controls_is_burst_wrong_without_them():
    """Four of five wrong at once is a batch fault as it stands: no controls are asked for
    (the engine may serve them from pages the batch broke)."""
    tasks = _tasks(size=5)
    answers = [_ok(tasks[0]), *["no idea"] * (MAX_CONTROLS + 1), _ok(tasks[5])]
    judgement = judge_burst(_sent(tasks, answers))
    assert needs_controls(judgement.burst) == ()
    assert judgement.verdict is Verdict.BURST_WRONG
    assert judgement.reason == (
        "4 of 5 concurrent requests answered wrong while the solo request was right: request "
        "1 did not give back its marker (more at once than a model that fails a prompt now "
        "and then)"
    )


def test_a_wrong_member_with_no_control_cannot_be_pinned_on_the_batch():
    """No control sent (the judge before the controls go out): not burst_wrong."""
    tasks = _tasks()
    answers = [_ok(t) for t in tasks]
    answers[1] = "no idea"
    judgement = judge_burst(_sent(tasks, answers))
    assert judgement.verdict is Verdict.CANARY_INEFFECTIVE
    assert "was not sent again alone" in judgement.reason


def test_a_control_holding_another_requests_marker_is_a_burst_leak():
    """Sent again alone and answered with member 2's marker: a leak, named as the control."""
    tasks = _tasks()
    answers = [_ok(t) for t in tasks]
    answers[1] = "no idea"
    judgement = judge_burst(_with_controls(tasks, answers, {1: _ok(tasks[2])}))
    assert judgement.verdict is Verdict.BURST_LEAK
    assert "request 1 sent again alone was answered with the marker of request 2" in (
        judgement.reason
    )


def test_a_failed_control_is_an_error_naming_it():
    """A control that got no answer leaves the cycle unjudged: error, never a pass."""
    tasks = _tasks()
    answers = [_ok(t) for t in tasks]
    answers[3] = "no idea"
    sent = _sent(tasks, answers)
    timeout = Exchange(transport_error=TransportError.TIMEOUT, error_detail="slow")
    sent.append(Sent(control_of(tasks[3]), timeout, scan_answer(None, [])))
    judgement = judge_burst(sent)
    assert judgement.verdict is Verdict.ERROR
    assert (
        judgement.reason == "request 3 sent again alone failed: transport failure (timeout): slow"
    )


def test_controls_are_asked_for_wrong_members_only_after_a_right_solo():
    """Each wrong member, up to MAX_CONTROLS; none when the solo failed or anything leaked."""
    tasks = _tasks(size=MAX_CONTROLS + 2)
    answers = [_ok(t) for t in tasks]
    for i in range(2, MAX_CONTROLS + 2):
        answers[i] = "no idea"
    assert needs_controls(judge_burst(_sent(tasks, answers)).burst) == tuple(
        range(2, MAX_CONTROLS + 2)
    )
    solo_wrong = ["no idea", *answers[1:]]
    assert needs_controls(judge_burst(_sent(tasks, solo_wrong)).burst) == ()
    leaked = [*answers[:-1], _ok(tasks[1])]
    assert needs_controls(judge_burst(_sent(tasks, leaked)).burst) == ()
    right = [_ok(t) for t in tasks]
    assert needs_controls(judge_burst(_sent(tasks, right)).burst) == ()


def test_a_control_is_its_member_sent_alone():
    """Same marker and word, size 1, marked as a control."""
    task = _tasks()[2]
    assert control_of(task) == BurstTask(2, 1, task.marker, task.word, control=True)


def test_a_wrong_solo_request_says_the_canary_is_ineffective():
    """The model cannot do the task alone: canary_ineffective, never a burst verdict."""
    tasks = _tasks()
    answers = [f"{t.marker} {_other_word(t, tasks)}" for t in tasks]
    assert judge_burst(_sent(tasks, answers)).verdict is Verdict.CANARY_INEFFECTIVE


def test_a_leak_wins_over_a_wrong_solo_request():
    """A leak is proof whatever the model's ability."""
    tasks = _tasks()
    answers = ["no idea", _ok(tasks[2]), _ok(tasks[2]), _ok(tasks[3])]
    assert judge_burst(_sent(tasks, answers)).verdict is Verdict.BURST_LEAK


def test_another_probes_marker_is_a_foreign_marker():
    """A marker issued to another probe: foreign_marker, as for every kind."""
    tasks = _tasks()
    leaked = _foreign()
    judgement = judge_burst(
        _sent(tasks, [_ok(t) for t in tasks], foreign={2: leaked}),
    )
    assert judgement.verdict is Verdict.FOREIGN_MARKER
    assert judgement.foreign == [leaked]
    assert judgement.burst[2].foreign == (41,)


def test_another_tenants_marker_is_a_cross_tenant_leak():
    """Sent as tenant a, answered with tenant b's marker: cross_tenant_leak."""
    tasks = _tasks()
    leaked = _foreign("b")
    judgement = judge_burst(_sent(tasks, [_ok(t) for t in tasks], foreign={1: leaked}), tenant="a")
    assert judgement.verdict is Verdict.CROSS_TENANT_LEAK
    assert judgement.crossed == (leaked,)


@pytest.mark.parametrize(
    ("status", "verdict"),
    [(429, Verdict.THROTTLED), (401, Verdict.AUTH_ERROR), (503, Verdict.ERROR)],
)
def test_a_failed_status_gives_the_usual_verdict(status, verdict):
    """Throttling, credentials and server errors say nothing about the batch."""
    tasks = _tasks()
    judgement = judge_burst(_sent(tasks, [None] * 4, status=status))
    assert judgement.verdict is verdict
    assert all(r.outcome is BurstOutcome.FAILED for r in judgement.burst)


def test_one_failed_member_is_an_error_naming_it():
    """A member whose connection dropped: error, with how many of the burst failed."""
    tasks = _tasks()
    sent = _sent(tasks, [_ok(t) for t in tasks])
    sent[2] = Sent(
        tasks[2],
        Exchange(transport_error=TransportError.READ, error_detail="reset"),
        scan_answer(None, []),
    )
    judgement = judge_burst(sent)
    assert judgement.verdict is Verdict.ERROR
    assert judgement.reason.startswith("1 of 3 concurrent requests failed: request 2")


def test_tasks_of_one_burst_all_have_different_answers():
    """A request given a neighbour's answer is always wrong: no two words are equal, up to
    the largest burst allowed."""
    tasks = _tasks(size=MAX_SIZE, seed=3)
    assert len({t.word for t in tasks}) == MAX_SIZE + 1
    assert [t.size for t in tasks] == [1] + [MAX_SIZE] * MAX_SIZE


def test_the_word_is_read_outside_the_marker_and_the_last_one_counts():
    """Letters inside a marker are never a word; of the task's words, the last one given."""
    assert read_word("KVW-OWLS-5678-9ABC") is None
    assert read_word("kvw owl5 5678 9abc, the Koala.") == "koala"
    assert read_word("Remember this animal: tiger. No, the lion") == "lion"
    assert read_word("a cat") is None
    assert read_word(None) is None


def test_the_prompt_plants_the_marker_and_the_word_at_the_start_and_asks_for_both():
    """The marker and the word open the prompt; the question closes it."""
    (task,) = _tasks(size=3)[:1]
    (message,) = task.messages([" The", " red", " door", "."])
    assert message.content.startswith(
        f"Remember this code: {task.marker}. Remember this animal: {task.word}."
    )
    assert message.content.endswith("Answer with the code, then the animal.")
    assert "The red door." in message.content


def test_sizes_are_taken_in_turn():
    """Cycle n takes size n mod len."""
    assert [size_for((3, 7, 9), n) for n in range(5)] == [3, 7, 9, 3, 7]


def test_filler_is_the_requested_number_of_words_and_differs_per_request():
    """Each request's filler is its own: no shared prefix to cache."""
    rng = random.Random(1)
    first, second = filler_pieces(rng, 200), filler_pieces(rng, 200)
    assert len(first) == len(second) == 200
    assert first != second
