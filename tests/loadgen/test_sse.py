"""SSE parsing: event boundaries, split reads (inside UTF-8 characters and \\r\\n), comments, multi-line data."""

from __future__ import annotations

import time

import pytest

from spectune.loadgen.sse import SSEParser

STREAM = (
    ": keep-alive comment\r\n\r\n"
    'data: {"text": "héllo 日本"}\r\n\r\n'
    "event: error\r\ndata: first line\r\ndata: second line\r\n\r\n"
    "id: 7\nretry: 100\ndata:no-space\n\n"
    "data: [DONE]\n\n"
).encode()
EXPECTED = [
    (None, '{"text": "héllo 日本"}'.encode()),
    ("error", b"first line\nsecond line"),
    (None, b"no-space"),
    (None, b"[DONE]"),
]


def parse(pieces: list[bytes]) -> list:
    p = SSEParser()
    out = []
    for piece in pieces:
        out.extend(p.feed(piece))
    return out + p.finish()


def test_whole_stream() -> None:
    assert parse([STREAM]) == EXPECTED


def test_every_two_way_split() -> None:
    # Every split point, including inside "é"/"日本" (multibyte UTF-8) and between "\r" and "\n".
    for i in range(len(STREAM) + 1):
        assert parse([STREAM[:i], STREAM[i:]]) == EXPECTED, i


def test_byte_by_byte() -> None:
    assert parse([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_lone_cr_line_endings() -> None:
    assert parse([b"data: a\r\r", b"data: b\r", b"\r"]) == [(None, b"a"), (None, b"b")]


def test_comment_only_and_empty_data_events_are_not_dispatched() -> None:
    assert parse([b": ping\n\nevent: x\n\n: another\n\n"]) == []


def test_data_with_empty_value_is_dispatched() -> None:
    assert parse([b"data:\n\n"]) == [(None, b"")]


@pytest.mark.parametrize(
    "tail, expected",
    [
        (b"data: [DONE]\n", [(None, b"[DONE]")]),  # last blank line missing: complete lines still count
        (b"data: [DONE]\r", [(None, b"[DONE]")]),
        (b'data: {"cut', []),  # partial line at EOF is dropped
    ],
)
def test_end_of_stream(tail: bytes, expected: list) -> None:
    assert parse([b"data: 1\n\n", tail]) == [(None, b"1"), *expected]


def test_feed_returns_events_incrementally() -> None:
    p = SSEParser()
    assert p.feed(b"data: 1\n\ndata: 2") == [(None, b"1")]
    assert p.feed(b"\n") == []
    assert p.feed(b"\n") == [(None, b"2")]


def test_a_long_event_arriving_in_small_reads_is_whole() -> None:
    reads = [b"data: " + b"x" * 1000] + [b"y" * 1000] * 999
    p = SSEParser()
    assert all(p.feed(r) == [] for r in reads)
    assert p.feed(b"\n\ndata: next\n\n") == [(None, b"x" * 1000 + b"y" * 999_000), (None, b"next")]


def test_a_blank_line_split_across_reads_ends_the_event() -> None:
    p = SSEParser()
    assert p.feed(b"data: " + b"a" * 5000) == []
    assert p.feed(b"\n") == []
    assert p.feed(b"\ndata: b\n\n") == [(None, b"a" * 5000), (None, b"b")]


def test_an_event_beyond_the_limit_is_refused() -> None:
    p = SSEParser(max_event_bytes=10_000)
    p.feed(b"data: " + b"x" * 5000)
    with pytest.raises(ValueError, match="without a blank line"):
        p.feed(b"x" * 6000)


def _parse_seconds(reads: list[bytes]) -> float:
    p = SSEParser()
    t0 = time.process_time()
    for r in reads:
        p.feed(r)
    return time.process_time() - t0


def test_an_endless_event_costs_no_more_than_ordinary_events() -> None:
    """8 MB in 8 KB reads: as one event that never ends vs as 100-byte events. Both are linear in the bytes; a
    parser that rescans its buffer on every read spends seconds on the first (quadratic) and milliseconds on the
    second. Compared with each other on the same machine, not with a fixed time."""
    n, size = 1024, 8192
    endless = [b"data: "] + [b"x" * size] * n
    event = b"data: " + b"x" * 92 + b"\n\n"
    ordinary = [event * (size // len(event))] * n
    assert _parse_seconds(endless) < 2 * _parse_seconds(ordinary) + 0.05
