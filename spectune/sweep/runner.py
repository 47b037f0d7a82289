"""What :func:`spectune.sweep.run.execute` and the runners that combine sweeps (:mod:`spectune.sweep.schedule_server`,
:mod:`spectune.sweep.p_min`) use of a sweep, as protocols: the serial :class:`spectune.sweep.run.Sweep` and the
distributed :class:`spectune.sweep.distributed.RaySweep` satisfy them without these modules importing each other
(run.py imports the combining runners, and the distributed sweep imports run.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from spectune.backends.base import Backend
    from spectune.backends.options import BackendOptions
    from spectune.core.json_types import JsonObject
    from spectune.loadgen.datasets import Prompt
    from spectune.measure.load_settings import ClientTimeouts
    from spectune.results.folder import SweepFolder
    from spectune.results.point import ServerRecord
    from spectune.results.schema import Key
    from spectune.results.sweep_meta import SweepMeta
    from spectune.sweep.plan import SweepListener, SweepPlan

__all__ = ["SweepRunner", "FolderSweep", "RaySweeping"]


class SweepRunner(Protocol):
    """What :func:`spectune.sweep.run.execute` runs and reads back: :class:`spectune.sweep.run.Sweep`, the
    distributed sweep (:meth:`spectune.sweep.distributed.RayOptions.sweep`) or a runner of several sweeps."""

    @property
    def ran(self) -> int: ...

    @property
    def predicted(self) -> list[JsonObject]: ...

    @property
    def meta(self) -> SweepMeta: ...

    async def run(self, todo: Sequence[Key]) -> None: ...


class FolderSweep(SweepRunner, Protocol):
    """A serial sweep with a folder of its own (:class:`spectune.sweep.run.Sweep`): the schedule server's, or one
    draft-confidence cutoff's; what :func:`spectune.sweep.schedule_server.run_pair` drives block by block."""

    plan: SweepPlan
    folder: SweepFolder
    backend: Backend
    server: ServerRecord | None
    order: str
    current: int | None

    async def measure_block(self, keys: Sequence[Key]) -> None: ...

    async def end_check(self) -> None: ...

    def _save_meta(self) -> None: ...


class RaySweeping(Protocol):
    """What :func:`spectune.sweep.run.execute` uses of ``--ray``'s options
    (:class:`spectune.sweep.distributed.RayOptions`)."""

    def check(self, plan: SweepPlan, backend: Backend | None = None) -> None: ...

    def sweep(self, plan: SweepPlan, backend_name: str, options: BackendOptions, folder: SweepFolder,
              prompts: list[Prompt], meta: SweepMeta, listener: SweepListener,
              timeouts: ClientTimeouts) -> SweepRunner: ...
