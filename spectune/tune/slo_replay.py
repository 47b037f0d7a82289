"""Policies the sweep did not serve, priced by replaying a trace (``spectune recommend --slo-tpot-ms MS --trace
FILE``, docs/recommend.md "Goodput under a TPOT SLO").

The sweep's cells price only what it served (static num_steps, the schedule, its ``p-min/P/`` servers). A trace
recorded by the bundled engine (``--trace``) lets every per-row policy of ``spectune simulate --policy all`` be
replayed on the same rounds (:func:`spectune.tune.policy_report.compare`: static K, the p_min and SpecDec++ grids,
SGLang's EMA, SpecServe at the SLO, the oracles), with round times from the sweep's own cells
(:class:`spectune.tune.step_time.CellStepTime`) and goodput under the TPOT SLO as simulate defines it: the predicted
output tok/s of rows whose TPOT in their round is within the SLO (:mod:`spectune.tune.policy_replay`). These are
predictions over decode rounds at the trace's batch sizes, not measurements, so they are ranked apart from the
measured answers: the best replayed policy is named when its predicted goodput beats the best replayed static
num_steps beyond the noise band (a replay has no sampling interval: the band is the measured ranking's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.backends.num_steps.trace import read_trace
from spectune.tune.policy_replay import PolicyResult
from spectune.tune.policy_report import compare

FAMILY_ORDER = ("static", "p_min", "specdec", "specdec-raw", "ema", "specserve")
"""Replayed kinds shown, in order (the best value of each threshold family)."""


@dataclass
class ReplayGoodput:
    """The replayed ranking (recommendation.json ``slo_goodput.replay``).

    Attributes:
        trace: the trace file as given.
        rows: (policy label, predicted goodput tok/s, predicted SLO attainment, predicted tok/s): every static K,
            the best value of each other family, and ``oracle-capped`` for reference.
        best_static, best_policy: labels of the best replayed static num_steps and the best other policy.
        policy_wins: the best policy's goodput beats the best static's beyond the band.
        reason: one sentence.
    """

    trace: str
    rows: list[tuple[str, float, float, float]]
    best_static: str | None
    best_policy: str | None
    policy_wins: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        """For recommendation.json."""
        return {"trace": self.trace, "policies": [{"policy": p, "goodput_tok_s": g, "slo_attainment": a,
                                                   "tok_s": t} for p, g, a, t in self.rows],
                "best_static": self.best_static, "best_policy": self.best_policy, "policy_wins": self.policy_wins,
                "reason": self.reason}


def _goodput(r: PolicyResult) -> float:
    g = r.overall.goodput_tok_s
    return g if g is not None else math.nan


def replay_goodput(trace: Path, sweep: Path, slo_tpot_ms: float, band: float) -> ReplayGoodput:
    """Replay ``--policy all`` on ``trace`` timed by ``sweep``'s cells and rank by goodput under ``slo_tpot_ms``
    (module docstring).

    Raises:
        UserError: an unreadable trace, a sweep without round times (:func:`spectune.tune.step_time.
            cells_step_time`).
    """
    cmp = compare(read_trace(trace), ["all"], sweep=sweep, slo_tpot_ms=slo_tpot_ms)
    results = [r for r in cmp.results if math.isfinite(_goodput(r))]
    statics = [r for r in results if r.spec.kind == "static"]
    others = [r for r in results if r.spec.kind in FAMILY_ORDER[1:]]
    shown = list(statics)
    for kind in FAMILY_ORDER[1:]:
        fam = [r for r in others if r.spec.kind == kind]
        if fam:
            shown.append(max(fam, key=_goodput))
    shown += [r for r in results if r.spec.kind == "oracle-capped"]
    rows = [(r.spec.label, _goodput(r), float(r.overall.slo_attainment or 0.0), float(r.overall.tok_s or 0.0))
            for r in shown]
    top_static = max(statics, key=_goodput) if statics else None
    top_policy = max(others, key=_goodput) if others else None
    wins = top_static is not None and top_policy is not None and \
        _goodput(top_policy) > _goodput(top_static) * (1 + band)
    if top_static is None or top_policy is None:
        reason = "the replay priced no static num_steps or no other policy"
    else:
        ratio = _goodput(top_policy) / _goodput(top_static) if _goodput(top_static) > 0 else math.inf
        said = (f"the replayed {top_policy.spec.label} ({_goodput(top_policy):.4g} tok/s predicted) is {ratio:.3f}x "
                f"the best replayed static num_steps ({top_static.spec.label}, {_goodput(top_static):.4g})")
        reason = said + (f", beyond the {band:.1%} noise band" if wins else
                         f": no replayed policy beats it beyond the {band:.1%} noise band")
    return ReplayGoodput(str(trace), rows, top_static.spec.label if top_static else None,
                         top_policy.spec.label if top_policy else None, wins, reason)
