"""CI performance gate: compare a current sweep with a baseline cell by cell, (num_steps, concurrency).

Each side's repeats are reduced to the median; a regression must exceed the limit AND lie outside the repeat
noise: the current repeats' range [min, max] must not overlap the baseline's (with one repeat per side the range is
a point, so only the limit applies). Checks per common cell:

- ``status``: a repeat failed in current but none in baseline (a baseline failure skips the cell);
- ``tpot``: TPOT p50 rose by more than ``max_tpot_regression`` (fraction of baseline);
- ``throughput``: output tokens/s fell by more than ``max_throughput_drop`` (fraction of baseline);
- ``acceptance``: acceptance length (tokens per verify) fell by more than ``max_acceptance_drop`` (absolute;
  num_steps > 0 only);
- ``slo_attainment``: current SLO attainment below ``min_slo_attainment`` (absolute, when given).

Bad input (missing/unreadable files, no common cells, a checked column with no values) raises :class:`UserError`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from xml.etree import ElementTree as ET

import pandas as pd

from spectune.core.errors import UserError
from spectune.results.reader import Results

DEFAULT_ACCEPTANCE_DROP = 0.1  # tokens per verify, used when the column has data and no limit was given


@dataclass
class GateLimits:
    """Limits: fractions (0.05 = 5%) for TPOT/throughput, tokens for acceptance, a share for SLO attainment."""

    max_tpot_regression: float = 0.05
    max_throughput_drop: float = 0.05
    max_acceptance_drop: float | None = None
    min_slo_attainment: float | None = None


@dataclass
class Check:
    """One check of one cell. ``outcome`` is ``pass``, ``fail`` or ``skip``."""

    steps: int
    concurrency: int
    name: str
    baseline: float
    current: float
    limit: str
    outcome: str
    message: str = ""
    baseline_range: tuple[float, float] = (math.nan, math.nan)
    current_range: tuple[float, float] = (math.nan, math.nan)

    @property
    def cell(self) -> str:
        """``K=3 c=16``: the cell's name in messages."""
        return f"K={self.steps} c={self.concurrency}"


def _stats(df: pd.DataFrame, col: str) -> pd.DataFrame:
    ok = df[df["status"] == "ok"]
    if col not in ok:
        return pd.DataFrame(columns=["median", "min", "max"])
    return ok.groupby(["steps", "concurrency"])[col].agg(["median", "min", "max"])


def _failed_repeats(df: pd.DataFrame) -> Counter[tuple[int, int]]:
    """Failed repeats per (steps, concurrency) cell of a summary; a cell without one counts 0."""
    failed = df[df["status"] != "ok"]
    return Counter(zip(failed["steps"].tolist(), failed["concurrency"].tolist()))


def _get(stats: pd.DataFrame, key: tuple[int, int]) -> tuple[float, float, float]:
    if key not in stats.index:
        return math.nan, math.nan, math.nan
    row = stats.loc[key]
    return float(row["median"]), float(row["min"]), float(row["max"])


def gate_checks(baseline: Results, current: Results, limits: GateLimits) -> tuple[list[Check], list[str]]:
    """All checks over the cells present in both sweeps, and notes on cells present in only one.

    Raises:
        UserError: no common cells, or a checked column holds no values in a sweep.
    """
    b, c = baseline.summary, current.summary
    keys_b, keys_c = set(zip(b["steps"], b["concurrency"])), set(zip(c["steps"], c["concurrency"]))
    common = sorted(keys_b & keys_c)
    if not common:
        raise UserError(f"no (num_steps, concurrency) cell in both {baseline.source} and {current.source}: "
                        "compare sweeps of the same plan")
    notes = [f"K={k} c={n} only in the baseline" for k, n in sorted(keys_b - keys_c)]
    notes += [f"K={k} c={n} only in the current sweep" for k, n in sorted(keys_c - keys_b)]
    acc_limit = limits.max_acceptance_drop
    plan = [("tpot", "tpot_p50_ms", +1, limits.max_tpot_regression, True),
            ("throughput", "output_throughput_tok_s", -1, limits.max_throughput_drop, True)]
    has_acc = all(col_has_data(df, "acceptance_length") for df in (b, c))
    if acc_limit is not None or has_acc:
        plan.append(("acceptance", "acceptance_length", -1, DEFAULT_ACCEPTANCE_DROP if acc_limit is None
                     else acc_limit, acc_limit is not None))
    for name, col, _, _, required in plan:
        for label, df, src in (("baseline", b, baseline.source), ("current", c, current.source)):
            if required and not col_has_data(df, col):
                raise UserError(f"{label} {src}: column '{col}' has no values in ok rows: cannot check {name}")
    if limits.min_slo_attainment is not None and not col_has_data(c, "slo_attainment"):
        raise UserError(f"{current.source}: column 'slo_attainment' has no values: sweep with SLOs or drop "
                        "--min-slo-attainment")
    checks: list[Check] = []
    failed_b, failed_c = _failed_repeats(b), _failed_repeats(c)
    stats = {col: (_stats(b, col), _stats(c, col)) for _, col, *_ in plan}
    for key in common:
        k, n = key
        nb, nc = failed_b[key], failed_c[key]
        if nb:
            checks.append(Check(k, n, "status", nb, nc, "no failed repeat", "skip",
                                f"{nb} failed repeat(s) in the baseline: cell not compared"))
            continue
        checks.append(Check(k, n, "status", 0, nc, "no failed repeat", "fail" if nc else "pass",
                            f"{nc} repeat(s) failed in the current sweep" if nc else ""))
        for name, col, sign, lim, _ in plan:
            if name == "acceptance" and k == 0:
                continue
            (bm, blo, bhi), (cm, clo, chi) = _get(stats[col][0], key), _get(stats[col][1], key)
            if not (math.isfinite(bm) and math.isfinite(cm)):
                checks.append(Check(k, n, name, bm, cm, "", "skip", f"no {col} value on one side"))
                continue
            if name == "acceptance":
                worse, text = bm - cm > lim, f"drop <= {lim:g} tokens"
            else:
                worse = (cm > bm * (1 + lim)) if sign > 0 else (cm < bm * (1 - lim))
                text = f"{'rise' if sign > 0 else 'drop'} <= {lim:.1%}"
            outside = clo > bhi if sign > 0 else chi < blo
            bad = worse and outside
            msg = f"{col}: baseline {bm:.4g}, current {cm:.4g} ({(cm - bm) / bm:+.1%})" if bm else ""
            if worse and not outside:
                msg += "; within the repeats' spread, not counted"
            checks.append(Check(k, n, name, bm, cm, text, "fail" if bad else "pass", msg, (blo, bhi), (clo, chi)))
        if limits.min_slo_attainment is not None:
            cm = _get(_stats(c, "slo_attainment"), key)[0]
            bm = _get(_stats(b, "slo_attainment"), key)[0]
            out = "skip" if not math.isfinite(cm) else ("fail" if cm < limits.min_slo_attainment else "pass")
            checks.append(Check(k, n, "slo_attainment", bm, cm, f">= {limits.min_slo_attainment:g}", out,
                                f"slo_attainment: current {cm:.3f}" if math.isfinite(cm) else "no value"))
    return checks, notes


def col_has_data(df: pd.DataFrame, col: str) -> bool:
    """True when ``col`` exists and has at least one non-NaN value in an ok row."""
    return col in df and df.loc[df["status"] == "ok", col].notna().any()


def junit_xml(checks: list[Check]) -> str:
    """JUnit XML: one testcase per (cell, check); failures carry baseline, current and limit."""
    suite = ET.Element("testsuite", name="spectune gate", tests=str(len(checks)),
                       failures=str(sum(c.outcome == "fail" for c in checks)),
                       skipped=str(sum(c.outcome == "skip" for c in checks)))
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname=f"steps{c.steps}.concurrency{c.concurrency}", name=c.name)
        if c.outcome == "fail":
            ET.SubElement(case, "failure", message=f"{c.cell} {c.name}: baseline {c.baseline:.4g}, current "
                          f"{c.current:.4g}, limit {c.limit}").text = c.message
        elif c.outcome == "skip":
            ET.SubElement(case, "skipped", message=c.message)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def markdown(checks: list[Check], notes: list[str]) -> str:
    """GitHub-flavoured markdown: verdict line and one table row per check."""
    fails = [c for c in checks if c.outcome == "fail"]
    mark = {"pass": "✅ pass", "fail": "❌ FAIL", "skip": "⏭ skip"}
    lines = [f"## spectune gate: {'❌ ' + str(len(fails)) + ' regression(s)' if fails else '✅ pass'}", "",
             "| cell | check | baseline | current | limit | result | detail |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {c.cell} | {c.name} | {c.baseline:.4g} | {c.current:.4g} | {c.limit} | {mark[c.outcome]} | "
              f"{c.message} |" for c in checks]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes]) + "\n"


METRIC_NAMES = {"status": "failed repeats", "tpot": "TPOT p50 ms", "throughput": "output tokens/s",
                "acceptance": "acceptance length", "slo_attainment": "SLO attainment"}
"""Each check's metric as the summaries name it (acceptance length: tokens per verify step)."""


def metric_label(name: str) -> str:
    """A check's metric as the summaries name it (:data:`METRIC_NAMES`; an unknown name as it is)."""
    return METRIC_NAMES.get(name, name)


def _range(r: tuple[float, float]) -> str:
    lo, hi = r
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    return f"{lo:.4g}" if lo == hi else f"[{lo:.4g}, {hi:.4g}]"


def _change(c: Check) -> str:
    if c.name in ("status", "slo_attainment") or not c.baseline or not math.isfinite(c.baseline) \
            or not math.isfinite(c.current):
        return "-"
    return f"{(c.current - c.baseline) / c.baseline:+.1%}"


def summary_markdown(checks: list[Check], notes: list[str]) -> str:
    """The gate's verdict as GitHub-flavoured Markdown for ``$GITHUB_STEP_SUMMARY``: a ``PASS``/``FAIL`` headline
    with the checks' counts, then one row per check, failures first: cell, metric, baseline and current (medians over
    repeats), their change, the interval the gate compares (the repeats' [min, max] on each side: a regression must
    leave the baseline's), the limit and the verdict. Passing checks sit in a collapsed ``<details>`` block."""
    fails = [c for c in checks if c.outcome == "fail"]
    counts = (f"{len(fails)} failed, {sum(c.outcome == 'pass' for c in checks)} passed, "
              f"{sum(c.outcome == 'skip' for c in checks)} skipped")
    metrics = sorted({metric_label(c.name) for c in fails})
    head = (f"## spectune gate: FAIL ({', '.join(metrics)})" if fails else "## spectune gate: PASS") + "\n\n" + counts
    header = ("| cell | metric | baseline | current | change | interval (repeats' min-max: baseline / current) | "
              "limit | verdict |\n|---|---|---:|---:|---:|---|---|---|")

    def rows(cs: list[Check]) -> str:
        return "\n".join(f"| {c.cell} | {metric_label(c.name)} | {c.baseline:.4g} | {c.current:.4g} | "
                         f"{_change(c)} | {_range(c.baseline_range)} / {_range(c.current_range)} | {c.limit} | "
                         f"{c.outcome.upper()} |" for c in cs)

    parts = [head, ""]
    if fails:
        parts += [header, rows(fails), ""]
    rest = [c for c in checks if c.outcome != "fail"]
    if rest:
        parts += [f"<details><summary>{len(rest)} passed or skipped checks</summary>", "", header, rows(rest), "",
                  "</details>", ""]
    parts += [f"- {n}" for n in notes]
    return "\n".join(parts).rstrip("\n") + "\n"
