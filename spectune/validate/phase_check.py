"""The config against each phase's best static num_steps, on the phases' steady windows.

The overall verdict (:func:`spectune.validate.verdict.verdict`) asks whether the config beats every static num_steps
over the whole run. A per-batch-size config must also hold each phase: at concurrency 1 it should run like the best
num_steps for concurrency 1, at 32 like the best for 32. :func:`phase_check` compares, in every phase, the config's
steady output tok/s (:func:`spectune.validate.phases.summarize_run`: the tokens streamed after the spill-over of
the earlier phases ended, so a slow engine's backlog does not count as speed) with the best static run's, with the
interval of their ratio (:func:`spectune.validate.repeats.paired_ratio`: the requests sent in the phase resampled
by prompt, the same draws for both runs, the mean over the repeats, plus the phase's own server-to-server spread,
:func:`phase_spreads`). When the config runs the same rounds as a static num_steps K and was not run, static K
stands in for it (``config_run``).

Each phase gets one of three rulings, for a tolerance ``within`` (3% by default):

- ``holds``: the config's steady tok/s is at least (1 - within) x the best static's;
- ``noise``: it is lower, but the ratio's interval reaches 1 - within: the phase cannot tell them apart;
- ``behind``: the interval lies wholly below 1 - within (or none could be computed): the config lost that phase.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Sequence, TypedDict

from spectune.core.json_types import JsonObject, JsonValue
from spectune.results.validate_doc import ValidateDoc
from spectune.results.validate_run import ValidateRun
from spectune.validate.repeats import (InstanceSpread, InstanceSpreadJson, WindowValue, combine_repeats,
                                       instance_spread, paired_ratio)

if TYPE_CHECKING:
    from spectune.results.confidence import RunRequests

WITHIN = 0.03
"""Default tolerance of a phase: the config within 3% of the phase's best static num_steps."""

STEADY = "steady_output_throughput_tok_s"


@dataclass
class PhaseRuling:
    """One phase of :func:`phase_check`.

    Attributes:
        phase: 1-based. label: the phase's load (``c=32``).
        best_static: K of the static run with the highest steady output tok/s in the phase (ties: smaller K).
        best_tok_s, config_tok_s: steady output tok/s (tokens/s) of that static run and of the config (means over
            repeats).
        ratio: config / best; low, high: its interval, the phase's server-to-server spread included (None when it
            cannot be computed).
        settle_s: s from the phase's start until the earlier phases' spill-over ended, config run (mean).
        ruling: ``holds``, ``noise`` or ``behind`` (module docstring).
        spread: the phase's server-to-server spread
            (:meth:`spectune.validate.repeats.InstanceSpread.to_json`), or None.
    """

    phase: int
    label: str
    best_static: int
    best_tok_s: float
    config_tok_s: float
    ratio: float
    low: float | None
    high: float | None
    settle_s: float | None
    ruling: str
    spread: InstanceSpreadJson | None = None

    @classmethod
    def from_json(cls, obj: JsonObject) -> PhaseRuling:
        """A ruling as validate.json's ``phase_check.phases`` holds it (:func:`to_json`)."""
        return cls(**obj)  # type: ignore[arg-type]


@dataclass
class PhaseCheck:
    """validate.json's ``phase_check`` read back (:func:`to_json` wrote it): the tolerance ``within`` (fraction),
    the summary ``line`` (None in a file without one) and the ``phases``' rulings."""

    within: float = WITHIN
    line: str | None = None
    phases: list[PhaseRuling] = field(default_factory=list)

    @classmethod
    def from_json(cls, obj: JsonValue) -> PhaseCheck:
        """The record of a ``phase_check`` object (a key it lacks: the default; None: no rulings)."""
        if not isinstance(obj, dict):
            return cls()
        check = cls(**{k: v for k, v in obj.items() if k in _CHECK_KEYS})  # type: ignore[arg-type]
        check.phases = [PhaseRuling.from_json(r) for r in check.phases or []]  # type: ignore[arg-type]
        return check


_CHECK_KEYS = ("within", "line", "phases")


class PhaseCheckJson(TypedDict):
    """:func:`to_json`: validate.json's ``phase_check``: the tolerance (fraction), :func:`summary_line` and per
    phase the :class:`PhaseRuling` as an object (``dataclasses.asdict``)."""

    within: float
    line: str
    phases: list[JsonObject]


def _steady(i: int) -> WindowValue:
    def steady(run: ValidateRun) -> float | None:
        return run.phases[i].steady_output_throughput_tok_s if len(run.phases) > i else None
    return steady


def _closed(concurrencies: Sequence[int | None] | None, i: int) -> bool:
    return concurrencies is not None and i < len(concurrencies) and concurrencies[i] is not None


def phase_spreads(runs: Sequence[ValidateRun], requests: Sequence[JsonObject],
                  concurrencies: Sequence[int | None] | None = None,
                  confidence: float = 0.95) -> list[InstanceSpread]:
    """The server-to-server spread of each phase's steady output tok/s
    (:func:`spectune.validate.repeats.instance_spread`: over the repeats, else from the A/A pair, else the default
    band), one per phase of the runs (the most phases any run has); ``concurrencies`` as :func:`phase_check`."""
    n = max((len(r.phases) for r in runs), default=0)
    return [instance_spread(runs, requests, _steady(i), lambda run, qs, i=i: window_requests(run, qs, i),
                            "throughput" if _closed(concurrencies, i) else "tokens", confidence) for i in range(n)]


def phase_check(runs: Sequence[ValidateRun], requests: Sequence[JsonObject], within: float = WITHIN,
                confidence: float = 0.95, concurrencies: Sequence[int | None] | None = None,
                config_run: str = "config", spreads: Sequence[InstanceSpread] | None = None) -> list[PhaseRuling]:
    """Rule every phase (module docstring).

    Args:
        runs: validate.json ``runs`` entries, one per repeat, whose ``phases`` carry
            ``steady_output_throughput_tok_s`` (runs measured before that field existed give no rulings).
        requests: requests.jsonl objects (``run``, ``repeat``, ``prompt_id``, ``send_time``, ``end_time``,
            ``chunk_times``, ``chunk_tokens``); runs need their ``t0``.
        within: the phase tolerance (fraction). confidence: of the intervals.
        concurrencies: each phase's closed-loop concurrency, None for an open-loop phase (the plan's workload);
            without them every phase counts as open loop.
        config_run: the run that stands for the config: ``config``, or ``static:K`` when the config is static K
            and was not run.
        spreads: each phase's server-to-server spread (:func:`phase_spreads`); None: computed here.

    Returns:
        one ruling per phase where the config and at least one static run have a steady tok/s; [] otherwise.
    """
    combined = combine_repeats(runs)
    config = next((r for r in combined if r.run == config_run and r.ok), None)
    statics = sorted((r for r in combined if r.run.startswith("static:") and r.ok), key=lambda r: r.steps)
    if config is None or not statics:
        return []
    out = []
    for i, cp in enumerate(config.phases):
        steady = _steady(i)
        ct = steady(config)
        scored = [(r, steady(r)) for r in statics if steady(r) is not None]
        if ct is None or not scored:
            continue
        best, bt = max(scored, key=lambda rv: rv[1])  # first max: the smaller K
        if bt <= 0:
            continue
        closed = _closed(concurrencies, i)
        select = lambda run, qs, i=i: window_requests(run, qs, i)  # noqa: E731
        spread = spreads[i] if spreads is not None and i < len(spreads) else instance_spread(
            runs, requests, steady, select, "throughput" if closed else "tokens", confidence)
        iv = paired_ratio(runs, requests, config_run, best.run, steady, select, confidence,
                          "throughput" if closed else "tokens", spread=spread)
        ratio = ct / bt
        if ratio >= 1.0 - within:
            ruling = "holds"
        elif iv is not None and iv[1] >= 1.0 - within:
            ruling = "noise"
        else:
            ruling = "behind"
        out.append(PhaseRuling(i + 1, cp.label or "", best.steps, bt, ct, ratio,
                               iv[0] if iv else None, iv[1] if iv else None, cp.settle_s, ruling,
                               spread.to_json()))
    return out


def window_requests(run: ValidateRun, requests: Sequence[JsonObject], phase: int) -> RunRequests | None:
    """The requests of one run and repeat as they were inside the steady window of ``phase`` (0-based): per request
    the tokens streamed in [t0 + start_s + settle_s, t0 + end_s) and the time it was in flight there (ms, as
    ``latency_ms``); requests with no time there are left out. None when the run has no ``t0``, the phase no
    settle time, or no request was in flight there."""
    import numpy as np

    from spectune.results.confidence import RunRequests

    phases = run.phases
    if run.t0 is None or phase >= len(phases) or phases[phase].settle_s is None:
        return None
    p = phases[phase]
    lo, hi = run.t0 + p.start_s + (p.settle_s or 0.0), run.t0 + p.end_s
    prompt, tokens, times = [], [], []
    for q in requests:
        times_q, toks_q = q.get("chunk_times") or [], q.get("chunk_tokens") or []
        if q.get("error") is not None or not isinstance(times_q, list) or not times_q:
            continue
        end = q.get("end_time") if q.get("end_time") is not None else times_q[-1]
        inside = min(end, hi) - max(q["send_time"], lo)
        if inside <= 0:
            continue
        prompt.append(q.get("prompt_id"))
        tokens.append(float(sum(n for t, n in zip(times_q, toks_q) if lo <= t < hi)))
        times.append(inside * 1000.0)
    if not prompt:
        return None
    n = len(prompt)
    return RunRequests(prompt, np.array(tokens), np.array(times), np.full(n, np.nan), np.zeros(n, bool))


def summary_line(rulings: Sequence[PhaseRuling], within: float = WITHIN) -> str:
    """One line: how many phases hold, and which do not (``"3 of 4 phases within 3% of their best static ..."``)."""
    if not rulings:
        return "no per-phase steady numbers (runs measured before steady windows existed)"
    held = [r for r in rulings if r.ruling == "holds"]
    text = f"{len(held)} of {len(rulings)} phases within {within:.0%} of their best static num_steps (steady windows)"
    rest = [f"phase {r.phase} {r.ruling} ({r.ratio:.3f}x K={r.best_static})" for r in rulings if r.ruling != "holds"]
    return text + (": " + ", ".join(rest) if rest else "")


def to_json(rulings: Sequence[PhaseRuling], within: float = WITHIN) -> PhaseCheckJson:
    """validate.json's ``phase_check``: the tolerance, the summary line and the rulings."""
    return {"within": within, "line": summary_line(rulings, within), "phases": [asdict(r) for r in rulings]}


def markdown(doc: ValidateDoc) -> list[str]:
    """validate.md's section for validate.json's ``phase_check`` (empty without it): a row per phase with every
    run's steady output tok/s, the best static, config / best with its interval, the settle time and the ruling."""
    check = PhaseCheck.from_json(doc.phase_check)
    rulings = check.phases
    if not rulings:
        return []
    runs = combine_repeats(doc.runs)
    names = [r.run for r in runs if r.ok]
    by_name = {r.run: r for r in runs}
    lines = [f"## Each phase: the config vs that phase's best static num_steps", "",
             f"{check.line}. Steady output tok/s: the tokens streamed after the earlier phases' requests "
             "ended (their spill-over would credit a slow engine's backlog as speed; `settled` is how long it took "
             f"in the config run); `holds` = within {check.within:.0%}, `noise` = behind by more but "
             "the 95% interval (the phase's server-to-server spread included: `spread`) reaches it, `behind` = the "
             "interval lies below it.", "",
             "| phase | " + " | ".join(names) + " | best static | config / best [95%] | spread | settled s | ruling |",
             "|" + " --- |" * (len(names) + 6)]
    for r in rulings:
        steady = _steady(r.phase - 1)
        cells = []
        for n in names:
            v = steady(by_name[n])
            cells.append("-" if v is None else f"{v:,.1f}")
        iv = f" [{r.low:.3f}, {r.high:.3f}]" if r.low is not None else ""
        settle = "-" if r.settle_s is None else f"{r.settle_s:.1f}"
        spread = InstanceSpread.from_json(r.spread)
        lines.append(f"| {r.phase}: {r.label} | " + " | ".join(cells) +
                     f" | K={r.best_static} | {r.ratio:.3f}x{iv} | {spread.short() if spread else '-'} | "
                     f"{settle} | {r.ruling} |")
    return lines + [""]
