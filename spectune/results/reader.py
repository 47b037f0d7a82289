"""Read a sweep results folder (or a bare ``summary.csv``) into pandas, with one-line :class:`UserError` messages.

The folder layout and the summary columns are defined in ``docs/results-format.md``. Readers here never modify the
folder. ``recommend``, ``gate`` and ``report`` all start from :func:`load_results`.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.results.schema import P_MIN_FOLDER, SCHEDULE_FOLDER
from spectune.results.sweep_meta import SweepMeta

#: summary.csv columns that must be present (docs/results-format.md).
REQUIRED_COLUMNS = ("steps", "concurrency", "status")
#: Non-numeric summary.csv columns; every other known column is coerced to float (empty -> NaN).
TEXT_COLUMNS = ("status", "error", "acceptance_length_source", "token_count_source", "batch_size_source")
#: Numeric summary.csv columns (docs/results-format.md), in file order.
NUMERIC_COLUMNS = (
    "num_requests", "num_failed", "duration_s", "achieved_concurrency", "request_throughput_req_s",
    "output_throughput_tok_s", "total_output_tokens",
    "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
    "tpot_mean_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
    "itl_mean_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "chunk_itl_p50_ms", "chunk_itl_p99_ms",
    "e2el_mean_ms", "e2el_p50_ms", "e2el_p90_ms", "e2el_p99_ms", "mean_tokens_per_chunk",
    "acceptance_length", "acceptance_rate", "slo_attainment", "goodput_req_s", "batch_size_mean", "batch_size_p50",
    "acceptance_vs_c1", "output_throughput_ci_low", "output_throughput_ci_high", "tpot_p50_ci_low",
    "tpot_p50_ci_high",
)


@dataclass
class Results:
    """One sweep's results.

    Attributes:
        summary: one row per finished point (steps x concurrency x repeat), columns of summary.csv; ``steps``,
            ``concurrency`` and ``repeat`` are ints, ``status`` is ``"ok"`` or ``"failed"``, metrics are floats
            (NaN where empty).
        source: the folder or CSV file that was read.
        sweep: the parsed ``sweep.json`` (plan, backend, host, versions), or None for a bare CSV.
        points: the parsed ``points.jsonl`` objects (in file order), or an empty list.
        folder: the results folder, or None for a bare CSV (``requests.jsonl`` lives there).
        schedule: the folder's ``schedule-server/`` sweep (the engine's schedule server pinned to each num_steps,
            ``spectune sweep --schedule-server``) read the same way, or None when it has none.
        p_min: the folder's ``p-min/P/`` sweeps (a server per draft-confidence cutoff P, ``spectune sweep
            --p-min``) read the same way, keyed by P ascending; empty when it has none.
    """

    summary: pd.DataFrame
    source: Path
    sweep: JsonObject | None = None
    points: list[JsonObject] | None = None
    folder: Path | None = None
    schedule: "Results | None" = None
    p_min: "dict[float, Results]" = field(default_factory=dict)

    @property
    def meta(self) -> SweepMeta:
        """``sweep.json`` as a record (an empty one for a bare CSV)."""
        return SweepMeta.from_json(self.sweep or {})

    @property
    def plan(self) -> JsonObject:
        """The sweep plan from ``sweep.json`` (``{}`` when unknown)."""
        return dict((self.sweep or {}).get("plan") or {})


def requests_file(folder: Path | None) -> Path | None:
    """A results folder's per-request file: ``requests.jsonl`` as the sweep writes it, else ``requests.jsonl.gz`` (the
    same file gzipped to keep it small, as docs/examples/smollm2-h200 ships it); None when neither is there."""
    if folder is None:
        return None
    for name in ("requests.jsonl", "requests.jsonl.gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _read_jsonl(path: Path) -> list[JsonObject]:
    """The JSON objects of a JSON Lines file (gzip-compressed when its name ends in ``.gz``), one per line.

    Raises:
        UserError: the file is not UTF-8 or not gzip, or a line before the last is not JSON.
    """
    out: list[JsonObject] = []
    data = path.read_bytes()
    try:
        lines = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8").splitlines()
    except (gzip.BadGzipFile, EOFError):
        raise UserError(f"{path}: not a gzip file: the folder is damaged (gunzip it or measure again)") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text: the folder is damaged") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                break  # a last line cut short by a crash: the lines before it are still good
            raise UserError(f"{path}: line {n} is not JSON: fix or remove that line") from None
        if isinstance(obj, dict):
            out.append(obj)
    return out


def normalize_summary(df: pd.DataFrame, source: Path | str) -> pd.DataFrame:
    """Check and coerce a summary table: required columns, int keys, numeric metrics.

    Raises:
        UserError: a required column is missing, the table is empty, or steps/concurrency are not integers.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{source}: missing column(s) {', '.join(missing)}: is this a spectune summary.csv?")
    if df.empty:
        raise UserError(f"{source}: no rows: the sweep has not finished any point yet")
    df = df.copy()
    if "repeat" not in df.columns:
        df["repeat"] = 0
    for col in ("steps", "concurrency", "repeat"):
        num = pd.to_numeric(df[col], errors="coerce")
        if num.isna().any() or (num % 1 != 0).any():
            raise UserError(f"{source}: column '{col}' holds non-integer values: the file is damaged")
        df[col] = num.astype(int)
    if (df["concurrency"] < 1).any() or (df["steps"] < 0).any():
        raise UserError(f"{source}: steps must be >= 0 and concurrency >= 1")
    df["status"] = df["status"].fillna("failed").astype(str).str.strip().str.lower()
    for flag in ("predicted", "stopped_early"):
        if flag in df.columns:
            df[flag] = df[flag].map(lambda v: str(v).strip().lower() in ("true", "1", "1.0"))
    for col in df.columns:
        if col in TEXT_COLUMNS:
            df[col] = df[col].fillna("").astype(str)
        elif col in NUMERIC_COLUMNS:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df.sort_values(["concurrency", "steps", "repeat"]).reset_index(drop=True)


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, keep_default_na=True)
    except pd.errors.EmptyDataError:
        raise UserError(f"{path}: the file is empty: point at a summary.csv written by 'spectune sweep'") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as err:
        raise UserError(f"{path}: not a readable CSV ({str(err).splitlines()[0]})") from None


def load_results(path: str | Path) -> Results:
    """Load a results folder (``summary.csv``, else ``points.jsonl``) or a bare ``summary.csv``.

    Args:
        path: a folder written by ``spectune sweep`` or a CSV file with the summary.csv columns.

    Returns:
        :class:`Results` with the normalized summary table.

    Raises:
        UserError: the path does not exist, holds no summary, or the data cannot be read.
    """
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such file or folder: pass a sweep results folder or its summary.csv")
    if p.is_file():
        return Results(summary=normalize_summary(_read_csv(p), p), source=p)
    sweep = None
    if (p / "sweep.json").is_file():
        try:
            sweep = json.loads((p / "sweep.json").read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"{p / 'sweep.json'}: not valid JSON: the folder is damaged") from None
    points = _read_jsonl(p / "points.jsonl") if (p / "points.jsonl").is_file() else []
    if (p / "summary.csv").is_file():
        df = _read_csv(p / "summary.csv")
        source = p / "summary.csv"
    elif points:
        rows = [{**(pt.get("metrics") or {}), "steps": pt.get("steps"), "concurrency": pt.get("concurrency"),
                 "repeat": pt.get("repeat", 0), "status": pt.get("status", "ok")} for pt in points]
        df, source = pd.DataFrame(rows), p / "points.jsonl"
    else:
        raise UserError(f"{p}: no summary.csv or points.jsonl: is this a 'spectune sweep' results folder?")
    sub = p / SCHEDULE_FOLDER
    schedule = load_results(sub) if (sub / "summary.csv").is_file() or (sub / "points.jsonl").is_file() else None
    return Results(summary=normalize_summary(df, source), source=source, sweep=sweep, points=points, folder=p,
                   schedule=schedule, p_min=_p_min_results(p / P_MIN_FOLDER))


def _p_min_results(folder: Path) -> dict[float, Results]:
    """The sweeps in ``folder`` (a results folder's ``p-min/``) whose names are numbers: {P: Results}, P ascending."""
    out: dict[float, Results] = {}
    for sub in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            p_min = float(sub.name)
        except ValueError:
            continue
        if (sub / "summary.csv").is_file() or (sub / "points.jsonl").is_file():
            out[p_min] = load_results(sub)
    return dict(sorted(out.items()))


def load_requests(folder: Path | None) -> pd.DataFrame | None:
    """Per-request SLO inputs from ``requests.jsonl``: steps, concurrency, repeat, ok, ttft_ms, tpot_ms.

    Returns None when the folder or file is absent (:func:`requests_file`: ``requests.jsonl`` or its ``.gz``).
    ``ok`` is False for failed requests (an error or no output).
    Raises:
        UserError: a line in the middle of the file is not JSON.
    """
    path = requests_file(folder)
    if path is None:
        return None
    rows = [{"steps": r.get("steps"), "concurrency": r.get("concurrency"), "repeat": r.get("repeat", 0),
             "ok": r.get("error") is None and bool(r.get("chunk_times")),
             "ttft_ms": r.get("ttft_ms"), "tpot_ms": r.get("tpot_ms")}
            for r in _read_jsonl(path)]
    if not rows:
        return None
    df = pd.DataFrame(rows).dropna(subset=["steps", "concurrency"])
    for col in ("steps", "concurrency", "repeat"):
        df[col] = df[col].astype(int)
    for col in ("ttft_ms", "tpot_ms"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def request_objects(folder: Path | None) -> list[JsonObject] | None:
    """The request objects of ``requests.jsonl`` as written (``chunk_times`` in s on the client's clock), or None
    when the folder or file is absent (:func:`requests_file`: ``requests.jsonl`` or its ``.gz``).

    Raises:
        UserError: a line in the middle of the file is not JSON.
    """
    path = requests_file(folder)
    return None if path is None else _read_jsonl(path)


def load_request_records(folder: Path | None) -> list[JsonObject] | None:
    """The measured request objects of ``requests.jsonl`` (:func:`request_objects`, ``chunk_times`` reduced to its
    length), or None when the folder or file is absent; for the bootstrap of :mod:`spectune.results.confidence`.

    Raises:
        UserError: a line in the middle of the file is not JSON.
    """
    records = request_objects(folder)
    if records is None:
        return None
    for r in records:
        r["chunk_times"] = len(r.get("chunk_times") or [])
        r.pop("chunk_tokens", None)
    return records


def with_text_columns(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of summary ``df`` holding every :data:`TEXT_COLUMNS` column: one the file lacks (a summary built
    from points.jsonl, or an older or hand-written summary.csv) is added empty ("")."""
    return df.assign(**{col: "" for col in TEXT_COLUMNS if col not in df})


def summary_with_slos(results: Results, ttft: float | None, tpot: float | None, warnings: list[str]) -> pd.DataFrame:
    """Summary with slo_attainment/goodput_req_s for the given SLOs (recomputed from requests.jsonl if needed), and
    every :data:`TEXT_COLUMNS` column (:func:`with_text_columns`).

    A request meets the SLOs when it succeeded, its TTFT <= ttft and its TPOT <= tpot (a one-token request has
    no TPOT and meets that part, as vLLM's goodput counts it); failed requests are misses. The summary's own
    columns are kept when the sweep ran with the same SLOs; without requests.jsonl they become NaN (a warning is
    appended to ``warnings``), except for a bare CSV, whose columns are assumed to match.
    """
    df = with_text_columns(results.summary)
    plan = results.plan
    same = results.sweep is not None and plan.get("slo_ttft_ms") == ttft and plan.get("slo_tpot_ms") == tpot
    have = "slo_attainment" in df and df["slo_attainment"].notna().any()
    if ttft is None and tpot is None or (same and have):
        return df
    reqs = load_requests(results.folder)
    if reqs is None:
        if have and results.sweep is None:
            warnings.append("assuming summary.csv's slo_attainment and goodput_req_s were computed for the given SLOs")
            return df
        warnings.append("SLO attainment for the given SLOs is unknown (no requests.jsonl): only the TPOT p99 rule "
                        "applies")
        df["slo_attainment"] = np.nan
        df["goodput_req_s"] = np.nan
        return df
    meets = reqs["ok"].copy()
    if ttft is not None:
        meets &= reqs["ttft_ms"] <= ttft
    if tpot is not None:
        meets &= reqs["tpot_ms"].isna() | (reqs["tpot_ms"] <= tpot)
    agg = reqs.assign(meets=meets).groupby(["steps", "concurrency", "repeat"])["meets"].agg(["sum", "count"])
    agg = agg.reset_index()
    df = df.drop(columns=[c for c in ("slo_attainment", "goodput_req_s") if c in df]).merge(
        agg, on=["steps", "concurrency", "repeat"], how="left")
    df["slo_attainment"] = df["sum"] / df["count"]
    df["goodput_req_s"] = df["sum"] / df["duration_s"] if "duration_s" in df else np.nan
    return df.drop(columns=["sum", "count"])
