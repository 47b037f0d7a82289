"""The per-node progress of a distributed sweep or validation (spectune.measure.node_progress): the rows the drivers
keep, the line each renders to, and the live display's one bar per running task (no Ray needed)."""

from __future__ import annotations

import io

from rich.console import Console

from spectune.measure.node_progress import NodeBoard, board_lines, node_line
from spectune.sweep.display import LiveDisplay
from spectune.validate.display import LiveValidateDisplay

NODE_A = {"id": "a1b2c3d4e5f6", "ip": "10.0.0.1", "hostname": "gpu-1"}
NODE_B = {"id": "ffff0000aaaa", "ip": "10.0.0.2", "hostname": None}


def test_a_block_row_shows_its_node_points_and_current_point():
    board = NodeBoard()
    task = board.start(NODE_A, "block K=3", 6)
    board.advance(board.advance(task))
    board.update(task, current="K=3 c=4 r=0")
    assert node_line(task) == "node a1b2c3d4 (gpu-1): block K=3, 2/6 points: K=3 c=4 r=0"


def test_a_validate_row_counts_seconds_and_its_phase():
    board = NodeBoard()
    task = board.update(board.start(NODE_B, "static:3 #1", 30, "s"), done=12.4, current="phase 2/3")
    assert node_line(task) == "node ffff0000 (10.0.0.2): static:3 #1, 12/30 s: phase 2/3"


def test_done_is_capped_at_the_total():
    board = NodeBoard()
    task = board.update(board.start(NODE_A, "static:0", 10, "s"), done=10.7)
    assert task.done == 10.0


def test_an_ended_task_leaves_the_board_and_says_done():
    board = NodeBoard()
    a = board.start(NODE_A, "block K=0", 2)
    b = board.start(NODE_B, "block K=1", 2)
    board.start(NODE_A, "block K=5", 2)  # a second server on the same node
    board.end(b)
    assert board_lines(board) == ["node a1b2c3d4 (gpu-1): block K=0, 0/2 points",
                                  "node a1b2c3d4 (gpu-1): block K=5, 0/2 points"]
    assert node_line(b).endswith(": done")
    assert a.ident != b.ident


def test_the_sweep_display_keeps_one_bar_per_running_task():
    display = LiveDisplay(Console(file=io.StringIO(), force_terminal=False))
    board = NodeBoard()
    a, b = board.start(NODE_A, "block K=0", 2), board.start(NODE_B, "block K=3", 2)
    display.node_progress(a)
    display.node_progress(b)
    display.node_progress(board.advance(a))
    bars = {t.description: (t.completed, t.total) for t in display.progress.tasks}
    assert bars == {"node a1b2c3d4 (gpu-1): block K=0, 1/2 points": (1.0, 2.0),
                    "node ffff0000 (10.0.0.2): block K=3, 0/2 points": (0.0, 2.0)}
    display.node_progress(board.end(a))
    assert [t.description for t in display.progress.tasks] == ["node ffff0000 (10.0.0.2): block K=3, 0/2 points"]


def test_the_validate_display_hides_the_single_run_bar_under_ray():
    from spectune.validate.plan import ValidatePlan
    from spectune.measure.workload import parse_workload

    display = LiveValidateDisplay(Console(file=io.StringIO(), force_terminal=False))
    display.started(ValidatePlan(config="x", steps=(0,), workload=parse_workload("c1@1")), ["static:0", "config"])
    task = NodeBoard().start(NODE_A, "config", 1.0, "s")
    display.node_progress(task)
    visible = [t.description for t in display.progress.tasks if t.visible]
    assert visible == ["runs", "node a1b2c3d4 (gpu-1): config, 0/1 s"]
