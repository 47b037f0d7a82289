"""What ``spectune validate`` writes and rules: the :class:`Verdict` on the runs (:func:`verdict`), the table cells
of a run (:func:`row_cells`), validate.md (:func:`render_markdown`) and the results folder that holds them with
requests.jsonl and validate.json (:class:`ValidateFolder`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from spectune.core.json_types import JsonObject
from spectune.results.primary import Primary
from spectune.results.validate_doc import ValidateDoc
from spectune.results.validate_run import RunWindow, ValidateRun
from spectune.validate.bakeoff_table import markdown as bakeoff_markdown, subject as bakeoff_subject
from spectune.validate.phase_check import markdown as phase_markdown
from spectune.validate.prediction import markdown as prediction_markdown
from spectune.validate.repeats import AAPair, InstanceSpread, combine_repeats


INCONCLUSIVE_EXIT = 3
"""Exit code of an INCONCLUSIVE verdict (0 PASS, 1 FAIL, 2 bad input): non-zero, so ``spectune validate && deploy``
does not deploy a config the measurement could not show safe, and not 1, so a script can tell "measure more" from
"the config loses"."""

RatioInterval = Callable[[str, str], tuple[float, float] | None]
"""(run name a, run name b) -> (low, high) of the interval of their overall output throughput ratio a / b,
server-to-server spread included (:func:`spectune.validate.repeats.throughput_ratio`), or None when it cannot be
computed."""


@dataclass
class Verdict:
    """The ruling on a validation.

    Attributes:
        passed: the config's overall output throughput >= (1 - tolerance) x the best static's and, with SLOs, its
            SLO attainment over the phases where SLO attainment decides (:func:`slo_phases`) is no lower than that
            static's nor than any static at least as fast as the config (within the tolerance). Where no phase
            qualifies, throughput alone decides. (When the config is or stands for a static num_steps,
            :func:`static_agreement` rules instead.)
        line: one line starting with ``PASS``, ``FAIL`` or ``INCONCLUSIVE`` that says why.
        best_static: K of the static run the line names: the best static (highest overall output throughput;
            ties: smaller K), or the static that meets the SLOs more often.
        margin_pct: (config - that static) / that static x 100, overall output throughput (%); None if unknown.
        ratio_low, ratio_high, confidence: the interval of the ratio the line shows (config / that static, or, when
            the config is static K and was not run, the fastest other static / K).
        decided_by: ``"throughput"`` or ``"throughput and SLO attainment"`` (:func:`slo_phases`).
        slo_phases: 1-based phases whose SLO attainment counted (some static num_steps met the SLOs for most of
            their requests); empty when throughput alone decided.
        recommended_static: K when recommend's primary recommendation was that static num_steps (no per-batch-size
            gain beyond the noise band: :func:`static_agreement` ruled), else None.
        outcome: ``PASS``, ``FAIL`` or ``INCONCLUSIVE``: the config is behind the best static by more than the
            tolerance, but the ratio's interval (server-to-server spread included) reaches 1 - tolerance, so the
            measurement cannot tell a loss from two servers' spread. Exit codes 0, 1, :data:`INCONCLUSIVE_EXIT`.
        interval_source: where the intervals come from (:meth:`spectune.validate.repeats.InstanceSpread.source`).
        config_static: K when the config runs the same rounds as static num_steps K
            (:func:`spectune.validate.plan.static_equivalent`), else None.
    """

    passed: bool
    line: str
    best_static: int | None = None
    margin_pct: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    confidence: float | None = None
    decided_by: str = "throughput"
    slo_phases: list[int] = field(default_factory=list)
    recommended_static: int | None = None
    outcome: str = ""
    interval_source: str | None = None
    config_static: int | None = None

    def __post_init__(self) -> None:
        if not self.outcome:
            self.outcome = "PASS" if self.passed else "FAIL"

    @property
    def exit_code(self) -> int:
        """0 PASS, 1 FAIL, :data:`INCONCLUSIVE_EXIT` INCONCLUSIVE."""
        return 0 if self.passed else INCONCLUSIVE_EXIT if self.outcome == "INCONCLUSIVE" else 1


SLO_DECIDES = 0.5
"""SLO attainment decides a phase only where some static num_steps meets the SLOs for more than this share of the
phase's requests: where none does, which run meets them a few more times is noise (a TPOT SLO that nothing meets
at concurrency 32 ranked 25.0% against 24.4%)."""


def slo_phases(statics: Sequence[ValidateRun]) -> list[int]:
    """0-based indices of the phases where some static run (validate.json ``runs`` entries, repeats combined) has
    ``slo_attainment`` > :data:`SLO_DECIDES`. Runs without ``phases`` count as one phase: their ``overall``."""
    def windows(r: ValidateRun) -> list[RunWindow]:
        return r.phases or [r.overall]

    n = max((len(windows(r)) for r in statics), default=0)
    return [i for i in range(n)
            if any(i < len(windows(r)) and (windows(r)[i].slo_attainment or 0.0) > SLO_DECIDES
                   for r in statics)]


def attainment_over(run: ValidateRun, phases: Sequence[int]) -> float | None:
    """SLO attainment of ``run`` over the requests sent in ``phases`` (0-based; request-weighted mean of the
    phases' attainment, weights ``num_requests``); the ``overall`` one when the run has no ``phases``. None when
    unknown."""
    ws = run.phases
    if not ws:
        return run.overall.slo_attainment
    pairs = [(ws[i].slo_attainment, ws[i].num_requests or 0) for i in phases if i < len(ws)]
    pairs = [(a, n) for a, n in pairs if a is not None]
    total = sum(n for _, n in pairs)
    if not pairs:
        return None
    return sum(a * n for a, n in pairs) / total if total else sum(a for a, _ in pairs) / len(pairs)


def verdict(runs: Sequence[ValidateRun], with_slo: bool, tolerance: float = 0.0, ratio: RatioInterval | None = None,
            confidence: float = 0.95, recommended: Primary | None = None,
            config_static: tuple[int, str] | None = None, interval_source: str | None = None) -> Verdict:
    """Rule on finished runs (validate.json ``runs`` entries, repeats combined: ``run``, ``steps``, ``status``,
    ``error`` and ``overall`` with ``output_throughput_tok_s`` and ``slo_attainment``); see :class:`Verdict`.

    A failed config run, or no successful static run, is a FAIL (nothing shows the config is safe). A config behind
    the best static by more than ``tolerance`` is a FAIL only when the whole interval of config / that static lies
    below 1 - ``tolerance``; when the interval reaches it, INCONCLUSIVE (never a FAIL inside the server-to-server
    spread).

    Args:
        ratio: optional callable (run name a, run name b) -> (low, high) of the interval of their overall
            throughput ratio, server-to-server spread included (:func:`spectune.validate.repeats.throughput_ratio`),
            or None; the line then shows it (``1.031x [0.990, 1.072], 95%``) and ``interval_source``.
        recommended: recommendation.json's ``primary`` beside the config (None: none); when it is a static
            num_steps (recommend predicted no per-batch-size gain) and ``ratio`` is given, :func:`static_agreement`
            rules instead.
        config_static: (K, why) when the config runs the same rounds as static K
            (:func:`spectune.validate.plan.static_equivalent`); with ``ratio``, :func:`static_agreement` rules on
            whether another static beats K (the config run, when there is one, must also not fall behind K).
        interval_source: the intervals' source, named in the line.
    """
    source = f", {interval_source}" if interval_source else ""
    config = next((r for r in runs if r.run == "config"), None)
    statics = sorted((r for r in runs if r.run.startswith("static:") and r.ok and r.throughput is not None),
                     key=lambda r: r.steps)
    static_k = int(config_static[0]) if config_static is not None else None
    extra_all = dict(interval_source=interval_source, config_static=static_k)
    config_ran = config is not None
    if static_k is not None and config is None:  # the config was not run: it is static K
        stands = next((r for r in statics if r.steps == static_k), None)
        if stands is None:
            return Verdict(False, f"FAIL: the config is static K={static_k} ({config_static[1]}), and that static "
                                  "run did not finish, so nothing shows it is safe", **extra_all)
        config = dataclasses.replace(stands, run="config")
    if config is None or not config.ok:
        why = (config.error if config is not None else None) or "it did not run"
        return Verdict(False, f"FAIL: the config run failed ({why})", **extra_all)
    if not statics:
        return Verdict(False, "FAIL: no static num_steps run succeeded, so there is nothing to compare the config "
                              "with", **extra_all)
    best = max(statics, key=_tok_s)  # first max: the smaller K
    rec_k = recommended.static if recommended is not None else None
    if ratio is not None and (static_k is not None or rec_k is not None):
        k = static_k if static_k is not None else rec_k
        agreed = static_agreement(statics, best, config if config_ran else None, k, ratio, confidence, tolerance,
                                  recommended=rec_k == k, config_static=config_static, source=interval_source)
        if agreed is not None:
            return agreed
    k, bt = best.steps, _tok_s(best)
    ct = config.throughput or 0.0
    margin = (ct - bt) / bt * 100.0 if bt > 0 else 0.0
    iv = ratio("config", best.run) if ratio is not None and bt > 0 else None
    point = ct / bt if bt > 0 else 0.0
    span = f"config / K={k} {point:.3f}x [{iv[0]:.3f}, {iv[1]:.3f}], {confidence:.0%}{source}" if iv else ""
    extra = dict(ratio_low=iv[0], ratio_high=iv[1], confidence=confidence) if iv else {}
    extra.update(extra_all)
    if ct < bt * (1.0 - tolerance):
        if iv is not None and iv[1] >= 1.0 - tolerance:
            reach = "1" if tolerance == 0 else f"{1.0 - tolerance:.3g} (1 - --tolerance)"
            return Verdict(False, f"INCONCLUSIVE: the config is {-margin:.1f}% behind static K={k} in output "
                                  f"throughput ({ct:,.1f} vs {bt:,.1f} tok/s), but the interval reaches {reach}: "
                                  f"{span}; the measurement cannot tell that from its noise (requests, and two "
                                  "servers' own speeds): more --repeats (or longer phases) can decide; decided by "
                                  "throughput", k, margin, outcome="INCONCLUSIVE", **extra)
        return Verdict(False, f"FAIL: static K={k} beats the config by {-margin:.1f}% in output throughput "
                              f"({bt:,.1f} vs {ct:,.1f} tok/s){'; ' + span if span else ''}; decided by throughput",
                       k, margin, **extra)
    span = f"; {span}" if span else ""
    slo_note, decided, counted = "", "throughput", []
    if with_slo:
        counted = slo_phases(statics)
        if not counted:
            slo_note = ("; SLO attainment did not count: no static num_steps met the SLOs for most of any phase's "
                        "requests")
    if counted:
        ca = attainment_over(config, counted)
        # the best static, and every static at least as fast as the config (throughput ties are common in open loop)
        rivals = [r for r in statics if r is best or _tok_s(r) >= ct * (1.0 - tolerance)]
        scored = [(r, attainment_over(r, counted)) for r in rivals]
        scored = [(r, a) for r, a in scored if a is not None]
        where = _phase_list(counted, config)
        if scored and ca is not None:
            decided = "throughput and SLO attainment"
            top, ta = max(scored, key=lambda ra: ra[1])  # first max: the smaller K
            if ca < ta:
                tm = (ct - _tok_s(top)) / _tok_s(top) * 100
                return Verdict(False, f"FAIL: static K={top.steps} meets the SLOs more often than the config "
                                      f"({ta:.1%} vs {ca:.1%}, {(ta - ca) * 100:.1f} points{where}) at {tm:+.1f}% "
                                      "throughput" + span, top.steps, tm, decided_by=decided,
                               slo_phases=[i + 1 for i in counted], **extra)
            slo_note = f"; SLO attainment {ca:.1%} vs {ta:.1%} (K={top.steps}{where})"
    return Verdict(True, f"PASS: the config delivers {ct:,.1f} tok/s, {margin:+.1f}% vs the best static num_steps "
                         f"K={k} ({bt:,.1f} tok/s){slo_note}{span}; decided by {decided}", k, margin,
                   decided_by=decided, slo_phases=[i + 1 for i in counted] if decided != "throughput" else [], **extra)


def static_agreement(statics: Sequence[ValidateRun], best: ValidateRun, config: ValidateRun | None, k: int,
                     ratio: RatioInterval, confidence: float, tolerance: float, recommended: bool = True,
                     config_static: tuple[int, str] | None = None, source: str | None = None) -> Verdict | None:
    """The ruling when a static num_steps ``k`` is the claim: recommend's primary recommendation (``recommended``:
    it found no batch-size slot where another num_steps beats K=k beyond the noise band), or the config itself
    (``config_static`` = (k, why): it runs the same rounds as static K=k). The config can then only tie K=k, and
    "the config beats every static" is not the claim to test. Agreed (PASS) when (1) no static num_steps beats K=k
    (the interval of static / K=k does not lie wholly above 1 / (1 - ``tolerance``)) and (2) a config that was run
    does not fall behind K=k (config / K=k does not lie wholly below 1 - ``tolerance``); otherwise FAIL naming
    which. ``config``: the config run (repeats combined), or None when the config was not run (it is static K=k).
    ``ratio(a, b)``: the interval of run a / run b, server-to-server spread included
    (:func:`spectune.validate.repeats.throughput_ratio`); ``source``: where it comes from, named in the line.
    Returns None when K=k was not run or an interval cannot be computed (the ordinary rule then applies)."""
    rec = next((r for r in statics if r.steps == k), None)
    if rec is None:
        return None
    rt = _tok_s(rec)
    if rt <= 0:
        return None
    src = f", {source}" if source else ""
    ran = config is not None
    ct = (config.throughput or 0.0 if config is not None else 0.0) if ran else rt
    iv = ratio("config", rec.run) if ran else None
    if ran and iv is None:
        return None
    others = [(r, ratio(r.run, rec.run)) for r in sorted(statics, key=lambda r: -_tok_s(r)) if r is not rec]
    runner = next(((r, o) for r, o in others if o is not None), None)
    if not ran and others and runner is None:
        return None
    shown = iv if ran else (runner[1] if runner else None)
    extra = dict(confidence=confidence, recommended_static=k if recommended else None,
                 interval_source=source, config_static=config_static[0] if config_static else None)
    if shown is not None:
        extra.update(ratio_low=shown[0], ratio_high=shown[1])
    is_static = f"the config is static K={k} ({config_static[1]})" if config_static else ""
    if recommended:
        head = f"agrees with recommend, which named static K={k} (no per-batch-size gain beyond the noise band)"
        head += f", and {is_static}" if is_static else ""
        claim = f"recommend named static K={k} (no per-batch-size gain)"
    else:
        head = claim = is_static
    for r, other in others:
        if other is not None and other[0] > 1.0 / (1.0 - tolerance):
            ot = _tok_s(r)
            return Verdict(False, f"FAIL: {claim}, but static K={r.steps} beats it: {ot / rt:.3f}x [{other[0]:.3f}, "
                                  f"{other[1]:.3f}], {confidence:.0%}{src} ({ot:,.1f} vs {rt:,.1f} tok/s); decided by "
                                  "throughput", r.steps, (ct - ot) / ot * 100.0,
                           **{**extra, "ratio_low": other[0], "ratio_high": other[1]})
    if ran:
        margin = (ct - rt) / rt * 100.0
        span = f"config / K={k} {ct / rt:.3f}x [{iv[0]:.3f}, {iv[1]:.3f}], {confidence:.0%}{src}"
        if iv[1] < 1.0 - tolerance:
            return Verdict(False, f"FAIL: the config falls behind static K={k}, the num_steps it stands for: {span} "
                                  f"({ct:,.1f} vs {rt:,.1f} tok/s); decided by throughput", k, margin, **extra)
        lead = "" if best is rec else f"; K={best.steps} measured {_tok_s(best):,.1f} tok/s, not beyond the interval"
        return Verdict(True, f"PASS: {head}: no static num_steps beats K={k} ({rt:,.1f} tok/s{lead}) and the config "
                             f"{'runs ahead of' if iv[0] > 1.0 else 'ties'} it, {ct:,.1f} tok/s, {span}; decided by "
                             "throughput", k, margin, **extra)
    bt = _tok_s(best)
    margin = (rt - bt) / bt * 100.0 if bt > 0 else 0.0
    near = ""
    if runner is not None:
        r, o = runner
        near = (f"; the fastest other, K={r.steps}: {_tok_s(r):,.1f} tok/s, "
                f"K={r.steps} / K={k} {_tok_s(r) / rt:.3f}x [{o[0]:.3f}, {o[1]:.3f}], "
                f"{confidence:.0%}{src}")
    return Verdict(True, f"PASS: {head}, so it was not run again: no static num_steps beats K={k} ({rt:,.1f} tok/s"
                         f"{near}); decided by throughput", k, margin, **extra)


def spread_line(spread: JsonObject | None, confidence: float | None) -> str | None:
    """One terminal line on the server-to-server spread of validate.json's ``instance_spread`` (``spread``; None
    without it): the A/A pair's ratio and band, the spread over the repeats, or the default band. ``confidence``:
    the verdict's (None: 0.95)."""
    sp = InstanceSpread.from_json(spread)
    if sp is None:
        return None
    conf = confidence or 0.95
    if sp.kind == "aa":
        a = sp.aa or AAPair()
        iv = f"{a.interval}, {conf:.0%}" if a.interval else ""
        return (f"A/A: static K={a.steps} on two fresh servers (aa:{a.steps} / static:{a.steps}) "
                f"{a.ratio:.3f}x{iv}; instance band {sp.band:.1%}, added to every interval")
    if sp.kind == "repeats":
        hw = sp.half_width(sp.repeats, sp.repeats, conf)
        what = ("run-to-run (servers kept up; two processes of one server not compared)" if sp.kept
                else "server-to-server")
        return (f"{what}: sd {sp.sd:.1%} of one server's output tok/s over {sp.repeats} repeats "
                f"({sp.df} df): +-{math.expm1(hw):.1%} on a ratio of two runs ({conf:.0%}), added to every interval")
    if sp.kind == "default":
        return (f"server-to-server: not measured here (one repeat, no A/A pair): the default instance band "
                f"{sp.band:.1%} is added to every interval")
    return None


def spread_markdown(doc: ValidateDoc) -> list[str]:
    """validate.md's "Server-to-server spread" section (nothing without ``instance_spread``)."""
    line = spread_line(doc.instance_spread, doc.verdict.confidence if doc.verdict is not None else None)
    if line is None:
        return []
    sp = InstanceSpread.from_json(doc.instance_spread)
    how = {"aa": "With one repeat, a second fresh server of one static num_steps (run `aa:K`) ran beside `static:K`; "
                 "the band is the far end of their ratio's interval from 1, and every interval below is widened by it "
                 "on both sides.",
           "repeats": ("The servers were kept up through all repeats (`--servers kept`), so two processes of one "
                       "server were never compared; " if sp is not None and sp.kept else
                       "Every repeat starts its servers afresh; ")
                      + "the spread is the standard deviation of ln(output tok/s) of one server: "
                      + ("the residual of runs x repeats, after each run's mean and each repeat's common shift (the "
                         "machine's drift between repeats, which cancels in a ratio of two runs over the same repeats)"
                         if sp is not None and sp.blocked else
                         "each run's repeats around the run's mean, pooled over the runs")
                      + ", and every interval below adds it as a Student t term with those degrees of freedom.",
           "default": "This validation measured no spread (one repeat and no A/A run): every interval below is "
                      "widened by the default band, from two engines on a 2-vCPU VM (docs/engine.md)."}
    return ["## Server-to-server spread", "", f"{line}.", "", how.get(sp.kind if sp else "", ""),
            "A ratio whose interval reaches the threshold is INCONCLUSIVE, never FAIL (docs/validate.md).", ""]


def _tok_s(run: ValidateRun) -> float:
    """The overall output tokens/s of a run known to have one (a successful static run)."""
    return float(run.throughput or 0.0)


def _phase_list(counted: Sequence[int], config: ValidateRun) -> str:
    """``", phases 1, 3"`` when SLO attainment counted in only some phases of a multi-phase run, else ``""``."""
    n = len(config.phases)
    if n <= 1 or len(counted) == n:
        return ""
    return f", phase{'s' if len(counted) > 1 else ''} {', '.join(str(i + 1) for i in counted)}"


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def row_cells(d: RunWindow) -> list[str]:
    """Table cells of one run in one window: output tok/s, TPOT p50/p99 (ms), SLO attainment, acceptance length,
    num_steps switches, achieved concurrency, requests (failed)."""
    slo = d.slo_attainment
    return [_f(d.output_throughput_tok_s, ",.1f"), _f(d.tpot_p50_ms, ".2f"), _f(d.tpot_p99_ms, ".2f"),
            "-" if slo is None else f"{slo:.1%}", _f(d.acceptance_length, ".2f"), _f(d.num_steps_switches, ".0f"),
            _f(d.achieved_concurrency, ".1f"), f"{d.num_requests} ({d.num_failed})"]


ROW_HEADERS = ("output tok/s", "TPOT p50 ms", "TPOT p99 ms", "SLO attainment", "acceptance length",
               "num_steps switches", "achieved concurrency", "requests (failed)")


_HELD = {"together": ", each repeat's servers up at once (`--servers together`)",
         "kept": ", the servers started once and kept up through all of them (`--servers kept`)"}
"""validate.md's words for ``plan.servers`` other than ``one``."""


def _runs_sentence(repeats: int, servers: str) -> str:
    """The end of validate.md's first paragraph: the repeats and how the servers were held (``plan.servers``)."""
    held = _HELD.get(servers, "")
    if repeats > 1:
        return f"; {repeats} repeats in alternating order{held}, tables show means."
    return f"; the servers up at once (`--servers {servers}`)." if held else "."


def render_markdown(meta: JsonObject) -> str:
    """validate.md: the verdict (a bake-off's table after it: :func:`spectune.validate.bakeoff_table.markdown`),
    the preflight warnings (``meta["warnings"]``: e.g. a server that will not run the
    config as given), an overall table and a table per phase (a row per run, means over repeats; ``*`` = best
    tok/s), and with repeats the overall output tok/s of every repeat."""
    doc = ValidateDoc.from_json(meta)
    plan, cfg, raw = doc.plan, doc.config, doc.runs
    runs = combine_repeats(raw)
    repeats = int(plan.repeats or 1)
    wl = plan.workload
    lines = ["# spectune validate", "",
             (bakeoff_subject(doc) or f"Config `{cfg.path}` ({cfg.format}, candidate steps "
              f"{', '.join(map(str, cfg.candidate_steps or []))})") + " against static num_steps "
             f"{', '.join(map(str, plan.steps or []))}; workload `{wl.name}` "
             f"({len(wl.phases)} phases, {_f(wl.total_s, 'g')} s); dataset {plan.dataset}, "
             f"max_tokens {plan.max_tokens}, temperature {plan.temperature}; "
             f"SLOs TTFT {plan.slo_ttft_ms or '-'} ms, TPOT {plan.slo_tpot_ms or '-'} ms"
             + _runs_sentence(repeats, str(plan.servers)), ""]
    same = cfg.static
    if same:
        lines += [f"The config runs the same rounds as static num_steps {same[0]} ({same[1]})"
                  + (", so it was not run as a run of its own." if not doc.ran("config") else "."), ""]
    v = doc.verdict
    lines += [f"**{v.line}**" if v else f"Status: {doc.status} (no verdict yet)", ""]
    lines += bakeoff_markdown(doc)
    if doc.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in doc.warnings] + [""]
    lines += spread_markdown(doc)

    lines += phase_markdown(doc)
    lines += prediction_markdown(doc.prediction)

    def table(title: str, pick: Callable[[ValidateRun], RunWindow | None]) -> None:
        rows = [(r, pick(r)) for r in runs]
        best = max((d.output_throughput_tok_s or 0.0 for r, d in rows if d and r.ok), default=None)
        lines.extend([f"## {title}", "", "| run | " + " | ".join(ROW_HEADERS) + " |",
                      "|" + " --- |" * (len(ROW_HEADERS) + 1)])
        for r, d in rows:
            if not r.ok and not d:
                lines.append(f"| {r.run} | failed: {r.error or ''} |" + " |" * (len(ROW_HEADERS) - 1))
                continue
            cells = row_cells(d or RunWindow.empty())
            if best and d and d.output_throughput_tok_s == best:
                cells[0] += " *"
            status = "" if r.ok else " (failed)"
            lines.append(f"| {r.run}{status} | " + " | ".join(cells) + " |")
        lines.append("")

    table("Overall", lambda r: r.overall)
    if repeats > 1:
        lines += ["## Output tok/s per repeat", "", "| run | " + " | ".join(f"#{i + 1}" for i in range(repeats))
                  + " |", "|" + " --- |" * (repeats + 1)]
        for r in runs:
            values = r.throughput_by_repeat or [r.throughput]
            lines.append(f"| {r.run} | " + " | ".join(_f(v, ",.1f") for v in values) + " |")
        lines += ["", "Execution order: " + ", ".join(f"{r.run} #{r.repeat}" for r in raw), ""]
    for i, ph in enumerate(wl.phases):
        title = f"Phase {ph.phase}: {ph.label} ({ph.start_s:g}-{ph.end_s:g} s)"
        table(title, lambda r, i=i: r.phases[i] if len(r.phases) > i else None)
    lines += ["Output tok/s counts the tokens streamed inside each window; TPOT, SLO attainment and requests are "
              "over the requests sent in it; acceptance length and switches are counter deltas over the window.", ""]
    return "\n".join(lines)
