"""``spectune simulate --policy``: replay draft-length policies on a trace, pick the best value per batch size, and
print or write the comparison (rich tables, ``--json``). The replay is :mod:`spectune.tune.policy_replay`, the
policies :mod:`spectune.tune.draft_policies`, the round times :mod:`spectune.tune.step_time`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from spectune.backends.num_steps.sglang_config import load_config_file
from spectune.backends.num_steps.throughput_policy import CostTable
from spectune.backends.num_steps.trace import TraceStep
from spectune.core.json_types import JsonObject
from spectune.core.errors import UserError
from spectune.tune.draft_policies import PolicySpec, parse_policies, trace_arrays
from spectune.tune.policy_replay import FAMILIES, PolicyResult, best_per_batch, evaluate
from spectune.tune.step_time import StepTimeModel, cells_step_time, fit_trace_step_time, trace_draft_step

EXACTNESS = ("Accepted drafts under a policy are min(recorded accepted, drafted length): exact for greedy chain "
             "drafting except rows given more drafts than they drafted and all accepted (a lower bound, counted).")


@dataclass
class Comparison:
    """What ``simulate --policy`` found.

    Attributes:
        results: every replayed policy, in order.
        best: family -> batch size -> the best policy there (:func:`spectune.tune.policy_replay.best_per_batch`).
        model: the step-time model, or None.
        rounds, rows: verify steps and row-rounds in the trace.
        notes: lines printed under the tables.
        slo_tpot_ms: the TPOT SLO (ms) of the policies' SLO attainment and goodput, or None.
    """

    results: list[PolicyResult]
    best: dict[str, dict[int, PolicyResult]]
    model: StepTimeModel | None
    rounds: int
    rows: int
    notes: list[str] = field(default_factory=list)
    slo_tpot_ms: float | None = None

    def to_json(self) -> JsonObject:
        """The ``--json`` document."""
        return {
            "rounds": self.rounds, "rows": self.rows, "slo_tpot_ms": self.slo_tpot_ms,
            "step_time_model": self.model.to_json() if self.model is not None else None,
            "policies": [r.to_json() for r in self.results],
            "best_per_batch_size": {fam: {str(b): {"policy": r.spec.label, **asdict(r.by_batch[b])}
                                          for b, r in sorted(per.items())} for fam, per in self.best.items()},
            "notes": self.notes,
        }


def compare(steps: Sequence[TraceStep], policies: Sequence[str], *, sweep: Path | None = None,
            n_max: int | None = None, draft_to_cap: bool = False, initial_steps: int | None = None,
            cuda_graph_bs: Sequence[int] | None = None, cost_table: CostTable | None = None,
            strict: bool = True, slo_tpot_ms: float | None = None) -> Comparison:
    """Replay ``policies`` (``--policy`` texts) on ``steps`` with the step-time model from ``sweep`` (a results
    folder; a draft position beyond a round's verify width costs the trace's fitted draft step when it holds
    ``draft_ms``) or, without one, from the trace's own ``draft_ms``/``verify_ms`` (None when it has neither). With
    ``slo_tpot_ms`` (ms) every policy gets its SLO attainment and goodput, and a bare ``specserve`` takes it as its
    SLO.

    Raises:
        UserError: a bad policy, a policy the trace cannot replay, or a step-time model that cannot be built.
    """
    arr = trace_arrays(steps)
    has_probs = arr.draft_probs is not None and not arr.missing_probs
    specs = parse_policies(policies, has_probs, arr.max_positions)
    model: StepTimeModel | None = (cells_step_time(sweep, trace_draft_step(steps)) if sweep is not None
                                   else fit_trace_step_time(steps))
    notes: list[str] = []
    specs = specserve_specs(specs, slo_tpot_ms, model is not None, explicit=any(
        p.strip().lower().startswith("specserve") for p in policies), notes=notes)
    if not has_probs and any(p.strip().lower() == "all" for p in policies):
        notes.append("all: p_min and specdec left out (specserve too), the trace's drafting rounds hold no "
                     "draft_probs (record it with this release's engine --trace).")
    for spec in specs:
        if spec.kind == "config":  # the replay loads it again; its lenient-mode warnings are said here
            notes += [f"{spec.label}: warning: {w}" for w in getattr(load_config_file(spec.path, strict=strict),
                                                                     "warnings", ())]
    if model is None:
        notes.append("No step-time model: the trace holds no draft_ms/verify_ms; pass --sweep FOLDER (a sweep's "
                     "cells) for tok/s, TPOT and the best value per batch size.")
    table = getattr(model, "table", {})
    if len(table) == 1:
        notes.append(f"The sweep measured num_steps {next(iter(table))} only: every replayed round takes its time "
                     "whatever its draft length; sweep two or more num_steps to time the others.")
    widths = getattr(model, "widths", ())
    if len(widths) == 1:
        notes.append(f"Every timed round of the trace verified width {widths[0]}: the verify time at other widths is "
                     "extrapolated (as growing with the padded tokens, batch size x width); --sweep FOLDER times "
                     "them from measured cells.")
    results = evaluate(arr, specs, model, slo_tpot_ms, n_max=n_max, draft_to_cap=draft_to_cap,
                       initial_steps=initial_steps, cuda_graph_bs=cuda_graph_bs, cost_table=cost_table, strict=strict)
    if arr.accept_probs is None and any(s.kind == "specdec" for s in specs):
        notes.append("specdec read the raw draft probabilities: the trace holds no accept_probs (no acceptance head "
                     "was loaded while recording), so it equals specdec-raw.")
    lower = [r.spec.label for r in results if r.overall.lower_bound_rows]
    if lower:
        notes.append(f"Lower bounds (rows given more drafts than recorded, all accepted): {', '.join(lower)}.")
    past = [r.spec.label for r in results if r.overall.past_recorded_rows]
    if past:
        notes.append(f"Cut at the recorded positions (the rule would have drafted further): {', '.join(past)}; "
                     "record at a higher num_steps or lower --n-max.")
    for r in results:
        if r.spec.kind == "oracle" and model is not None:
            notes.append("oracle: every row drafts exactly what it accepted (the most acceptance any policy gets); "
                         "oracle-capped: the same with each round capped where the trace's tok/s is highest (the "
                         "most tok/s any policy gets under this step-time model).")
    if any(s.kind == "specserve" for s in specs):
        notes.append("specserve: the bundled engine's drafter, verifier and SLO check on the recorded draft "
                     "probabilities, deciding with this step-time model (docs/simulate.md).")
    if slo_tpot_ms is not None:
        notes.append(f"SLO att: share of rows whose TPOT in their round (round time / (accepted + 1)) is within "
                     f"{slo_tpot_ms:g} ms; goodput: predicted output tok/s of those rows.")
    notes.append(EXACTNESS)
    return Comparison(results, best_per_batch(results), model, arr.rounds, len(arr.accepted), notes, slo_tpot_ms)


def specserve_specs(specs: list[PolicySpec], slo_tpot_ms: float | None, have_model: bool, *, explicit: bool,
                    notes: list[str]) -> list[PolicySpec]:
    """``specs`` with a bare ``specserve`` given ``slo_tpot_ms`` as its SLO (de-duplicated), and without
    ``specserve`` when there is no step-time model and it came from ``all`` (a note says so).

    Raises:
        UserError: ``specserve`` named explicitly without a step-time model.
    """
    if not any(s.kind == "specserve" for s in specs):
        return specs
    if not have_model:
        if explicit:
            raise UserError("specserve decides with a step-time model and the trace holds no draft_ms/verify_ms: "
                            "pass --sweep FOLDER (a sweep's cells) or record the trace with this release's engine")
        notes.append("all: specserve left out, it decides with a step-time model (pass --sweep FOLDER).")
        return [s for s in specs if s.kind != "specserve"]
    out: list[PolicySpec] = []
    for s in specs:
        if s.kind == "specserve" and s.value is None and slo_tpot_ms is not None:
            s = PolicySpec("specserve", float(slo_tpot_ms))
        if s not in out:
            out.append(s)
    return out


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_comparison(console, cmp: Comparison, max_rows: int) -> None:  # console: rich.console.Console
    """Print the policy table, the best-per-batch-size table and the notes."""
    from rich.table import Table

    console.print("[dim]acc len: accepted drafts + 1 per row per verify step; draft/acc: drafted tokens per "
                  "accepted token; D: mean draft steps per round[/]")
    if cmp.model is not None:
        console.print(f"step-time model: {cmp.model.description}" + (
            f" (rel. RMSE {cmp.model.rel_rmse:.1%} over {cmp.model.rounds} rounds)"  # type: ignore[attr-defined]
            if hasattr(cmp.model, "rel_rmse") else ""))
    table = Table(title=f"draft-length policies ({cmp.rounds} verify steps, {cmp.rows} rows)")
    table.add_column("policy", no_wrap=True)
    slo = cmp.slo_tpot_ms is not None
    for col in ("acc len", "draft/acc", "tok/s", "TPOT ms", "D") + (
            (f"SLO att ({cmp.slo_tpot_ms:g} ms)", "goodput tok/s") if slo else ()):
        table.add_column(col, justify="right")
    for r in cmp.results:
        m = r.overall
        table.add_row(r.spec.label, f"{m.acceptance_length:.3f}", _fmt(m.drafted_per_accepted, ".2f"),
                      _fmt(m.tok_s, ".1f"), _fmt(m.tpot_ms, ".2f"), f"{m.mean_draft_steps:.2f}",
                      *((_fmt(m.slo_attainment, ".1%"), _fmt(m.goodput_tok_s, ".1f")) if slo else ()))
    console.print(table)
    if cmp.best:
        fams = [f for f in (*FAMILIES, "any") if f in cmp.best]
        oracle = next((r for r in cmp.results if r.spec.kind == "oracle-capped"), None)
        best = Table(title="best per batch size (predicted tok/s)")
        best.add_column("batch size", justify="right")
        best.add_column("rounds", justify="right")
        for f in fams:
            best.add_column("best policy" if f == "any" else f"best {f}", justify="right")
        if oracle is not None:
            best.add_column("oracle-capped", justify="right")
        sizes = sorted({b for per in cmp.best.values() for b in per})
        for b in sizes[:max_rows]:
            row = [str(b), str(cmp.results[0].by_batch[b].rounds)]
            for f in fams:
                r = cmp.best[f].get(b)
                label = (r.spec.label if f == "any" else r.spec.label.split(":", 1)[-1]) if r else "-"
                row.append(f"{label} ({r.by_batch[b].tok_s:.1f})" if r else "-")
            if oracle is not None:
                row.append(_fmt(oracle.by_batch[b].tok_s, ".1f"))
            best.add_row(*row)
        console.print(best)
        if len(sizes) > max_rows:
            console.print(f"... {len(sizes) - max_rows} more batch sizes (raise --max-rows or use --json)")
    for note in cmp.notes:
        console.print(f"[dim]{note}[/]")


def write_comparison_json(cmp: Comparison, path: Path) -> None:
    """Write :meth:`Comparison.to_json` to ``path``. Raises UserError when it cannot be written."""
    try:
        path.write_text(json.dumps(cmp.to_json(), indent=2) + "\n")
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror or err}; check the folder exists") from None
