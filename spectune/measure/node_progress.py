"""Per-node progress of a distributed run (``spectune sweep --ray``, ``spectune validate --ray``): what each Ray
task is doing on its node, as plain data the drivers update (:class:`NodeBoard`) and the displays render
(:func:`node_line`; :class:`spectune.measure.progress.LiveProgress` draws one bar per running task).

A task is one num_steps block of a sweep (progress in points: done / total, the current point) or one run of a
validation (progress in seconds of its scheduled workload, the current phase). A node may run several tasks at
once (a node with two GPUs and ``--ray-resources '{"GPU": 1}'``), so a row is one task, not one node.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from spectune.core.json_types import JsonObject

__all__ = ["NodeTask", "NodeBoard", "node_line", "board_lines"]


@dataclass
class NodeTask:
    """One running task on its node.

    Attributes:
        node: ``{"id", "ip", "hostname"}`` (a task's ``node`` event). label: what it runs (``block K=3``,
            ``calibration (K=0 c=1)``, ``static:3 #1``). total: its work, in ``unit`` (``points`` or ``s``).
        done: how much of it is done, in ``unit``. current: what it is on now (``K=3 c=4 r=0``, ``phase 2/3``,
            ``starting the server``). finished: the task ended (its row goes). ident: unique per task.
    """

    node: JsonObject
    label: str
    total: float
    unit: str = "points"
    done: float = 0.0
    current: str = ""
    finished: bool = False
    ident: int = field(default_factory=itertools.count().__next__)

    @property
    def node_name(self) -> str:
        """``1a2b3c4d (hostname)``: the node id's first 8 characters and its host."""
        ident = str(self.node.get("id") or "")[:8] or "?"
        host = self.node.get("hostname") or self.node.get("ip")
        return f"{ident} ({host})" if host else ident


def node_line(task: NodeTask) -> str:
    """One task as a line: ``node 1a2b3c4d (gpu-1): block K=3, 2/6 points: K=3 c=4 r=0`` (seconds of a validate
    run: ``node 1a2b3c4d (gpu-1): static:3 #1, 12/30 s: phase 2/3``; ``: done`` when finished)."""
    if task.unit == "s":
        amount = f"{task.done:.0f}/{task.total:.0f} s"
    else:
        amount = f"{task.done:g}/{task.total:g} {task.unit}"
    tail = "done" if task.finished else task.current
    return f"node {task.node_name}: {task.label}, {amount}" + (f": {tail}" if tail else "")


class NodeBoard:
    """What every node runs now: the driver starts a row when a task's ``node`` event arrives, updates it as its
    events come, ends it when the task ends. Each method returns the row it changed (for the listener's
    ``node_progress``)."""

    def __init__(self) -> None:
        self.tasks: dict[int, NodeTask] = {}

    def start(self, node: JsonObject, label: str, total: float, unit: str = "points") -> NodeTask:
        """A task started on ``node``: its row."""
        task = NodeTask(dict(node), label, float(total), unit)
        self.tasks[task.ident] = task
        return task

    def update(self, task: NodeTask, done: float | None = None, current: str | None = None) -> NodeTask:
        """Set how much is done (capped at the total) and what it is on now."""
        if done is not None:
            task.done = min(float(done), task.total)
        if current is not None:
            task.current = current
        return task

    def advance(self, task: NodeTask, amount: float = 1.0) -> NodeTask:
        """One more point done (``amount`` of the task's unit)."""
        return self.update(task, done=task.done + amount)

    def end(self, task: NodeTask) -> NodeTask:
        """The task ended (normally or not): its row leaves the board."""
        task.finished = True
        self.tasks.pop(task.ident, None)
        return task

    def running(self) -> list[NodeTask]:
        """The running tasks, by node then start."""
        return sorted(self.tasks.values(), key=lambda t: (t.node_name, t.ident))


def board_lines(board: NodeBoard) -> list[str]:
    """Every running task as a line (:func:`node_line`), by node."""
    return [node_line(t) for t in board.running()]
