"""A trace of verify steps: one JSON object per line, recorded by an engine and replayed by ``spectune simulate``.

Line format::

    {"batch_size": 4, "accepted_drafts": [3, 0, 2, 3], "num_steps": 3, "t": 12.031}

- ``batch_size``: requests in the verified batch (int >= 1), equal to ``len(accepted_drafts)``.
- ``accepted_drafts``: accepted draft tokens per request, each in 0..num_steps (the bonus token is NOT counted:
  acceptance length = accepted drafts + 1).
- ``num_steps``: draft steps the round ran with (int >= 0; at 0 every entry is 0).
- ``t`` (optional): seconds since the trace started.

Blank lines are skipped. Unknown keys are rejected so that a misspelt field is not silently dropped.
"""

from __future__ import annotations

import json
import math
import operator
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

from spectune.core.errors import UserError

_KEYS = {"batch_size", "accepted_drafts", "num_steps", "t"}


@dataclass(frozen=True)
class TraceStep:
    """One verify step.

    Attributes:
        batch_size: requests in the batch.
        accepted_drafts: accepted draft tokens per request (bonus token excluded), ``len == batch_size``.
        num_steps: draft steps (num_steps) the round ran with.
        t: s since the start of the trace, or None.
    """

    batch_size: int
    accepted_drafts: tuple[int, ...]
    num_steps: int
    t: float | None = None

    def to_json(self) -> dict:
        """The JSONL object for this step (``t`` omitted when None)."""
        out: dict = {"batch_size": self.batch_size, "accepted_drafts": list(self.accepted_drafts),
                     "num_steps": self.num_steps}
        if self.t is not None:
            out["t"] = round(self.t, 6)
        return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_trace_step(obj: object) -> TraceStep:
    """Validate one decoded trace line. Raises ValueError naming the field and the fix."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(_KEYS))}")
    missing = sorted({"batch_size", "accepted_drafts", "num_steps"} - set(obj))
    if missing:
        raise ValueError(f"missing key(s) {', '.join(map(repr, missing))}")
    bs, acc, k, t = obj["batch_size"], obj["accepted_drafts"], obj["num_steps"], obj.get("t")
    if not _is_int(bs) or bs < 1:
        raise ValueError(f"'batch_size' must be an integer >= 1, got {bs!r}")
    if not _is_int(k) or k < 0:
        raise ValueError(f"'num_steps' must be an integer >= 0, got {k!r}")
    if not isinstance(acc, list) or len(acc) != bs:
        raise ValueError(f"'accepted_drafts' must be a list of batch_size={bs} integers, got {acc!r}")
    if not all(_is_int(a) and 0 <= a <= k for a in acc):
        raise ValueError(f"'accepted_drafts' entries must be integers in 0..num_steps={k}, got {acc!r}")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)):
        raise ValueError(f"'t' must be a number of seconds, got {t!r}")
    return TraceStep(bs, tuple(acc), k, None if t is None else float(t))


def read_trace(path: str | Path) -> list[TraceStep]:
    """Read a JSONL trace file.

    Raises:
        UserError: unreadable file, an empty trace, or a bad line (message: ``FILE:LINE: problem``).
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise UserError(f"cannot read trace {p}: {err.strerror or err}; check the path") from None
    steps = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            steps.append(parse_trace_step(json.loads(line)))
        except json.JSONDecodeError as err:
            raise UserError(f"{p}:{n}: not valid JSON ({err.msg}); each line must be one JSON object") from None
        except ValueError as err:
            raise UserError(f"{p}:{n}: {err}") from None
    if not steps:
        raise UserError(f"{p}: the trace has no verify steps; record one with the engine's trace option")
    return steps


class TraceWriter:
    """Append verify steps to a JSONL trace (an engine calls :meth:`record` after every verify).

    Lines are buffered and flushed by :meth:`flush`/:meth:`close` (and every ``flush_every`` lines), so recording
    costs one ``json.dumps`` per step. Use as a context manager.

    Args:
        path: file to write (truncated unless ``append``).
        stamp_time: write ``t`` = s since the writer opened (``time.monotonic``) when :meth:`record` gets none.
        append: append to an existing file instead of truncating it.
        flush_every: lines between flushes.
    """

    def __init__(self, path: str | Path, *, stamp_time: bool = True, append: bool = False,
                 flush_every: int = 256) -> None:
        self.path = Path(path)
        self._fh: IO[str] = self.path.open("a" if append else "w")
        self._t0 = time.monotonic()
        self._stamp = stamp_time
        self._flush_every = max(1, flush_every)
        self._pending = 0
        self.num_steps_written = 0

    def record(self, batch_size: int, accepted_drafts: Sequence[int], num_steps: int, t: float | None = None) -> None:
        """Write one verify step. Raises ValueError when the step breaks the format (see module docstring)."""
        if t is None and self._stamp:
            t = time.monotonic() - self._t0
        try:  # operator.index takes numpy/torch integers but refuses floats
            obj = {"batch_size": operator.index(batch_size), "num_steps": operator.index(num_steps),
                   "accepted_drafts": [operator.index(a) for a in accepted_drafts]}
        except TypeError as err:
            raise ValueError(f"trace fields must be integers: {err}") from None
        step = parse_trace_step({**obj, **({} if t is None else {"t": t})})
        self._fh.write(json.dumps(step.to_json(), separators=(",", ":")) + "\n")
        self.num_steps_written += 1
        self._pending += 1
        if self._pending >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        """Push buffered lines to the file."""
        self._fh.flush()
        self._pending = 0

    def close(self) -> None:
        """Flush and close (idempotent)."""
        if not self._fh.closed:
            self._fh.flush()
            self._fh.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_trace(path: str | Path, steps: Sequence[TraceStep]) -> None:
    """Write a whole trace at once (tests, converters)."""
    with TraceWriter(path, stamp_time=False) as w:
        for s in steps:
            w.record(s.batch_size, s.accepted_drafts, s.num_steps, s.t)
