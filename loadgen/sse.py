"""Incremental Server-Sent Events parser for streamed OpenAI-compatible responses.

Follows the WHATWG HTML "server-sent events" parsing rules (section 9.2.6): lines end with ``\\r\\n``, ``\\n`` or
``\\r``; a line starting with ``:`` is a comment; ``field: value`` lines set fields (one leading space of the value
is dropped); several ``data:`` lines of one event are joined with ``\\n``; a blank line dispatches the event, and
an event without data is not dispatched. ``id:`` and ``retry:`` are ignored (a request never reconnects).

The parser works on bytes, so a read that ends inside a UTF-8 multibyte character or between ``\\r`` and ``\\n``
is harmless: line terminators are ASCII bytes that never occur inside a multibyte character, and event data is
handed out as bytes for :func:`json.loads` to decode whole.

Speed matters (the client must parse tens of thousands of events per second on one core): the common event, one
``data: ...`` line, is recognised with one :meth:`bytes.split` per read and one ``startswith`` per event.
"""

from __future__ import annotations

__all__ = ["SSEParser", "Event"]

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

    __slots__ = ("_buf", "_cr")

    def __init__(self) -> None:
        self._buf = b""  # bytes after the last complete event (an event in progress)
        self._cr = False  # the previous read ended with a bare b"\r" whose meaning depends on the next byte

    def feed(self, data: bytes) -> list[Event]:
        """Add one read's bytes; return the events completed by them, in order (possibly none)."""
        if self._cr:
            self._cr = False
            if not data.startswith(b"\n"):
                data = b"\n" + data  # the held \r was a line end of its own
        if b"\r" in data:
            if data.endswith(b"\r"):
                self._cr = True  # may be the first half of \r\n: decide on the next read
                data = data[:-1]
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._buf:
            data = self._buf + data
        blocks = data.split(b"\n\n")
        self._buf = blocks.pop()
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
        buf = self._buf + (b"\n" if self._cr else b"")
        self._buf, self._cr = b"", False
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
