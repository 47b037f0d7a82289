"""The draft-confidence cutoff cells beside the static ones (``spectune sweep --p-min``, docs/sweep.md "Draft
confidence cutoff"): the ``--p-min`` list (:func:`parse_p_min_list`), which cells each cutoff P gets
(:func:`p_min_passes`: the sweep's concurrencies at num_steps K = the largest ``--steps``, the draft's cap, one
side pass per P with servers of its own in ``OUTPUT_DIR/p-min/P/``), and the runner that measures them beside the
static cells (:class:`PMinRunner`), which :func:`spectune.sweep.run.execute` drives as it drives a plain sweep.

A cutoff P makes a server with a drafter stop a row's draft at the first draft token whose probability is under P
(llama.cpp: ``--spec-draft-p-min``, ``common/speculative.cpp`` ``common_speculative_impl_draft_eagle3``); which
backends can set it, and how, is theirs to say (:attr:`spectune.backends.base.Backend.p_min_flag`,
:meth:`~spectune.backends.base.Backend.p_min_args`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Sequence, cast

from spectune.backends import p_min_backends
from spectune.backends.base import Backend
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.results.folder import SweepFolder
from spectune.results.point import ServerRecord, SweepPoint
from spectune.results.schema import P_MIN_FOLDER, Key, PointKey, p_min_folder_name
from spectune.results.sweep_meta import SweepMeta
from spectune.sweep.plan import SweepPlan
from spectune.sweep.schedule_server import StaticLedRunner, take_turns
from spectune.sweep.side_pass import SidePass

if TYPE_CHECKING:
    from spectune.sweep.runner import FolderSweep, RaySweeping, SweepRunner

__all__ = ["parse_p_min_list", "p_min_passes", "p_min_server", "PMinRunner", "run_by_repeat"]


def parse_p_min_list(text: str | None) -> tuple[float, ...]:
    """``--p-min`` such as ``"0,0.3,0.6,0.9"`` -> sorted, de-duplicated cutoffs (probabilities); () for None or "".

    Raises:
        UserError: an empty item, a non-number, or a value outside 0..1 (named, with the fix).
    """
    if text is None or not text.strip():
        return ()
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise UserError(f"bad --p-min list {text!r}: write comma-separated probabilities, e.g. --p-min 0,0.3,0.6,0.9")
    values = []
    for t in items:
        try:
            v = float(t)
        except ValueError:
            raise UserError(f"bad --p-min value {t!r}: use probabilities in 0..1, e.g. --p-min 0,0.3,0.6,0.9") from None
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise UserError(f"--p-min {t} is outside 0..1: a cutoff is a draft token's probability")
        values.append(v)
    return tuple(sorted(set(values)))


def p_min_passes(values: Sequence[float], plan: SweepPlan, backend: Backend,
                 ray: RaySweeping | None = None) -> list[SidePass]:
    """One side pass per cutoff P, in ``p-min/P`` (:func:`p_min_folder_name`) with servers whose ``draft_p_min`` is P:
    the sweep's grid of concurrencies and repeats at num_steps K = the largest ``--steps`` (the draft's cap:
    llama.cpp's ``--spec-draft-n-max``), every window in full unless ``--early-stop`` was asked, no drift check of
    its own (the static cells' covers the machine); its points carry ``server`` :func:`p_min_server`, which its
    sweep.json also records as ``p_min``; [] without values.

    Raises:
        UserError: ``backend`` cannot set a cutoff (naming the backends that can), the largest ``--steps`` is 0
            (no draft to cut), or ``--ray``.
    """
    if not values:
        return []
    if backend.p_min_args(values[0]) is None:
        which = ", ".join(p_min_backends()) or "none"
        how = "running endpoints cannot be relaunched with it" if backend.p_min_flag else "it has no such setting"
        raise UserError(f"--p-min: the {backend.name} backend cannot set a draft-confidence cutoff ({how}); "
                        f"backends that can: {which}")
    if max(plan.steps) < 1:
        raise UserError("--p-min needs a num_steps above 0 in --steps: its largest value is the cutoff cells' "
                        "draft cap")
    if ray is not None:
        raise UserError("--p-min does not run with --ray yet: sweep the cutoffs without --ray")
    sub = dataclasses.replace(plan, steps=(max(plan.steps),), design="grid", budget_points=None, budget_s=None,
                              drift_check=False, early_stop=bool(plan.early_stop))
    return [SidePass(sub, f"{P_MIN_FOLDER}/{p_min_folder_name(p)}", {"draft_p_min": p},
                     lambda b, _, p=p: p_min_server(p, sub.steps[0], b), _note_cutoff) for p in values]


def p_min_server(p_min: float, steps: int, backend: Backend) -> ServerRecord:
    """points.jsonl's ``server`` of a cutoff cell: ``kind`` ``p_min``, ``p_min``, ``max_k`` (num_steps K) and
    ``args`` (the backend's flags for P)."""
    return {"kind": "p_min", "p_min": p_min, "max_k": steps, "args": list(backend.p_min_args(p_min) or [])}


def _note_cutoff(meta: SweepMeta, server: ServerRecord) -> None:
    """A cutoff's own sweep.json records its server as ``p_min``."""
    meta.p_min = dict(server)


def p_min_summary(values: Sequence[float], plan: SweepPlan, backend: Backend) -> JsonObject:
    """The main sweep.json's ``p_min`` for the cutoffs ``values`` of the sweep ``plan`` (:func:`p_min_passes`'s
    arguments): the cutoffs, their num_steps K (the largest ``--steps``), the flag that sets them and where their
    cells are."""
    return {"values": list(values), "num_steps": max(plan.steps), "flag": backend.p_min_flag, "folder": P_MIN_FOLDER}


class PMinRunner(StaticLedRunner):
    """The static cells' sweep and the cutoffs' sweeps as one runner; the cutoffs' points live in their own folders,
    and two servers never run at once (a sweep's backend is closed before another sweep measures).

    :meth:`run` measures repeat by repeat and concurrency by concurrency where the static sweep interleaves its cells
    (a grid plan with repeats, on a backend that switches num_steps cheaply, ``Sweep.order`` ``interleaved``): the
    static points of repeat r at concurrency c, then each cutoff's points of (r, c) (:func:`run_by_repeat`), so a
    cutoff's cell and the static cells it is compared with (the cell of the same cap K, and simulate's step-time table)
    run within minutes of each other rather than a whole static sweep apart (docs/sweep.md, "Order and drift").
    Otherwise (blocks order, a guided plan, one repeat) the static points in their own order, then each cutoff's.

    Args:
        static: the static cells' runner. cutoffs: (sweep, points to run) per cutoff, in measuring order.
    """

    def __init__(self, static: SweepRunner, cutoffs: Sequence[tuple[SweepRunner, Sequence[Key]]]) -> None:
        self.static, self.cutoffs = static, [(s, list(todo)) for s, todo in cutoffs]

    def by_repeat(self, todo: Sequence[Key]) -> bool:
        """Whether :meth:`run` goes repeat by repeat for the static points ``todo``: the static runner is a serial
        sweep (not a runner of several, like the schedule server's pair) of a grid plan in interleaved order, and
        the points span two or more repeats."""
        static = self.static
        if not hasattr(static, "measure_block"):
            return False
        plan, backend = static.plan, static.backend  # type: ignore[attr-defined]
        repeats = {k[2] for k in todo} | {k[2] for _, keys in self.cutoffs for k in keys}
        return plan.design == "grid" and len(repeats) > 1 and plan.order_for(backend.cheap_switch) == "interleaved"

    async def run(self, todo: Sequence[Key]) -> None:
        """Measure the static points ``todo`` and every cutoff's points (repeat by repeat where :meth:`by_repeat`)."""
        if self.by_repeat(todo):
            await run_by_repeat([(cast("FolderSweep", self.static), list(todo)),
                                 *((cast("FolderSweep", s), keys) for s, keys in self.cutoffs)])
            return
        await self.static.run(todo)
        for sweep, keys in self.cutoffs:
            if keys:
                await sweep.run(keys)


async def run_by_repeat(jobs: Sequence[tuple[FolderSweep, Sequence[Key]]]) -> None:
    """Several sweeps' points repeat by repeat and, within a repeat, concurrency by concurrency in the first sweep's
    order: for each (repeat r, concurrency c), each sweep's points of (r, c) point by point in its plan's order
    (``interleaved``: every num_steps in turn, reversed in odd repeats), its server closed after them
    (:func:`~spectune.sweep.schedule_server.take_turns`). ``jobs``: (sweep, points to run) in measuring order."""
    for s, _ in jobs:
        s.order = s.meta.order = s.plan.order_for(s.backend.cheap_switch)
    ordered = [(s, s.plan.ordered([PointKey(*k) for k in keys], s.order)) for s, keys in jobs]
    first = jobs[0][0]
    groups = list(dict.fromkeys((k.repeat, k.concurrency) for k in first.plan.ordered(
        [k for _, keys in ordered for k in keys], first.order)))
    await take_turns(ordered, groups, lambda k: (k.repeat, k.concurrency), per_point=True)


def p_min_lines(output_dir: str | os.PathLike[str]) -> list[str]:
    """What ``spectune sweep`` prints of the cutoffs' cells in ``output_dir/p-min``: a heading, then per point its
    cutoff P, num_steps K, concurrency, output throughput (tokens/s), acceptance length (tokens per verify step that
    drafted) and the share of verify steps that drafted (points.jsonl ``schedule_check.drafting_share``); [] without
    such cells."""
    from pathlib import Path

    root = Path(output_dir) / P_MIN_FOLDER
    points = []
    for sub in sorted(root.iterdir()) if root.is_dir() else []:
        if (sub / "points.jsonl").is_file():
            points += SweepFolder(sub).read_points()
    if not points:
        return []
    out = [f"draft-confidence cutoffs ({root}):"]
    for pt in sorted(points, key=lambda p: (_cutoff(p, 0.0), p.concurrency, p.repeat)):
        head = f"  p_min {_cutoff(pt, math.nan):g} K={pt.steps} c={pt.concurrency}: "
        if pt.status != "ok":
            out.append(f"{head}{pt.status} ({pt.error})")
            continue
        share = None if pt.schedule_check is None else pt.schedule_check.drafting_share
        out.append(f"{head}{_num(pt.numbers.output_throughput_tok_s, '.1f')} tok/s, acceptance length "
                   f"{_num(pt.numbers.acceptance_length, '.2f')}, drafted in "
                   f"{'?' if share is None else f'{share:.0%}'} of verify steps")
    return out


def _cutoff(point: SweepPoint, default: float) -> float:
    """The cutoff P of a point's ``p_min`` server (``default`` for a point without one)."""
    server = point.server
    return float(server["p_min"]) if server is not None and server["kind"] == "p_min" else default


def _num(value: float | None, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and math.isfinite(value) else "?"
