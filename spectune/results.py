"""The results folder of ``spectune sweep`` (docs/results-format.md): durable writes, plan checks and resume.

Writes follow one rule: nothing finished is ever lost. JSONL files are appended one flushed line at a time
(``points.jsonl`` is also fsynced per point); whole-file rewrites (``sweep.json``, ``summary.csv``, and the
``--resume`` clean-up of ``requests.jsonl``/``points.jsonl``) go through :func:`atomic_write`: a temporary file
in the same folder, fsync, :func:`os.replace`, then an fsync of the folder itself (the rename is only durable once
the directory entry is). Readers (``spectune.results_io``) never see half a file.

Secrets never reach the folder: every string of sweep.json and points.jsonl, and the ``error`` of request records,
goes through :class:`backends.redact.Redactor` (the environment's secret values, credentials in URLs...).

A write that fails (a folder that cannot be created, a full disk) raises :class:`UserError` with one line naming
the file, the reason and the fix; what was already written stays valid and ``--resume`` finishes the sweep.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import io
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from backends.redact import Redactor, redact_obj
from loadgen.metrics import METRIC_COLUMNS
from loadgen.record import RequestRecord
from spectune.errors import UserError

KEY_COLUMNS = ("steps", "concurrency", "repeat")
ACCEPTANCE_COLUMNS = ("acceptance_length", "acceptance_rate", "acceptance_length_source")
BATCH_SIZE_COLUMNS = ("batch_size_mean", "batch_size_p50", "batch_size_source")
_SPLIT = METRIC_COLUMNS.index("mean_tokens_per_chunk") + 1
#: summary.csv columns, in file order (docs/results-format.md).
SUMMARY_COLUMNS: tuple[str, ...] = (
    *KEY_COLUMNS, "status", "error", *METRIC_COLUMNS[:_SPLIT], *ACCEPTANCE_COLUMNS, *METRIC_COLUMNS[_SPLIT:],
    *BATCH_SIZE_COLUMNS,
    "acceptance_vs_c1",
)

Key = tuple[int, int, int]  # (steps, concurrency, repeat)


def point_key(obj: dict[str, Any]) -> Key | None:
    """(steps, concurrency, repeat) of a points.jsonl / requests.jsonl object, or None if it has none."""
    try:
        return int(obj["steps"]), int(obj["concurrency"]), int(obj.get("repeat", 0))
    except (KeyError, TypeError, ValueError):
        return None


def fsync_dir(folder: Path) -> None:
    """fsync a directory, making renames and new entries in it durable (POSIX: fsync(2) on the directory's fd)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[io.TextIOBase], None]) -> None:
    """Write ``path`` atomically: ``write(fh)`` into a temporary file beside it, fsync, ``os.replace``, then fsync
    the folder so that the rename survives a power loss."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def writing(what: Path, resume_hint: Path | None = None) -> Iterator[None]:
    """Turn an :class:`OSError` raised inside into a one-line :class:`UserError` naming ``what``, the reason and the
    fix (free space, or a writable ``--output-dir``); with ``resume_hint`` (the results folder) the message says
    how to finish the sweep with ``--resume``."""
    try:
        yield
    except OSError as err:
        why = err.strerror or type(err).__name__
        if resume_hint is not None:
            fix = (f"free space (or fix the folder), then finish with --resume --output-dir {resume_hint}; finished "
                   "points are kept")
        else:
            fix = "choose a writable --output-dir"
        raise UserError(f"cannot write {what}: {why}: {fix}", exit_code=1 if resume_hint is not None else 2) from None


def json_object(line: str) -> dict[str, Any] | None:
    """``line`` parsed as JSON when it holds a JSON object; None when it is not JSON or another JSON value."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def iter_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """(line, parsed object or None) for each non-blank line; a line that is not a JSON object gives None."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.strip():
                yield line if line.endswith("\n") else line + "\n", json_object(line)


def summary_row(point: dict[str, Any]) -> dict[str, Any]:
    """One summary.csv row from a points.jsonl object (its keys, status, error and ``metrics``)."""
    row = {c: point.get("metrics", {}).get(c) for c in SUMMARY_COLUMNS}
    row.update({c: point.get(c) for c in (*KEY_COLUMNS, "status", "error")})
    return row


def _csv_value(v: Any) -> Any:
    return "" if v is None else v


def now_iso() -> str:
    """UTC time now, ISO 8601 to the second (the ``created``/``finished`` stamps)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# -- point objects (points.jsonl) ----------------------------------------------------------------------------

def point_status(records: Sequence[RequestRecord], max_failure_rate: float) -> tuple[str, str]:
    """(``"ok"``, ``""``) or (``"failed"``, why) for a measured point.

    Failed when no request finished, when failed requests / measured requests > ``max_failure_rate``, or when no
    request produced output. The reason names the counts and the first error.
    """
    n = len(records)
    if n == 0:
        return "failed", "no measured request finished"
    failed = [r for r in records if r.error is not None]
    first = f"; first error: {failed[0].error}" if failed else ""
    if len(failed) / n > max_failure_rate:
        return "failed", f"{len(failed)} of {n} requests failed (more than {max_failure_rate:.0%}){first}"
    if not any(r.ok for r in records):
        return "failed", f"no request produced output ({n} measured){first}"
    return "ok", ""


def failed_point(key: Key, error: str, planned: int, log_tail: str = "") -> dict[str, Any]:
    """A points.jsonl object for a point that measured nothing (its server never came up)."""
    metrics: dict[str, Any] = {c: None for c in SUMMARY_COLUMNS if c not in (*KEY_COLUMNS, "status", "error")}
    metrics.update(num_requests=0, num_failed=0, total_output_tokens=0, acceptance_length_source="none",
                   batch_size_source="none")
    steps, conc, rep = key
    return {"steps": steps, "concurrency": conc, "repeat": rep, "status": "failed", "error": error,
            "metrics": metrics, "acceptance": {"per_position": [], "num_drafts": None, "warning": None},
            "batch_size": None,
            "per_category": {}, "window": {"start_s": None, "end_s": None}, "requests_planned": planned,
            "stop_reason": "server_start_failed", "log_tail": log_tail, "finished": now_iso()}


def spec_decode_acceptance(records: Sequence[RequestRecord]) -> float | None:
    """Acceptance length from per-request ``server_stats["spec_decode"]`` counters (the bundled engine's).

    acceptance_length = 1 + sum(accepted_tokens) / sum(verify_steps) over the successful records (bonus token
    counted; 1.0 when no verify step ran). None unless every successful record carries both fields.
    """
    verify = accepted = 0.0
    ok = [r for r in records if r.ok]
    for r in ok:
        spec = (r.server_stats or {}).get("spec_decode")
        if not isinstance(spec, dict) or spec.get("verify_steps") is None or spec.get("accepted_tokens") is None:
            return None
        verify += float(spec["verify_steps"])
        accepted += float(spec["accepted_tokens"])
    if not ok:
        return None
    return 1.0 + accepted / verify if verify > 0 else 1.0


def per_category_points(records: Sequence[RequestRecord], duration_s: float | None, steps: int,
                        ask: Callable[[list[RequestRecord]], Any]) -> dict[str, dict[str, Any]]:
    """points.jsonl ``per_category``: :func:`loadgen.per_category` plus ``acceptance_length`` and its source.

    Per category, acceptance comes from (1) 1.0 at num_steps 0; (2) per-request ``spec_decode`` counters
    (:func:`spec_decode_acceptance`); (3) ``ask(records)``, the backend's acceptance over those records without
    counter snapshots, kept only when its source is per-request (not ``proxy:``/``none``). Else None: window
    counters cannot be split by category.
    """
    from loadgen.metrics import per_category

    out = per_category(records, duration_s)
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(r.category or "none", []).append(r)
    for cat, entry in out.items():
        recs = groups.get(cat, [])
        value, source = None, "none"
        if steps == 0:
            value, source = 1.0, "config:num_steps=0"
        elif (v := spec_decode_acceptance(recs)) is not None:
            value, source = v, "spec_decode:per-request"
        else:
            acc = ask(recs)
            src = str(getattr(acc, "source", "none"))
            if getattr(acc, "acceptance_length", None) is not None and not src.startswith(("proxy:", "none")):
                value, source = acc.acceptance_length, src
        entry["acceptance_length"], entry["acceptance_length_source"] = value, source
    return out


class ResultsFolder:
    """One sweep's folder: ``sweep.json``, ``requests.jsonl``, ``points.jsonl``, ``summary.csv``, ``logs/``.

    Use :meth:`check` (read-only: plan comparison, finished points) before anything runs, then :meth:`open`.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.sweep_json = self.path / "sweep.json"
        self.requests = self.path / "requests.jsonl"
        self.points_file = self.path / "points.jsonl"
        self.summary = self.path / "summary.csv"
        self.logs = self.path / "logs"
        self.points: list[dict[str, Any]] = []  # finished points, in file order
        self._req_fh: io.BufferedWriter | None = None
        self._pt_fh: io.TextIOBase | None = None
        self.redactor = Redactor()

    # -- reading --------------------------------------------------------------------------------------------
    def read_meta(self) -> dict[str, Any] | None:
        """The parsed ``sweep.json``, or None when absent.

        Raises:
            UserError: the file is not a JSON object.
        """
        if not self.sweep_json.is_file():
            return None
        try:
            meta = json.loads(self.sweep_json.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            meta = None
        if not isinstance(meta, dict):
            raise UserError(f"{self.sweep_json} is damaged (not a JSON object): use a new --output-dir")
        return meta

    def read_points(self) -> list[dict[str, Any]]:
        """Finished points from ``points.jsonl`` (unparsable lines, e.g. one cut short by a crash, skipped; a key
        that appears twice keeps its last line)."""
        by_key: dict[Key, dict[str, Any]] = {}
        for _, obj in iter_jsonl(self.points_file):
            key = point_key(obj) if obj else None
            if key is not None:
                by_key.pop(key, None)
                by_key[key] = obj  # type: ignore[assignment]
        return list(by_key.values())

    def check(self, plan: dict[str, Any], resume: bool, retry_failed: bool = False) -> list[dict[str, Any]]:
        """Decide, without writing anything, which finished points the sweep keeps.

        Returns:
            the points to keep (empty for a new sweep); with ``retry_failed``, failed points are not kept.

        Raises:
            UserError: the folder holds a different plan (the differing keys named); or it holds finished points
                and ``resume`` is False; or ``resume`` is True and there is no ``sweep.json`` to resume.
        """
        meta = self.read_meta()
        points = self.read_points()
        if meta is None:
            if resume:
                raise UserError(f"nothing to resume in {self.path} (no sweep.json): drop --resume to start a sweep")
            if points:
                raise UserError(f"{self.path} holds points.jsonl but no sweep.json: use a new --output-dir")
            return []
        old = meta.get("plan") or {}
        new = json.loads(json.dumps(plan))
        if old != new:
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            shown = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:4])
            raise UserError(f"{self.path} holds a different sweep plan ({shown}): use a new --output-dir, or the "
                            "same options to --resume it")
        if points and not resume:
            raise UserError(f"{self.path} already holds {len(points)} finished point(s) of this plan: add --resume "
                            "to finish it, or pass a new --output-dir")
        if retry_failed:
            points = [p for p in points if p.get("status") == "ok"]
        return points

    # -- writing --------------------------------------------------------------------------------------------
    def open(self, meta: dict[str, Any], keep: list[dict[str, Any]]) -> None:
        """Create the folder, write ``sweep.json``, keep only ``keep``'s points and their request records
        (rewritten atomically, so a crashed or interrupted point leaves nothing behind), open the append files
        and rewrite ``summary.csv``.

        Raises:
            UserError: the folder cannot be created or written (one line; exit code 2).
        """
        with writing(self.path):
            self.path.mkdir(parents=True, exist_ok=True)
            self.logs.mkdir(exist_ok=True)
            self.write_meta(meta)
            keys = {point_key(p) for p in keep}
            self.points = list(keep)
            if self.points_file.exists() or keep:
                atomic_write(self.points_file, lambda fh: fh.writelines(json.dumps(p) + "\n" for p in keep))
            if self.requests.exists():
                kept = (line for line, obj in iter_jsonl(self.requests) if obj is not None and point_key(obj) in keys)
                atomic_write(self.requests, lambda fh: fh.writelines(kept))
            self._req_fh = open(self.requests, "ab")
            self._pt_fh = open(self.points_file, "a", encoding="utf-8")
            self.write_summary()

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Rewrite ``sweep.json`` atomically (string values redacted, except the ``plan``, which ``--resume``
        compares as written and which holds no secrets).

        Raises:
            UserError: the write failed (full disk...).
        """
        clean = {k: v if k == "plan" else redact_obj(v, self.redactor) for k, v in meta.items()}
        text = json.dumps(clean, indent=2, default=str) + "\n"
        with writing(self.sweep_json, self.path if self._pt_fh is not None else None):
            atomic_write(self.sweep_json, lambda fh: fh.write(text))

    def request_mark(self) -> int:
        """Current end of ``requests.jsonl`` (bytes), for :meth:`truncate_requests`."""
        assert self._req_fh is not None
        self._req_fh.flush()
        return self._req_fh.tell()

    def append_request(self, obj: dict[str, Any]) -> None:
        """Append one measured request record (one line, flushed; its ``error`` redacted).

        Raises:
            UserError: the write failed (full disk...): the sweep stops, finished points stay.
        """
        assert self._req_fh is not None
        if obj.get("error"):
            obj = {**obj, "error": self.redactor(str(obj["error"]))}
        with writing(self.requests, self.path):
            self._req_fh.write(json.dumps(obj).encode() + b"\n")
            self._req_fh.flush()

    def truncate_requests(self, mark: int) -> None:
        """Drop the request records appended after ``mark`` (an interrupted point's partial requests). Best effort
        after a failed write (the buffer is dropped; ``--resume`` cleans up whatever is left)."""
        assert self._req_fh is not None
        try:
            self._req_fh.flush()
        except OSError:  # a full disk: what the buffer held is lost anyway, the point is unfinished
            pass
        try:
            self._req_fh.truncate(mark)
            self._req_fh.seek(mark)
        except OSError:
            pass

    def append_point(self, point: dict[str, Any]) -> None:
        """Make a finished point durable: fsync its requests, append it to ``points.jsonl`` (fsynced), then
        rewrite ``summary.csv`` atomically. String values are redacted.

        Raises:
            UserError: a write failed (full disk...): the points written before stay; ``--resume`` finishes.
        """
        assert self._req_fh is not None and self._pt_fh is not None
        point = redact_obj(point, self.redactor)
        with writing(self.requests, self.path):
            self._req_fh.flush()
            os.fsync(self._req_fh.fileno())
        with writing(self.points_file, self.path):
            self._pt_fh.write(json.dumps(point) + "\n")
            self._pt_fh.flush()
            os.fsync(self._pt_fh.fileno())
        self.points.append(point)
        with writing(self.summary, self.path):
            self.write_summary()

    def write_summary(self, points: Iterable[dict[str, Any]] | None = None) -> None:
        """Rewrite ``summary.csv`` atomically: one row per finished point, sorted by steps, concurrency, repeat."""
        from spectune.batch_acceptance import acceptance_vs_c1

        points = list(self.points if points is None else points)
        ratios = acceptance_vs_c1(points)
        rows = sorted((summary_row(p) | {"acceptance_vs_c1": ratios.get((p.get("steps"), p.get("concurrency")))}
                       for p in points), key=lambda r: (r["steps"], r["concurrency"], r["repeat"]))

        def write(fh: io.TextIOBase) -> None:
            writer = csv.DictWriter(fh, fieldnames=list(SUMMARY_COLUMNS), lineterminator="\n")
            writer.writeheader()
            writer.writerows({k: _csv_value(v) for k, v in r.items()} for r in rows)

        atomic_write(self.summary, write)

    def close(self) -> None:
        """Close the append files (idempotent; a failing final flush, e.g. on a full disk, is ignored: every record
        that matters was flushed when it was written)."""
        for fh in (self._req_fh, self._pt_fh):
            if fh is not None:
                try:
                    fh.close()
                except OSError:
                    pass
        self._req_fh = self._pt_fh = None
