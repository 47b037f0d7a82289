"""A pass of cells beside the static ones, on servers of their own and in a sweep folder of its own below the
sweep's: the schedule server's cells (:func:`spectune.sweep.schedule_server.schedule_pass`, ``schedule-server/``) or
one draft-confidence cutoff's (:func:`spectune.sweep.p_min.p_min_passes`, ``p-min/P/``).
:func:`spectune.sweep.run.execute` opens every pass the same way (:func:`spectune.sweep.run.open_side_pass`) and
drives the runner that combines them with the static sweep (:class:`~spectune.sweep.schedule_server.PairedRunner`,
:class:`~spectune.sweep.p_min.PMinRunner`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from spectune.backends.base import Backend
    from spectune.results.point import ServerRecord, SweepPoint
    from spectune.results.schema import Key
    from spectune.results.sweep_meta import SweepMeta
    from spectune.sweep.plan import SweepPlan
    from spectune.sweep.runner import FolderSweep

__all__ = ["SidePass", "OpenPass"]


@dataclasses.dataclass(frozen=True)
class SidePass:
    """What a side pass measures and where.

    Attributes:
        plan: its cells (a grid).
        folder: its sweep folder, relative to the sweep's (``schedule-server``, ``p-min/0.3``).
        options: the :class:`~spectune.backends.options.BackendOptions` fields its servers set, by name
            (``schedule_server_max_k``, ``draft_p_min``).
        server: points.jsonl's ``server`` of its cells, from its backend and its sweep.json record.
        note: what its own sweep.json records of that server, or None for nothing (a cutoff's ``p_min``).
    """

    plan: SweepPlan
    folder: str
    options: dict[str, object]
    server: Callable[[Backend, SweepMeta], ServerRecord]
    note: Callable[[SweepMeta, ServerRecord], None] | None = None


@dataclasses.dataclass
class OpenPass:
    """A side pass ready to run: its sweep (folder opened, preflight done), the points still to run and those kept
    from an earlier run (``--resume``)."""

    sweep: FolderSweep
    todo: list[Key]
    kept: list[SweepPoint]
