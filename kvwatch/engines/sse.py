"""An incremental Server-Sent Events parser: bytes in, events out, no I/O.

It follows the WHATWG "event stream interpretation" rules closely enough for LLM engines:
lines end in CRLF, LF or CR (a CR at the end of one chunk and an LF at the start of the next
are one line end); a blank line dispatches the event; ``data`` lines are joined with ``\\n``;
lines starting with ``:`` are comments (keep-alives); an event with no data is not
dispatched. Bytes are decoded as UTF-8 with replacement, so arbitrary input never raises a
decode error; the only error is :class:`SSEDecodeError` for a line or event over the size cap.

OpenAI-compatible streams end with a ``data: [DONE]`` event. The parser swallows that event and
sets :attr:`SSEParser.done`; :attr:`SSEParser.cut_mid_event` tells, after :meth:`close`, whether
the stream stopped inside an event (a connection cut) rather than between events. APIs whose
last event carries content (Anthropic's ``message_stop``, TGI's final event) give ``is_last``
instead: that event is returned, and ends the stream.

Nothing after the end is part of the stream, whether it arrived in the read that carried the
terminator or later: how TCP packs the bytes must not change an answer. Such events are only
counted (:attr:`SSEParser.after_done`), without size limits or parsing, since a stream that
keeps talking after its end is evidence, never content.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable
from dataclasses import dataclass

from kvwatch.canary.model import Exchange

DONE = "[DONE]"

_LINE_END = re.compile(r"\r\n|\r|\n")


class SSEDecodeError(ValueError):
    """The stream cannot be parsed within the limits (an over-long line or event)."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str | None = None  # the ``event:`` field; None means the default "message"
    id: str | None = None


class SSEParser:
    """Feed chunks with :meth:`feed`; call :meth:`close` at end of stream."""

    def __init__(
        self,
        *,
        max_event_chars: int = 1 << 20,
        terminator: str | None = DONE,
        is_last: Callable[[SSEEvent], bool] | None = None,
    ) -> None:
        self._max = max_event_chars
        self._terminator = terminator
        self._is_last = is_last
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._line = ""  # the unterminated tail of the last chunk
        self._skip_lf = False  # the previous chunk ended in CR: a leading LF belongs to it
        self._at_start = True  # a BOM is allowed only before the first character
        self._data: list[str] = []
        self._data_chars = 0
        self._event: str | None = None
        self._id: str | None = None
        self._last_id: str | None = None
        self._pending_fields = False  # a field line arrived since the last dispatch
        self._pending_data = False  # after the end: a data line arrived since the last one
        self.done = False
        self.cut_mid_event = False
        self.closed = False
        self.after_done = 0  # events (whole or cut) the stream sent after its end

    def feed(self, chunk: bytes | str) -> list[SSEEvent]:
        text = self._decoder.decode(chunk) if isinstance(chunk, bytes) else chunk
        return self._consume(text)

    def close(self) -> list[SSEEvent]:
        """End of stream: flush the decoder and report whether an event was cut off.

        Per the spec an event not followed by a blank line is discarded. One leniency: a final
        complete ``data: [DONE]`` line counts as the terminator even without its blank line,
        since the engine clearly finished the stream.
        """
        if self.closed:
            return []
        events = self._consume(self._decoder.decode(b"", final=True))
        self.closed = True
        if self._line:
            # An unterminated last line: complete in content only if it is the terminator.
            line, self._line = self._line, ""
            self._field_line(line)
        if self.done:
            if self._pending_data:
                self.after_done += 1
        elif self._pending_fields:
            if self._terminator is not None and "\n".join(self._data) == self._terminator:
                self.done = True
            else:
                self.cut_mid_event = True
        self._reset_event()
        return events

    def _consume(self, text: str) -> list[SSEEvent]:
        if not text:
            return []
        if self._at_start:
            self._at_start = False
            if text.startswith("\ufeff"):
                text = text[1:]
        if self._skip_lf:
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]
        events: list[SSEEvent] = []
        buf = self._line + text
        start = 0
        for match in _LINE_END.finditer(buf):
            if match.group() == "\r" and match.end() == len(buf):
                # CR at the very end: an LF starting the next chunk belongs to this line end.
                self._skip_lf = True
            event = self._line_done(buf[start : match.start()])
            start = match.end()
            if event is not None:
                events.append(event)
        self._line = buf[start:]
        if len(self._line) > self._max:
            if not self.done:
                raise SSEDecodeError(f"SSE line longer than {self._max} characters")
            # Past the end only whether a line holds a data field matters: keep its start.
            self._line = self._line[:16]
        return events

    def _line_done(self, line: str) -> SSEEvent | None:
        if line == "":
            return self._dispatch()
        self._field_line(line)
        return None

    def _field_line(self, line: str) -> None:
        if line.startswith(":"):
            return  # a comment, typically a keep-alive
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if self.done:
            # Past the end: counted, not kept.
            self._pending_data |= name == "data"
            return
        if name == "data":
            self._data_chars += len(value) + 1
            if self._data_chars > self._max:
                raise SSEDecodeError(f"SSE event larger than {self._max} characters")
            self._data.append(value)
            self._pending_fields = True
        elif name == "event":
            self._event = value
            self._pending_fields = True
        elif name == "id":
            if "\0" not in value:
                self._id = value
            self._pending_fields = True
        # "retry" and unknown fields are ignored, as the spec says.

    def _dispatch(self) -> SSEEvent | None:
        if self.done:
            if self._pending_data:
                self.after_done += 1
            self._reset_event()
            return None
        if self._id is not None:
            self._last_id = self._id
        if not self._data:
            self._reset_event()
            return None
        data = "\n".join(self._data)
        event = SSEEvent(data=data, event=self._event or None, id=self._last_id)
        self._reset_event()
        if self._terminator is not None and data == self._terminator:
            self.done = True
            return None
        if self._is_last is not None and self._is_last(event):
            self.done = True
        return event

    def _reset_event(self) -> None:
        self._data = []
        self._data_chars = 0
        self._event = None
        self._id = None
        self._pending_fields = False
        self._pending_data = False


def parse_all(chunks: list[bytes] | list[str]) -> tuple[list[SSEEvent], SSEParser]:
    """Parse a complete stream given as chunks (a convenience for tests and tools)."""
    parser = SSEParser()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return events, parser


class EventStreamReader:
    """Shared part of the adapters' SSE readers (Anthropic, TGI): feed bytes, then settle the
    exchange at the end. Subclasses handle each event, recognise the event that ends a stream
    of their API (``_is_last``), and say whether that makes a completion and what was missing."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.parser = SSEParser(terminator=None, is_last=self._is_last)
        self._answer: list[str] = []
        self._chars = 0

    @property
    def _ended(self) -> bool:
        return self.parser.done

    def _is_last(self, event: SSEEvent) -> bool:
        raise NotImplementedError

    def _completed(self) -> bool:
        return self._ended

    def _missing_end(self) -> str:
        raise NotImplementedError

    def _event(self, data: str, name: str | None) -> None:
        raise NotImplementedError

    @property
    def done(self) -> bool:
        return self._ended or self.exchange.stream_error_frame

    def feed(self, data: bytes) -> None:
        for event in self.parser.feed(data):
            self._event(event.data, event.event)

    def finish(self) -> None:
        for event in self.parser.close():
            self._event(event.data, event.event)
        ex = self.exchange
        ex.stream_terminated = self._ended
        ex.events_after_terminator = self.parser.after_done
        ex.answer = "".join(self._answer)
        if ex.stream_error_frame:
            ex.body_parsed = False
        elif ex.error_detail is None:
            if not self._ended:
                ex.error_detail = self._missing_end()
            ex.body_parsed = self._completed()
