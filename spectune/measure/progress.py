"""Live progress bars for a measurement (rich), shared by the sweep's and validate's displays."""

from __future__ import annotations

from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

_P = TypeVar("_P", bound="LiveProgress")


class LiveProgress:
    """Transient rich progress bars (description, bar, done / total, elapsed time, a ``rate`` field) on
    ``console``, shown only on a terminal; used as a context manager around a run.

    Subclasses add the tasks and print their own per-item lines (which are all that logs and pipes get).
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[rate]}"), console=self.console,
                                 transient=True)

    def __enter__(self: _P) -> _P:
        if self.console.is_terminal:  # no live bars in logs and pipes: the per-item lines are enough there
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress.live.is_started:
            self.progress.stop()
