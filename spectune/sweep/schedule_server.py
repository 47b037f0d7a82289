"""The schedule server's cells beside the static ones (``spectune sweep --schedule-server``, docs/sweep.md "The
schedule server"): the side pass that pins the engine's schedule server to each num_steps (:func:`schedule_pass`),
and the runner that alternates the two servers' num_steps blocks (:class:`PairedRunner`, :func:`run_pair`), which
:func:`spectune.sweep.run.execute` drives as it drives a plain sweep."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

from spectune.backends.base import Backend
from spectune.core.errors import UserError
from spectune.results.point import ServerRecord
from spectune.results.schema import SCHEDULE_FOLDER, Key, PointKey
from spectune.sweep.plan import SweepPlan
from spectune.sweep.side_pass import SidePass

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    from spectune.core.json_types import JsonObject
    from spectune.results.sweep_meta import SweepMeta
    from spectune.sweep.runner import FolderSweep, RaySweeping, SweepRunner

SCHEDULE_SERVER_MODES = ("auto", "on", "off")


def schedule_pass(plan: SweepPlan, backend: Backend, mode: str,
                  ray: RaySweeping | None = None) -> tuple[SidePass | None, list[str]]:
    """The schedule server's side pass (``--schedule-server``), or None, and warnings. Its servers are the engine's
    schedule server (``schedule_server_max_k`` = the pass's largest num_steps) in :data:`SCHEDULE_FOLDER`, and its
    points carry ``server`` :func:`schedule_server_record`.

    ``mode``: ``auto`` measures them where the backend's schedule server can cost more than its static servers
    (:attr:`spectune.backends.base.ScheduleServer.costs_more`: launched vLLM and SGLang), ``on`` wherever the backend
    has one, ``off`` never. The plan is the sweep's grid over the num_steps the schedule server can be pinned to
    (:meth:`Backend.schedule_steps`); a plan whose largest num_steps is 0 has no schedule to price. ``auto`` skips
    guided and ``--ray`` plans (with a warning).

    Raises:
        UserError: an unknown ``mode``; ``on`` with a backend that has no schedule server, with ``--ray``, or with
            num_steps 0 only.
    """
    if mode not in SCHEDULE_SERVER_MODES:
        raise UserError(f"--schedule-server {mode!r}: use auto, on or off")
    if mode == "off":
        return None, []
    server = backend.schedule_server()
    if server is None:
        if mode == "on":
            raise UserError(f"--schedule-server on: the {backend.name} backend has no schedule server to launch (no "
                            "per-batch-size config, running endpoints, or a --launch template without "
                            "{adaptive_config}); drop the option")
        return None, []
    if mode == "auto" and not server.costs_more:
        return None, []
    if max(plan.steps) < 1:
        if mode == "on":
            raise UserError("--schedule-server on needs a num_steps above 0 in --steps (a schedule's largest K)")
        return None, []
    if ray is not None or plan.design != "grid":
        why = "--ray" if ray is not None else "a guided plan"
        if mode == "on" and ray is not None:
            raise UserError("--schedule-server on does not run with --ray yet: sweep the schedule server without "
                            "--ray, or pass --schedule-server off")
        if mode == "auto":
            return None, [f"{server.engine}'s schedule server (what a per-batch-size config runs) is not measured "
                          f"with {why}: recommend prices schedules at static cells; --schedule-server on measures "
                          "its grid"]
    steps, warnings = backend.schedule_steps(plan.steps)
    if not steps:
        return None, warnings
    pinned = dataclasses.replace(plan, steps=tuple(steps), design="grid", budget_points=None, budget_s=None)
    return SidePass(pinned, SCHEDULE_FOLDER, {"schedule_server_max_k": max(steps)}, schedule_server_record), warnings


def schedule_server_record(backend: Backend, meta: SweepMeta) -> ServerRecord:
    """points.jsonl's ``server`` of a schedule-server cell: ``kind`` ``schedule`` and what sweep.json's backend
    entry says of the schedule server (its config and flags)."""
    return {"kind": "schedule", **(meta.backend_value("schedule_server") or {})}  # type: ignore[dict-item]


async def take_turns(jobs: Sequence[tuple[FolderSweep, Sequence[PointKey]]], groups: Sequence[Hashable],
                     group_of: Callable[[PointKey], Hashable], per_point: bool = False) -> None:
    """Several sweeps' points in turns: for each group in ``groups``, each sweep's points ``keys`` (in run order) of
    that group (``group_of(key) == group``), measured as one block (``measure_block``: the block's drift check
    included) or, with ``per_point``, point by point. Before a sweep's turn the last turn's backend hands its server
    over (:meth:`~spectune.backends.base.Backend.hand_over`: the bundled engine switches a cutoff in place) or is
    closed (``close``: the bundled engine's ``stop`` keeps its server up for the next switch), so two servers never
    run at once. Then each sweep's end-of-sweep drift check. ``jobs``: (sweep, its points to run) in turn order."""
    live: FolderSweep | None = None  # the sweep whose backend holds the running server, if any

    async def take(s: FolderSweep) -> None:
        nonlocal live
        if live is not None and live is not s:
            if not await live.backend.hand_over(s.backend):
                await live.backend.close()
            live.current = None
        live = s

    try:
        for group in groups:
            for s, keys in jobs:
                turn = [k for k in keys if group_of(k) == group]
                if not turn:
                    continue
                await take(s)
                for block in ([k] for k in turn) if per_point else [turn]:
                    await s.measure_block(block)
        for s, _ in jobs:
            await take(s)
            await s.end_check()
        for s, _ in jobs:
            await s.backend.close()
            s.current = None
    finally:
        for s, _ in jobs:
            await s.backend.stop()
            s._save_meta()


async def run_pair(first: FolderSweep, first_todo: Sequence[Key], second: FolderSweep,
                   second_todo: Sequence[Key]) -> None:
    """Two sweeps' points, one num_steps block of each in turn (the static server of K, then the schedule server
    of K), so the two cells compared for a num_steps run minutes apart, not a sweep apart (:func:`take_turns`).
    ``first``, ``second``: :class:`spectune.sweep.run.Sweep` objects (their plan, meta, backend, ``measure_block``
    and ``end_check``)."""
    jobs = [(s, s.plan.ordered([PointKey(*k) for k in todo], "blocks")) for s, todo in
            ((first, first_todo), (second, second_todo))]
    for s, _ in jobs:
        s.order = s.meta.order = "blocks"
    await take_turns(jobs, sorted({k.steps for _, keys in jobs for k in keys}), lambda k: k.steps)


class StaticLedRunner:
    """A runner around the static cells' sweep and other sweeps with folders of their own (what
    :func:`spectune.sweep.run.execute` runs, as it runs a plain :class:`spectune.sweep.run.Sweep`): ``ran``,
    ``predicted`` and ``meta`` are the static sweep's; subclasses say in :meth:`run` how the sweeps take turns."""

    static: SweepRunner

    @property
    def ran(self) -> int:
        return self.static.ran

    @property
    def predicted(self) -> list[JsonObject]:
        return self.static.predicted

    @property
    def meta(self) -> SweepMeta:
        return self.static.meta


class PairedRunner(StaticLedRunner):
    """The static servers' sweep and the schedule server's as one runner: :meth:`run` measures the two sweeps' points
    in alternating num_steps blocks (:func:`run_pair`); the schedule server's points live in its own folder.

    Args:
        static: the static servers' sweep. schedule: the schedule server's :class:`spectune.sweep.run.Sweep`.
        schedule_todo: the schedule server's points still to measure.
    """

    def __init__(self, static: FolderSweep, schedule: FolderSweep, schedule_todo: Sequence[Key]) -> None:
        self.static, self.schedule, self.schedule_todo = static, schedule, list(schedule_todo)

    async def run(self, todo: Sequence[Key]) -> None:
        """Measure the static points ``todo`` and the schedule server's, one num_steps block of each in turn."""
        await run_pair(self.static, todo, self.schedule, self.schedule_todo)
