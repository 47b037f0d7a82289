"""A trace of verify steps: one JSON object per line, recorded by an engine and replayed by ``spectune simulate``.

Line format (the first three keys are required; every other key is optional and may be absent from a line)::

    {"batch_size": 2, "accepted_drafts": [3, 0], "num_steps": 3, "t": 12.031,
     "drafted": [3, 2], "draft_probs": [[0.98, 0.91, 0.7], [0.6, 0.2, 0.05]],
     "accept_probs": [[0.97, 0.9, 0.8], [0.5, 0.3, 0.1]], "context_tokens": [812, 97],
     "draft_ms": 1.92, "verify_ms": 6.41, "request_ids": ["chatcmpl-5f0c", "chatcmpl-77ab"]}

- ``batch_size``: requests (rows) in the verified batch (int >= 1), equal to ``len(accepted_drafts)``.
- ``accepted_drafts``: accepted draft tokens per row, each in 0..drafted (the bonus token is NOT counted:
  acceptance length = accepted drafts + 1).
- ``num_steps``: the round's configured maximum draft length (int >= 0; at 0 every entry is 0).
- ``t``: seconds since the trace started.
- ``drafted``: per row, the draft tokens the row submitted for verification, each in 0..num_steps and >=
  ``accepted_drafts[i]``; absent means num_steps for every row (every row of today's engines drafts the same K).
- ``draft_probs``: per row, per drafted position, the draft token's confidence in [0, 1]: the probability
  llama.cpp's EAGLE-3 drafter compares with ``--spec-draft-p-min`` (top-10 softmax; the bundled engine's
  ``DraftHead.draft_with_prob``, ``backends/local/model/eagle.py``). A row holds between ``drafted[i]`` and
  num_steps entries: a round recorded at the configured maximum holds num_steps for every row even when a policy
  verified fewer.
- ``accept_probs``: the same shape as ``draft_probs`` (each row between ``drafted[i]`` and num_steps entries, and
  as many as ``draft_probs`` has when both are present): an acceptance-prediction head's p_hat per position
  (SpecDec++, Huang et al.), present only when the engine loaded such a head.
- ``context_tokens``: per row, the tokens in the row's KV cache before the round (int >= 0).
- ``draft_ms``: time drafting d_1..d_K (head forwards and token picks), ms >= 0.
- ``verify_ms``: the rest of the round (target verify forward, acceptance, draft extend), ms >= 0; ``draft_ms +
  verify_ms`` is the round time.
- ``request_ids``: per row, the id the server gave the request's response (the OpenAI ``id`` of its chunks, which
  the load generator keeps as ``server_request_id`` in requests.jsonl), so that a replay can keep the rounds of the
  requests a measured window served (``benchmarks/simulate_vs_sweep.py``).

A line with only the first keys (today's format) is still valid and replays as before. Blank lines are skipped.
Unknown keys are rejected so that a misspelt field is not silently dropped. The writer rounds probabilities to 4
decimals and times to 4 decimals of a ms (0.1 us) to keep lines short.
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

_REQUIRED = ("batch_size", "accepted_drafts", "num_steps")
_OPTIONAL = ("t", "drafted", "draft_probs", "accept_probs", "context_tokens", "draft_ms", "verify_ms", "request_ids")
_KEYS = {*_REQUIRED, *_OPTIONAL}
PROB_DECIMALS = 4
"""Decimals :class:`TraceWriter` keeps of ``draft_probs`` / ``accept_probs``."""
MS_DECIMALS = 4
"""Decimals :class:`TraceWriter` keeps of ``draft_ms`` / ``verify_ms``."""

Probs = tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class TraceStep:
    """One verify step (one round of the batch).

    Attributes:
        batch_size: requests (rows) in the batch.
        accepted_drafts: accepted draft tokens per row (bonus token excluded), ``len == batch_size``.
        num_steps: the round's configured maximum draft length.
        t: s since the start of the trace, or None.
        drafted: draft tokens each row submitted for verification, or None (= num_steps for every row).
        draft_probs: per row, per drafted position, the draft token's confidence in [0, 1], or None.
        accept_probs: per row, per position, an acceptance head's predicted acceptance probability, or None.
        context_tokens: per row, tokens in its KV cache before the round, or None.
        draft_ms: drafting time of the round (ms), or None.
        verify_ms: the rest of the round (ms), or None.
        request_ids: per row, the server's id of the request (its response ``id``), or None.
    """

    batch_size: int
    accepted_drafts: tuple[int, ...]
    num_steps: int
    t: float | None = None
    drafted: tuple[int, ...] | None = None
    draft_probs: Probs | None = None
    accept_probs: Probs | None = None
    context_tokens: tuple[int, ...] | None = None
    draft_ms: float | None = None
    verify_ms: float | None = None
    request_ids: tuple[str, ...] | None = None

    @property
    def drafted_per_row(self) -> tuple[int, ...]:
        """``drafted``, or num_steps for every row when the line has none."""
        return self.drafted if self.drafted is not None else (self.num_steps,) * self.batch_size

    @property
    def round_ms(self) -> float | None:
        """``draft_ms + verify_ms`` (ms), or None when either is missing."""
        if self.draft_ms is None or self.verify_ms is None:
            return None
        return self.draft_ms + self.verify_ms

    def to_json(self) -> dict:
        """The JSONL object for this step (None fields omitted; ``t`` rounded to 1 us)."""
        out: dict = {"batch_size": self.batch_size, "accepted_drafts": list(self.accepted_drafts),
                     "num_steps": self.num_steps}
        if self.t is not None:
            out["t"] = round(self.t, 6)
        if self.drafted is not None:
            out["drafted"] = list(self.drafted)
        for key in ("draft_probs", "accept_probs"):
            probs = getattr(self, key)
            if probs is not None:
                out[key] = [list(row) for row in probs]
        if self.context_tokens is not None:
            out["context_tokens"] = list(self.context_tokens)
        for key in ("draft_ms", "verify_ms"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.request_ids is not None:
            out["request_ids"] = list(self.request_ids)
        return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int_list(obj: dict, key: str, n: int, lo: int, hi: float, what: str) -> tuple[int, ...]:
    v = obj[key]
    if not isinstance(v, list) or len(v) != n:
        raise ValueError(f"'{key}' must be a list of batch_size={n} integers, got {v!r}")
    if not all(_is_int(x) and lo <= x <= hi for x in v):
        raise ValueError(f"'{key}' entries must be integers {what}, got {v!r}")
    return tuple(v)


def _probs(obj: dict, key: str, drafted: Sequence[int], k: int, other: Probs | None) -> Probs:
    v = obj[key]
    n = len(drafted)
    if not isinstance(v, list) or len(v) != n or not all(isinstance(row, list) for row in v):
        raise ValueError(f"'{key}' must be a list of batch_size={n} lists of probabilities, got {v!r}")
    for i, row in enumerate(v):
        if not drafted[i] <= len(row) <= k:
            raise ValueError(f"'{key}' row {i} holds {len(row)} entries: it must hold between drafted={drafted[i]} "
                             f"and num_steps={k}")
        if other is not None and len(row) != len(other[i]):
            raise ValueError(f"'{key}' row {i} holds {len(row)} entries but 'draft_probs' row {i} holds "
                             f"{len(other[i])}: record both for the same positions")
        # one pass per check instead of a Python test per entry: JSON numbers are float or int (bool excluded);
        # a NaN makes the sum NaN, an infinity fails the range
        if row and (not {type(p) for p in row} <= {float, int} or math.isnan(sum(row)) or min(row) < 0.0
                    or max(row) > 1.0):
            raise ValueError(f"'{key}' row {i} entries must be probabilities in [0, 1], got {row!r}")
    return tuple(tuple(float(p) for p in row) for row in v)


def _ms(obj: dict, key: str) -> float | None:
    v = obj.get(key)
    if v is None:
        return None
    if not _is_num(v) or v < 0:
        raise ValueError(f"'{key}' must be a number of ms >= 0, got {v!r}")
    return float(v)


def parse_trace_step(obj: object) -> TraceStep:
    """Validate one decoded trace line (format: the module docstring).

    Raises:
        ValueError: a one-line message naming the field and what it must hold.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(_KEYS))}")
    missing = sorted(set(_REQUIRED) - set(obj))
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
    if t is not None and not _is_num(t):
        raise ValueError(f"'t' must be a number of seconds, got {t!r}")
    drafted = None
    if obj.get("drafted") is not None:
        drafted = _int_list(obj, "drafted", bs, 0, k, f"in 0..num_steps={k}")
        over = [i for i in range(bs) if acc[i] > drafted[i]]
        if over:
            raise ValueError(f"row {over[0]} accepted {acc[over[0]]} drafts but 'drafted' says it drafted "
                             f"{drafted[over[0]]}: accepted_drafts[i] must be <= drafted[i]")
    lengths = drafted if drafted is not None else (k,) * bs
    draft_probs = _probs(obj, "draft_probs", lengths, k, None) if obj.get("draft_probs") is not None else None
    accept_probs = (_probs(obj, "accept_probs", lengths, k, draft_probs) if obj.get("accept_probs") is not None
                    else None)
    context = (_int_list(obj, "context_tokens", bs, 0, math.inf, ">= 0")
               if obj.get("context_tokens") is not None else None)
    ids = obj.get("request_ids")
    if ids is not None and (not isinstance(ids, list) or len(ids) != bs or not all(isinstance(i, str) for i in ids)):
        raise ValueError(f"'request_ids' must be a list of batch_size={bs} strings, got {ids!r}")
    return TraceStep(bs, tuple(acc), k, None if t is None else float(t), drafted, draft_probs, accept_probs,
                     context, _ms(obj, "draft_ms"), _ms(obj, "verify_ms"), None if ids is None else tuple(ids))


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


def _round_probs(rows: Sequence[Sequence[float]] | None) -> list[list[float]] | None:
    if rows is None:
        return None
    try:
        return [[round(float(p), PROB_DECIMALS) for p in row] for row in rows]
    except (TypeError, ValueError) as err:
        raise ValueError(f"trace probabilities must be numbers: {err}") from None


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

    def record(self, batch_size: int, accepted_drafts: Sequence[int], num_steps: int, t: float | None = None, *,
               drafted: Sequence[int] | None = None, draft_probs: Sequence[Sequence[float]] | None = None,
               accept_probs: Sequence[Sequence[float]] | None = None, context_tokens: Sequence[int] | None = None,
               draft_ms: float | None = None, verify_ms: float | None = None,
               request_ids: Sequence[str] | None = None) -> None:
        """Write one verify step; the keyword fields are omitted from the line when None (format: the module
        docstring). Integers may be numpy/torch integers; probabilities are rounded to :data:`PROB_DECIMALS` and
        times to :data:`MS_DECIMALS`.

        Raises:
            ValueError: the step breaks the format (a one-line message naming the field).
        """
        if t is None and self._stamp:
            t = time.monotonic() - self._t0
        try:  # operator.index takes numpy/torch integers but refuses floats
            obj: dict = {"batch_size": operator.index(batch_size), "num_steps": operator.index(num_steps),
                         "accepted_drafts": [operator.index(a) for a in accepted_drafts]}
            if drafted is not None:
                obj["drafted"] = [operator.index(d) for d in drafted]
            if context_tokens is not None:
                obj["context_tokens"] = [operator.index(c) for c in context_tokens]
        except TypeError as err:
            raise ValueError(f"trace fields must be integers: {err}") from None
        if t is not None:
            obj["t"] = t
        for key, rows in (("draft_probs", draft_probs), ("accept_probs", accept_probs)):
            if rows is not None:
                obj[key] = _round_probs(rows)
        for key, ms in (("draft_ms", draft_ms), ("verify_ms", verify_ms)):
            if ms is not None:
                obj[key] = round(float(ms), MS_DECIMALS)
        if request_ids is not None:
            obj["request_ids"] = [str(i) for i in request_ids]
        step = parse_trace_step(obj)
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
            w.record(s.batch_size, s.accepted_drafts, s.num_steps, s.t, drafted=s.drafted, draft_probs=s.draft_probs,
                     accept_probs=s.accept_probs, context_tokens=s.context_tokens, draft_ms=s.draft_ms,
                     verify_ms=s.verify_ms)
