"""The incremental SSE parser: framing rules, termination, and arbitrary chunking."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.engines.sse import SSEDecodeError, SSEEvent, SSEParser, parse_all

STREAM = (
    b": keep-alive\n\n"
    b'data: {"a": 1}\n\n'
    b"event: update\r\ndata: line one\r\ndata: line two\r\n\r\n"
    b"id: 7\rdata: cr only\r\r"
    b"data:no-space\n\n"
    b"data: caf\xc3\xa9 \xe2\x9c\x93\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SSEEvent(data='{"a": 1}'),
    SSEEvent(data="line one\nline two", event="update"),
    SSEEvent(data="cr only", id="7"),
    SSEEvent(data="no-space", id="7"),
    SSEEvent(data="café ✓", id="7"),
]


def test_it_parses_a_whole_stream_into_events() -> None:
    """Comments are skipped, data lines joined, CRLF/LF/CR all end lines, [DONE] ends it."""
    events, parser = parse_all([STREAM])
    assert events == EXPECTED
    assert parser.done
    assert not parser.cut_mid_event


def test_it_reports_a_stream_cut_inside_an_event() -> None:
    """A stream that stops mid-event is not terminated and says it was cut."""
    events, parser = parse_all([b'data: {"a": 1}\n\ndata: {"choi'])
    assert events == [SSEEvent(data='{"a": 1}')]
    assert not parser.done
    assert parser.cut_mid_event


def test_it_reports_a_stream_that_stops_between_events_as_unterminated() -> None:
    """Without [DONE] a stream is not clean even if it stopped at an event boundary."""
    events, parser = parse_all([b'data: {"a": 1}\n\n'])
    assert len(events) == 1
    assert not parser.done
    assert not parser.cut_mid_event


def test_it_accepts_a_final_done_line_without_its_blank_line() -> None:
    """An engine that closes right after "data: [DONE]" still ended its stream cleanly."""
    _, parser = parse_all([b'data: {"a": 1}\n\ndata: [DONE]\n'])
    assert parser.done
    assert not parser.cut_mid_event


def test_it_joins_a_crlf_split_across_two_chunks() -> None:
    """A CR ending one chunk and the LF starting the next make one line end, not two."""
    parser = SSEParser()
    assert parser.feed(b"data: x\r") == []
    # Were CR and LF two line ends, this LF would be a blank line and dispatch the event.
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\n") == [SSEEvent(data="x")]


def test_it_does_not_dispatch_an_event_without_data() -> None:
    """An event with only an event name carries nothing and is dropped, as the spec says."""
    events, _ = parse_all([b"event: ping\n\n"])
    assert events == []


def test_it_strips_a_leading_byte_order_mark() -> None:
    """A UTF-8 BOM before the first field does not become part of the field name."""
    events, _ = parse_all([b"\xef\xbb\xbfdata: x\n\n"])
    assert events == [SSEEvent(data="x")]


def test_it_refuses_an_event_larger_than_the_cap() -> None:
    """A runaway event raises the parser's one defined error instead of eating memory."""
    parser = SSEParser(max_event_chars=100)
    with pytest.raises(SSEDecodeError):
        parser.feed(b"data: " + b"x" * 200 + b"\n")


def test_it_refuses_an_unterminated_line_larger_than_the_cap() -> None:
    """A line that never ends is capped as well."""
    parser = SSEParser(max_event_chars=100)
    with pytest.raises(SSEDecodeError):
        parser.feed(b"data: " + b"x" * 200)


@st.composite
def chunkings(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=len(data) - 1), max_size=20)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=300)
@given(st.data())
def test_any_chunking_of_a_stream_yields_the_same_events(data: st.DataObject) -> None:
    """Splitting the bytes anywhere (inside CRLF, inside a UTF-8 character) changes nothing."""
    chunks = data.draw(chunkings(STREAM))
    events, parser = parse_all(chunks)
    assert events == EXPECTED
    assert parser.done


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=64), max_size=12))
def test_random_bytes_never_crash_the_parser(chunks: list[bytes]) -> None:
    """Arbitrary input yields events or the defined error, never anything else."""
    parser = SSEParser(max_event_chars=256)
    try:
        for chunk in chunks:
            for event in parser.feed(chunk):
                assert isinstance(event.data, str)
        parser.close()
    except SSEDecodeError:
        pass


@settings(max_examples=200)
@given(
    st.lists(
        st.text(
            alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"),
            max_size=30,
        ),
        min_size=1,
        max_size=8,
    ),
    st.data(),
)
def test_data_written_as_sse_reads_back_unchanged(payloads: list[str], data: st.DataObject) -> None:
    """Any single-line payloads framed as events come back verbatim, in order."""
    raw = "".join(f"data: {p}\n\n" for p in payloads).encode() + b"data: [DONE]\n\n"
    events, parser = parse_all(data.draw(chunkings(raw)))
    # A payload equal to the terminator is swallowed as one; the rest come through.
    expected = [p for p in payloads if p != "[DONE]"]
    assert [e.data for e in events] == expected
    assert parser.done


AFTER_DONE = b'data: {"a": 1}\n\ndata: [DONE]\n\ndata: {"b": 2}\n\ndata: {"c": 3}\n\n'


def test_events_after_done_in_the_same_read_are_not_part_of_the_stream() -> None:
    """Events that follow [DONE] in the chunk that carried it are counted, never returned."""
    parser = SSEParser()
    events = parser.feed(AFTER_DONE)
    events += parser.close()
    assert [e.data for e in events] == ['{"a": 1}']
    assert parser.done
    assert parser.after_done == 2
    assert not parser.cut_mid_event


@pytest.mark.parametrize("cut", range(1, len(AFTER_DONE)))
def test_events_after_done_split_across_reads_are_not_part_of_the_stream(cut: int) -> None:
    """Wherever the bytes are split, the events after [DONE] are counted, never returned."""
    events, parser = parse_all([AFTER_DONE[:cut], AFTER_DONE[cut:]])
    assert [e.data for e in events] == ['{"a": 1}']
    assert parser.done
    assert parser.after_done == 2


def test_a_cut_or_oversized_event_after_done_neither_fails_nor_cuts_the_stream() -> None:
    """After the terminator nothing is parsed for content: no size error, no cut stream."""
    parser = SSEParser(max_event_chars=64)
    events = parser.feed(b"data: [DONE]\n\ndata: " + b"x" * 1000 + b"\n\ndata: {half")
    events += parser.close()
    assert events == []
    assert parser.done
    assert not parser.cut_mid_event
    assert parser.after_done == 2
