"""A bake-off: several configs ruled in one ``spectune validate`` (docs/validate.md, "A bake-off").

Every static num_steps runs once per repeat, on the same prompts and arrival schedule, and each config adds its own
run (``config:NAME``; a config that is one static num_steps K is stood for by ``static:K``,
:attr:`spectune.validate.plan.BakeoffConfig.run`). Each config is then ruled exactly as a validation of that one
config would rule it (:func:`spectune.validate.verdict.verdict`, its phases by
:func:`spectune.validate.phase_check.phase_check`), on a view of the runs in which its run is ``config`` and the
other configs' runs are left out (:func:`config_view`): against the same static runs and so the same best static.
One server-to-server spread serves every interval: measured over all runs of the bake-off
(:func:`spectune.validate.repeats.overall_spread`; each phase's by
:func:`spectune.validate.phase_check.phase_spreads`), with more degrees of freedom than one config's runs give.

The winner (:func:`rule_bakeoff`) is the config with the highest overall output throughput among those whose
verdict is PASS; with none, the best static num_steps wins. validate.json's ``bakeoff`` holds the table
(:class:`BakeoffJson`) and ``verdict`` the overall ruling; :mod:`spectune.validate.bakeoff_table` renders both.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Sequence, TypedDict

from spectune.core.json_types import JsonObject
from spectune.results.primary import Primary
from spectune.results.recommendation_doc import RecordedRecommendation
from spectune.results.validate_doc import ValidateDoc
from spectune.results.validate_run import RunWindow, ValidateRun
from spectune.validate.phase_check import STEADY, PhaseRuling, phase_check, phase_spreads
from spectune.validate.plan import CONFIG_PREFIX
from spectune.validate.prediction import find_recommendation
from spectune.validate.repeats import combine_repeats, overall_spread, throughput_ratio
from spectune.validate.verdict import Verdict, verdict

__all__ = ["BakeoffJson", "config_view", "goodput_req_s", "rule_bakeoff"]

WINDOW_KEYS = ("output_throughput_tok_s", STEADY, "tpot_p50_ms", "tpot_p99_ms", "slo_attainment")
"""The numbers of a window the bake-off table shows (means over repeats), besides ``goodput_req_s``."""


class BakeoffRow(TypedDict, total=False):
    """One row of the bake-off table: a config, or the best static num_steps (``name`` None, ``steps`` its K).

    ``overall`` and each of ``phases`` hold :data:`WINDOW_KEYS` (tok/s, ms, fraction) and ``goodput_req_s``
    (requests meeting the SLOs per s, :func:`goodput_req_s`); a config's ``overall`` adds ``ratio``, ``low`` and
    ``high`` (its output tok/s / the best static's, with the interval, server-to-server spread included; None for
    the best static itself) and each phase ``best_static``, ``ratio``, ``low``, ``high`` and ``ruling``
    (:class:`spectune.validate.phase_check.PhaseRuling`: steady tok/s against that phase's best static).
    ``verdict``: the config's :class:`~spectune.validate.verdict.Verdict` as an object."""

    name: str | None
    run: str
    steps: int | None
    overall: JsonObject
    phases: list[JsonObject]
    verdict: JsonObject


class BakeoffJson(TypedDict):
    """validate.json's ``bakeoff``: the best static row (None when no static run succeeded), per phase the numbers
    of that phase's best static num_steps (``phase_best_static``: highest steady output tok/s, first of equals the
    smaller K, as :func:`spectune.validate.phase_check.phase_check` picks it, with ``steps`` and ``run``; None
    where no static run has one), a row per config in the order given, the winner's name (None: the best static
    wins) and the overall line (as ``verdict.line``)."""

    best_static: BakeoffRow | None
    phase_best_static: list[JsonObject | None]
    configs: list[BakeoffRow]
    winner: str | None
    line: str


def config_view(runs: Sequence[ValidateRun], requests: Sequence[JsonObject],
                run: str) -> tuple[list[ValidateRun], list[JsonObject]]:
    """The runs (validate.json ``runs`` entries) and requests (requests.jsonl objects) of a bake-off as a
    validation of the one config measured by ``run`` would hold them: every static and A/A run, that config's run
    renamed ``config``, the other configs' runs (``config:...``) left out. A ``static:K`` ``run`` (a static config)
    keeps every static run as it is."""
    def keep(name: str) -> bool:
        return not name.startswith(CONFIG_PREFIX) or name == run

    rename = run.startswith(CONFIG_PREFIX)
    return ([replace(r, run="config") if rename and r.run == run else r for r in runs if keep(r.run)],
            [{**q, "run": "config"} if rename and q.get("run") == run else q for q in requests
             if keep(str(q.get("run", "")))])


def goodput_req_s(window: RunWindow) -> float | None:
    """Goodput of one repeat's window: requests sent in it that met the SLOs, per s of the window
    (``slo_attainment`` x ``num_requests`` / (``end_s`` - ``start_s``); vLLM's ``--goodput``, as
    :func:`spectune.loadgen.metrics.compute_metrics` counts ``goodput_req_s``). None without SLOs."""
    att, n = window.slo_attainment, window.num_requests
    length = (window.end_s or 0.0) - (window.start_s or 0.0)
    if att is None or not window.has("num_requests") or length <= 0:
        return None
    return att * n / length


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _numbers(combined: ValidateRun, repeats: Sequence[ValidateRun], phase: int | None) -> JsonObject:
    """:data:`WINDOW_KEYS` of a run's window (``phase`` 0-based, None = overall) from its repeats combined, and
    its goodput averaged over the repeats (``repeats``: its validate.json entries)."""
    def window(r: ValidateRun) -> RunWindow:
        if phase is None:
            return r.overall
        return r.phases[phase] if phase < len(r.phases) else RunWindow.empty()

    w = window(combined)
    out: JsonObject = {k: getattr(w, k) for k in WINDOW_KEYS if phase is not None or k != STEADY}
    if phase is not None:
        out = {"phase": phase + 1, "label": w.label, **out}
    out["goodput_req_s"] = _mean([goodput_req_s(window(r)) for r in repeats if r.ok])
    return out


def _primary(path: str) -> Primary | None:
    """recommendation.json's ``primary`` beside the config file ``path`` (as a validation of that one config reads
    it), or None when there is none or it cannot be read."""
    rec = find_recommendation(path)
    if rec is None:
        return None
    try:
        return RecordedRecommendation.read(rec).recommended
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _row(name: str | None, run: str, combined: list[ValidateRun], runs: Sequence[ValidateRun]) -> BakeoffRow | None:
    """The table row of ``run`` (overall and per phase), None when it has no successful combined entry."""
    entry = next((r for r in combined if r.run == run and r.ok), None)
    if entry is None:
        return None
    repeats = [r for r in runs if r.run == run]
    n = len(entry.phases)
    return {"name": name, "run": run, "steps": entry.steps, "overall": _numbers(entry, repeats, None),
            "phases": [_numbers(entry, repeats, i) for i in range(n)]}


def rule_bakeoff(meta: JsonObject, requests: list[JsonObject]) -> Verdict:
    """Rule a finished bake-off in ``meta`` (validate.json with ``configs`` and ``runs``), in place: the shared
    server-to-server spread (``meta["instance_spread"]``), every config's verdict and table row, the winner
    (``meta["bakeoff"]``, :class:`BakeoffJson`) and the overall verdict (``meta["verdict"]``), which it returns.

    The overall verdict: PASS naming the winner (the passing config with the highest overall output throughput;
    first given of equals) with its own line; else INCONCLUSIVE when some config's verdict is INCONCLUSIVE, else
    FAIL, naming the best static num_steps as the winner. ``requests``: requests.jsonl objects (chunk times)."""
    doc = ValidateDoc.from_json(meta)
    runs, plan = doc.runs, doc.plan
    spread = overall_spread(runs, requests)
    if plan.servers == "kept":
        spread = replace(spread, kept=True)
    meta["instance_spread"] = spread.to_json()
    source = spread.source(within=bool(requests))
    with_slo = plan.with_slo
    concurrencies = plan.workload.concurrencies
    spreads = phase_spreads(runs, requests, concurrencies)
    combined = combine_repeats(runs)
    statics = sorted((r for r in combined if r.run.startswith("static:") and r.ok and r.throughput is not None),
                     key=lambda r: r.steps)
    best = max(statics, key=lambda r: r.throughput or 0.0) if statics else None
    best_row = _row(None, best.run, combined, runs) if best else None
    rows: list[tuple[BakeoffRow, Verdict, float]] = []
    for c in doc.configs:
        run = c.run
        view, view_requests = config_view(runs, requests, run)
        v = verdict(combine_repeats(view), with_slo, plan.tolerance or 0.0,
                    ratio=lambda a, b, view=view, q=view_requests: throughput_ratio(view, q, a, b, spread=spread),
                    recommended=_primary(str(c.path or "")), config_static=c.static, interval_source=source)
        stand = run if c.static else "config"
        row = _row(str(c.name), run, combined, runs) or {"name": str(c.name), "run": run, "steps": None,
                                                         "overall": {}, "phases": []}
        row["verdict"] = asdict(v)
        if best is not None and row["overall"]:
            iv = (throughput_ratio(view, view_requests, stand, best.run, spread=spread)
                  if run != best.run else None)
            bt = best.throughput or 0.0
            row["overall"].update(ratio=(row["overall"]["output_throughput_tok_s"] or 0.0) / bt if bt > 0 else None,
                                  low=iv[0] if iv else None, high=iv[1] if iv else None)
        rulings = {r.phase: r for r in phase_check(view, view_requests, concurrencies=concurrencies,
                                                   config_run=stand, spreads=spreads)}
        for ph in row["phases"]:
            ph.update(_ruling(rulings.get(int(ph["phase"]))))
        ct = next((r.throughput for r in combined if r.run == run and r.ok), None) or 0.0  # the row's overall
        rows.append((row, v, ct))
    winner = max((x for x in rows if x[1].passed), key=lambda x: x[2], default=None)  # first max: first given
    overall = _overall(winner, rows, best, source)
    meta["bakeoff"] = {"best_static": best_row, "phase_best_static": _phase_best(statics, runs),
                       "configs": [r for r, _, _ in rows],
                       "winner": winner[0]["name"] if winner else None, "line": overall.line}
    meta["verdict"] = asdict(overall)
    return overall


def _phase_best(statics: Sequence[ValidateRun], runs: Sequence[ValidateRun]) -> list[JsonObject | None]:
    """``phase_best_static`` (:class:`BakeoffJson`) from the successful static runs, repeats combined and sorted by
    K (``statics``), and every repeat (``runs``)."""
    n = max((len(r.phases) for r in statics), default=0)
    out: list[JsonObject | None] = []
    for i in range(n):
        scored = [(r, r.phases[i].steady_output_throughput_tok_s) for r in statics if len(r.phases) > i]
        scored = [(r, v) for r, v in scored if v is not None]
        if not scored:
            out.append(None)
            continue
        r, _ = max(scored, key=lambda rv: rv[1])  # first max: the smaller K
        out.append({"steps": r.steps, "run": r.run, **_numbers(r, [x for x in runs if x.run == r.run], i)})
    return out


def _ruling(r: PhaseRuling | None) -> JsonObject:
    """A phase row's ruling keys from :func:`spectune.validate.phase_check.phase_check` (all None without one)."""
    if r is None:
        return {"best_static": None, "ratio": None, "low": None, "high": None, "ruling": None}
    return {"best_static": r.best_static, "ratio": r.ratio, "low": r.low, "high": r.high, "ruling": r.ruling}


def _overall(winner: tuple[BakeoffRow, Verdict, float] | None, rows: list[tuple[BakeoffRow, Verdict, float]],
             best: ValidateRun | None, source: str) -> Verdict:
    """The bake-off's overall verdict (:func:`rule_bakeoff`)."""
    if winner is not None:
        row, v, _ = winner
        rest = v.line.split(": ", 1)[1] if ": " in v.line else v.line
        return replace(v, line=f"PASS: {row['name']} wins the bake-off: {rest}")
    if best is None:
        return Verdict(False, "FAIL: no config passes and no static num_steps run succeeded, so nothing wins the "
                              "bake-off", interval_source=source)
    k, bt = best.steps, best.throughput or 0.0
    unsure = [row["name"] for row, v, _ in rows if v.outcome == "INCONCLUSIVE"]
    head = f"no config beats the best static num_steps K={k} ({bt:,.1f} tok/s)"
    if unsure:
        return Verdict(False, f"INCONCLUSIVE: {head}, but {', '.join(map(str, unsure))} "
                              f"{'is' if len(unsure) == 1 else 'are'} behind it only within the noise: more --repeats "
                              "(or longer phases) can decide", k, outcome="INCONCLUSIVE", interval_source=source)
    return Verdict(False, f"FAIL: {head}: the best static wins the bake-off", k, interval_source=source)
