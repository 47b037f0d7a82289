"""Results folders (docs/results-format.md): :class:`RunFolder` holds what every run writes (``requests.jsonl``
appended one flushed line per request, ``logs/``, redaction, a metadata JSON rewritten atomically);
:class:`SweepFolder` adds ``points.jsonl``, ``summary.csv``, plan checks and resume; :class:`ValidateFolder` adds
``validate.json`` and ``validate.md``.

Writes follow one rule: nothing finished is ever lost (:mod:`spectune.results.durable`). Secrets never reach a
folder: every string of the metadata and points, and the ``error`` of request records, goes through
:class:`spectune.backends.redact.Redactor` (the environment's secret values, credentials in URLs...). A write that
fails (a folder that cannot be created, a full disk) raises :class:`UserError` with one line naming the file, the
reason and the fix; what was already written stays valid and ``--resume`` finishes a sweep.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from spectune.backends.redact import Redactor, redact_obj
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject, JsonValue
from spectune.results.durable import atomic_write, iter_jsonl, writing
from spectune.results.point import MetricValue, PointObject, RequestLine, SweepPoint, as_points
from spectune.results.schema import Key, SUMMARY_COLUMNS, point_key, summary_row
from spectune.results.sweep_meta import SweepMeta


def _csv_value(v: MetricValue) -> MetricValue:
    return "" if v is None else v


def relative_inside(obj: JsonValue, folder: Path) -> JsonValue:
    """A copy of a JSON-like object in which every string value that is a path inside ``folder`` (spelled from the
    folder as given, or absolute) is written relative to it (``logs/server-steps3.log``), so that a results folder
    moved, shared or committed names no machine's folders for its own files. Keys, numbers, other strings and the
    structure are untouched; raises nothing."""
    prefixes = {str(folder.absolute()) + os.sep}
    try:
        prefixes.add(str(folder.resolve()) + os.sep)
    except OSError:
        pass
    if str(folder) != ".":
        prefixes.add(str(folder) + os.sep)
    ordered = sorted(prefixes, key=len, reverse=True)

    def walk(v: JsonValue) -> JsonValue:
        if isinstance(v, str):
            return next((v[len(p):] for p in ordered if v.startswith(p) and len(v) > len(p)), v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return v

    return walk(obj)


class RunFolder:
    """What every measured run writes: ``requests.jsonl`` (one flushed line per request, its ``error`` redacted),
    ``logs/`` and one metadata JSON file (``meta_name``) rewritten atomically with its strings redacted.

    Args:
        path: the folder (created by :meth:`open_files`).
        meta_name: the metadata file's name (``sweep.json``, ``validate.json``).
    """

    def __init__(self, path: Path, meta_name: str) -> None:
        self.path = Path(path)
        self.requests = self.path / "requests.jsonl"
        self.meta_path = self.path / meta_name
        self.logs = self.path / "logs"
        self.redactor = Redactor()
        self._req_fh: io.BufferedWriter | None = None

    def open_files(self) -> None:
        """Create the folder and ``logs/`` and open ``requests.jsonl`` for appending.

        Raises:
            UserError: the folder cannot be created or written (one line; exit code 2).
        """
        with writing(self.path):
            self.logs.mkdir(parents=True, exist_ok=True)
            self._req_fh = open(self.requests, "ab")

    def append_request(self, obj: JsonObject, resume_hint: Path | None = None) -> None:
        """Append one measured request record (one line, flushed; its ``error`` redacted).

        Raises:
            UserError: the write failed (full disk...): the run stops, finished work stays.
        """
        assert self._req_fh is not None
        if obj.get("error"):
            obj = {**obj, "error": self.redactor(str(obj["error"]))}
        with writing(self.requests, resume_hint):
            self._req_fh.write(json.dumps(obj).encode() + b"\n")
            self._req_fh.flush()

    def sync_requests(self, resume_hint: Path | None = None) -> None:
        """fsync ``requests.jsonl`` (before a record that depends on them is written)."""
        if self._req_fh is not None:
            with writing(self.requests, resume_hint):
                self._req_fh.flush()
                os.fsync(self._req_fh.fileno())

    def write_meta(self, meta: JsonObject, keep: tuple[str, ...] = (), resume_hint: Path | None = None) -> None:
        """Rewrite the metadata file atomically; string values redacted, and paths inside the folder (server logs)
        written relative to it (:func:`relative_inside`), except the top-level keys in ``keep``.

        Raises:
            UserError: the write failed (full disk...).
        """
        clean = {k: v if k in keep else relative_inside(redact_obj(v, self.redactor), self.path)
                 for k, v in meta.items()}
        text = json.dumps(clean, indent=2, default=str) + "\n"
        with writing(self.meta_path, resume_hint):
            atomic_write(self.meta_path, lambda fh: fh.write(text))

    def _extra_files(self) -> list[io.IOBase | None]:
        return []

    def close(self) -> None:
        """Close the append files (idempotent; a failing final flush, e.g. on a full disk, is ignored: every record
        that matters was flushed when it was written)."""
        for fh in (self._req_fh, *self._extra_files()):
            if fh is not None:
                try:
                    fh.close()
                except OSError:
                    pass
        self._req_fh = None
        self._close_extra()

    def _close_extra(self) -> None:
        pass


class SweepFolder(RunFolder):
    """One sweep's folder: ``sweep.json``, ``requests.jsonl``, ``points.jsonl``, ``summary.csv``, ``logs/``.

    Use :meth:`check` (read-only: plan comparison, finished points) before anything runs, then :meth:`open`.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, "sweep.json")
        self.sweep_json = self.meta_path
        self.points_file = self.path / "points.jsonl"
        self.summary = self.path / "summary.csv"
        self.points: list[SweepPoint] = []  # finished points, in file order
        self.predicted: list[JsonObject] = []  # a guided sweep's predicted cells (summary.csv rows only)
        self.drift_requests = self.path / "drift_requests.jsonl"
        self._pt_fh: io.TextIOBase | None = None

    # -- reading --------------------------------------------------------------------------------------------
    def read_meta(self) -> JsonObject | None:
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

    def read_points(self) -> list[SweepPoint]:
        """Finished points from ``points.jsonl``, as records (unparsable lines, e.g. one cut short by a crash,
        skipped; a key that appears twice keeps its last line)."""
        by_key: dict[Key, SweepPoint] = {}
        for _, obj in iter_jsonl(self.points_file):
            key = point_key(obj) if obj else None
            if key is not None:
                by_key.pop(key, None)
                by_key[key] = SweepPoint.from_dict(obj)  # type: ignore[arg-type]
        return list(by_key.values())

    def check(self, plan: JsonObject, resume: bool, retry_failed: bool = False,
              defaults: Mapping[str, JsonValue] | None = None) -> list[SweepPoint]:
        """Decide, without writing anything, which finished points the sweep keeps.

        ``defaults``: plan keys an older sweep.json may lack, with the value their absence means.

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
        old = {**json.loads(json.dumps(defaults or {})), **(meta.get("plan") or {})}
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
            points = [p for p in points if p.status == "ok"]
        return points

    # -- writing --------------------------------------------------------------------------------------------
    def open(self, meta: SweepMeta, keep: Sequence[SweepPoint]) -> None:
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
            keys = {p.key for p in keep}
            self.points = list(keep)
            if self.points_file.exists() or keep:
                atomic_write(self.points_file,
                             lambda fh: fh.writelines(json.dumps(p.to_dict()) + "\n" for p in keep))
            if self.requests.exists():
                kept = (line for line, obj in iter_jsonl(self.requests) if obj is not None and point_key(obj) in keys)
                atomic_write(self.requests, lambda fh: fh.writelines(kept))
            self._req_fh = open(self.requests, "ab")
            self._pt_fh = open(self.points_file, "a", encoding="utf-8")
            self.write_summary()

    def write_meta(self, meta: SweepMeta) -> None:  # type: ignore[override]
        """Rewrite ``sweep.json`` (:meth:`SweepMeta.to_json`) atomically (string values redacted, except the ``plan``, which ``--resume``
        compares as written and which holds no secrets).

        Raises:
            UserError: the write failed (full disk...).
        """
        super().write_meta(meta.to_json(), keep=("plan",), resume_hint=self.path if self._pt_fh is not None else None)

    def request_mark(self) -> int:
        """Current end of ``requests.jsonl`` (bytes), for :meth:`truncate_requests`."""
        assert self._req_fh is not None
        self._req_fh.flush()
        return self._req_fh.tell()

    def append_request(self, obj: JsonObject) -> None:  # type: ignore[override]
        """Append one measured request record (see :meth:`RunFolder.append_request`); a failed write names
        ``--resume``."""
        super().append_request(obj, self.path)

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

    def append_drift_request(self, obj: JsonObject) -> None:
        """Append one request of a drift re-measurement to ``drift_requests.jsonl`` (kept apart from
        requests.jsonl, whose records are the points'; its ``error`` redacted).

        Raises:
            UserError: the write failed.
        """
        if obj.get("error"):
            obj = {**obj, "error": self.redactor(str(obj["error"]))}
        with writing(self.drift_requests, self.path):
            with open(self.drift_requests, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(obj) + "\n")

    def read_requests(self) -> list[RequestLine]:
        """The request objects of ``requests.jsonl`` (unparsable lines skipped)."""
        self.sync_requests()
        return [obj for _, obj in iter_jsonl(self.requests) if obj is not None]

    def append_point(self, point: SweepPoint | PointObject) -> None:
        """Make a finished point durable: fsync its requests, append it (:meth:`SweepPoint.to_dict`) to
        ``points.jsonl`` (fsynced), keep it in :attr:`points` (as the record of the line written), then rewrite
        ``summary.csv`` atomically. String values are redacted.

        Raises:
            UserError: a write failed (full disk...): the points written before stay; ``--resume`` finishes.
        """
        assert self._req_fh is not None and self._pt_fh is not None
        if isinstance(point, SweepPoint):
            point = point.to_dict()
        point = redact_obj(point, self.redactor)
        with writing(self.requests, self.path):
            self._req_fh.flush()
            os.fsync(self._req_fh.fileno())
        with writing(self.points_file, self.path):
            self._pt_fh.write(json.dumps(point) + "\n")
            self._pt_fh.flush()
            os.fsync(self._pt_fh.fileno())
        self.points.append(SweepPoint.from_dict(point))
        with writing(self.summary, self.path):
            self.write_summary()

    def rewrite_points(self) -> None:
        """Rewrite ``points.jsonl`` atomically from :attr:`points` (changed in place: a distributed sweep marks the
        points of unlike nodes, :mod:`spectune.sweep.distributed`), reopen it for appending and rewrite
        ``summary.csv``.

        Raises:
            UserError: a write failed (the previous points.jsonl stays whole).
        """
        points = [redact_obj(p.to_dict(), self.redactor) for p in self.points]
        with writing(self.points_file, self.path):
            if self._pt_fh is not None:
                self._pt_fh.close()
            atomic_write(self.points_file, lambda fh: fh.writelines(json.dumps(p) + "\n" for p in points))
            self._pt_fh = open(self.points_file, "a", encoding="utf-8")
        with writing(self.summary, self.path):
            self.write_summary()

    def write_summary(self, points: Iterable[SweepPoint | PointObject] | None = None) -> None:
        """Rewrite ``summary.csv`` atomically: one row per finished point (:attr:`points`, or ``points``: records or
        points.jsonl objects) and per predicted cell (:attr:`predicted`), sorted by steps, concurrency, repeat."""
        from spectune.results.batch_acceptance import acceptance_vs_c1

        records = as_points(self.points if points is None else points)
        ratios = acceptance_vs_c1(records)
        rows = [p.summary_row() | {"acceptance_vs_c1": ratios.get(p.key.cell)} for p in records]
        rows += [summary_row(p) | {"acceptance_vs_c1": ratios.get((p["steps"], p["concurrency"]))}
                 for p in self.predicted]
        rows.sort(key=lambda r: (r["steps"], r["concurrency"], r["repeat"]))

        def write(fh: io.TextIOBase) -> None:
            writer = csv.DictWriter(fh, fieldnames=list(SUMMARY_COLUMNS), lineterminator="\n")
            writer.writeheader()
            writer.writerows({k: _csv_value(v) for k, v in r.items()} for r in rows)

        atomic_write(self.summary, write)

    def _extra_files(self) -> list[io.IOBase | None]:
        return [self._pt_fh]

    def _close_extra(self) -> None:
        self._pt_fh = None


class ValidateFolder(RunFolder):
    """One validation's folder: ``requests.jsonl``, ``validate.json`` and ``validate.md`` (atomic), ``logs/``.

    Args:
        path: the folder. render: validate.md's text from the (redacted) validate.json object.
    """

    def __init__(self, path: Path, render: Callable[[JsonObject], str]) -> None:
        super().__init__(path, "validate.json")
        self.json_path = self.meta_path
        self.md_path = self.path / "validate.md"
        self.render = render

    def check(self) -> None:
        """Raises UserError when the folder already holds a validation (nothing measured is overwritten)."""
        if self.json_path.exists() or (self.requests.exists() and self.requests.stat().st_size > 0):
            raise UserError(f"{self.path} already holds a validation: pass a new --output-dir")

    def open(self) -> None:
        """Create the folder and open requests.jsonl. Raises UserError when it cannot be written."""
        self.open_files()

    def write(self, meta: JsonObject) -> None:
        """Make the request records durable (fsync), then rewrite validate.json and validate.md atomically (strings
        redacted). Raises UserError on a failed write."""
        meta = redact_obj(meta, self.redactor)
        self.sync_requests()
        self.write_meta(meta)
        with writing(self.md_path):
            atomic_write(self.md_path, lambda fh: fh.write(self.render(meta)))
