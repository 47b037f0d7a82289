"""Live progress bars for a measurement (rich), shared by the sweep's and validate's displays, with one bar per
running task of a distributed run (``--ray``: :mod:`spectune.measure.node_progress`)."""

from __future__ import annotations

from typing import TypeVar

from spectune.measure.node_progress import NodeTask, node_line

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

_P = TypeVar("_P", bound="LiveProgress")


class LiveProgress:
    """Transient rich progress bars (description, bar, done / total, elapsed time, a ``rate`` field) on
    ``console``, shown only on a terminal; used as a context manager around a run.

    Subclasses add the tasks and print their own per-item lines (which are all that logs and pipes get).
    :meth:`node_progress` keeps one bar per running task of a distributed run (its node, label, done / total,
    current work), removed when the task ends.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[rate]}"), console=self.console,
                                 transient=True)
        self.node_bars: dict[int, int] = {}  # NodeTask.ident -> its rich task id

    def __enter__(self: _P) -> _P:
        if self.console.is_terminal:  # no live bars in logs and pipes: the per-item lines are enough there
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress.live.is_started:
            self.progress.stop()

    def node_progress(self, task: NodeTask) -> None:
        """A task of a distributed run changed (:class:`spectune.measure.node_progress.NodeBoard`): add, update
        or (finished) remove its bar, described by :func:`spectune.measure.node_progress.node_line`."""
        bar = self.node_bars.get(task.ident)
        if task.finished:
            if bar is not None:
                self.progress.remove_task(bar)  # type: ignore[arg-type]
                del self.node_bars[task.ident]
            return
        if bar is None:
            self.node_bars[task.ident] = self.progress.add_task(node_line(task), total=task.total or None,
                                                                completed=task.done, rate="")
        else:
            self.progress.update(bar, description=node_line(task), completed=task.done)  # type: ignore[arg-type]
