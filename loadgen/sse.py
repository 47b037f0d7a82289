"""Incremental Server-Sent Events parser for streamed OpenAI-compatible responses.

Follows the WHATWG HTML "server-sent events" parsing rules (section 9.2.6): lines end with ``\\r\\n``, ``\\n`` or
``\\r``; a line starting with ``:`` is a comment; ``field: value`` lines set fields (one leading space of the value
is dropped); several ``data:`` lines of one event are joined with ``\\n``; a blank line dispatches the event, and
an event without data is not dispatched. ``id:`` and ``retry:`` are ignored (a request never reconnects).

The parser works on bytes, so a read that ends inside a UTF-8 multibyte character or between ``\\r`` and ``\\n``
is harmless: line terminators are ASCII bytes that never occur inside a multibyte character, and event data is
handed out as bytes for :func:`json.loads` to decode whole.

Speed matters (the client must parse tens of thousands of events per second on one core): the common event, one
``data: ...`` line, is recognised with one :meth:`bytes.split` per read and one ``startswith`` per event. The cost
stays linear in the bytes read when an event is long or never ends: an unfinished event is kept in a bytearray
(amortised appends) and the buffer is only split again once a read brings a blank line, so an 8 MB event that
arrives in small reads is not rescanned on every read. An event may hold at most ``max_event_bytes``
(:data:`MAX_EVENT_BYTES`); beyond that :meth:`SSEParser.feed` raises ValueError (no OpenAI stream sends such
events, and the buffer would otherwise grow without limit).
"""

from __future__ import annotations

__all__ = ["SSEParser", "Event", "MAX_EVENT_BYTES"]

MAX_EVENT_BYTES = 64 * 2**20
"""Largest event (bytes, before its blank line) a parser accepts by default."""

Event = tuple[str | None, bytes]
"""One dispatched event: (event type, or None for the default ``message`` type; data bytes)."""


class SSEParser:
    """Turns the bytes of an ``text/event-stream`` body into events, read by read.

    Usage::

        parser = SSEParser()
        for chunk in reads:
            for event_type, data in parser.feed(chunk):
                ...
        for event_type, data in parser.finish():   # at end of stream
            ...
    """

    __slots__ = ("_buf", "_cr", "max_event_bytes")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buf = bytearray()  # bytes after the last complete event (an event in progress)
        self._cr = False  # the previous read ended with a bare b"\r" whose meaning depends on the next byte
        self.max_event_bytes = max_event_bytes

    def feed(self, data: bytes) -> list[Event]:
        """Add one read's bytes; return the events completed by them, in order (possibly none).

        Raises:
            ValueError: the event in progress grew beyond ``max_event_bytes``.
        """
        if self._cr:
            self._cr = False
            if not data.startswith(b"\n"):
                data = b"\n" + data  # the held \r was a line end of its own
        if b"\r" in data:
            if data.endswith(b"\r"):
                self._cr = True  # may be the first half of \r\n: decide on the next read
                data = data[:-1]
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf
        if buf:
            if b"\n\n" not in data and not (data[:1] == b"\n" and buf[-1:] == b"\n"):
                buf += data  # still inside the same event: append, do not rescan
                if len(buf) > self.max_event_bytes:
                    raise ValueError(f"an event of more than {self.max_event_bytes} bytes without a blank line")
                return []
            data = bytes(buf) + data
        blocks = data.split(b"\n\n")
        last = blocks.pop()
        if len(last) > self.max_event_bytes:
            raise ValueError(f"an event of more than {self.max_event_bytes} bytes without a blank line")
        self._buf = bytearray(last)
        events: list[Event] = []
        for block in blocks:
            # Fast path: a single "data: ..." line (what vLLM, SGLang and OpenAI send for every chunk).
            if block.startswith(b"data: ") and b"\n" not in block:
                events.append((None, block[6:]))
            elif block:
                self._parse_block(block, events)
        return events

    def finish(self) -> list[Event]:
        """End of stream: return the last event if its lines are complete but the closing blank line is missing.

        A trailing partial line (no line end) is dropped, as the SSE rules drop an unterminated event; callers
        then see that ``[DONE]`` never came.
        """
        buf = bytes(self._buf) + (b"\n" if self._cr else b"")
        self._buf, self._cr = bytearray(), False
        end = buf.rfind(b"\n")
        if end < 0:
            return []
        events: list[Event] = []
        self._parse_block(buf[:end], events)
        return events

    @staticmethod
    def _parse_block(block: bytes, events: list[Event]) -> None:
        """Parse the lines of one event (no blank line inside) and append it to ``events`` if it has data."""
        data_lines: list[bytes] = []
        event_type: str | None = None
        for line in block.split(b"\n"):
            if not line or line.startswith(b":"):
                continue  # blank (leading newline) or comment
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                data_lines.append(value)
            elif name == b"event":
                event_type = value.decode("utf-8", "replace") or None
        if data_lines:
            events.append((None if event_type == "message" else event_type, b"\n".join(data_lines)))
