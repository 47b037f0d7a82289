"""``spectune sweep --p-min``: the cutoff list, which backends may sweep it (declared by the backend classes), the
cutoff cells' plan, the order the runner measures them in beside the static cells, and one real llama.cpp sweep
over two cutoffs followed by ``spectune recommend``."""

from __future__ import annotations

import asyncio
import csv
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from spectune.backends import make_backend
from spectune.backends.options import BackendOptions
from spectune.core.errors import UserError
from spectune.sweep.p_min import PMinRunner, p_min_passes, parse_p_min_list
from spectune.sweep.plan import SweepPlan
from helpers.llamacpp import needs_server




def llamacpp(tmp_path):
    gguf = tmp_path / "target.gguf"
    gguf.write_bytes(b"GGUF")
    return make_backend("llamacpp", BackendOptions(model=str(gguf)))


class _Server:
    """A backend's server as the runner sees it: whether it switches num_steps cheaply, and when it is closed. Like
    the bundled engine's, ``stop`` keeps the server up (for the next switch); only ``close`` ends it."""

    def __init__(self, name: str, log: list, cheap_switch: bool, hands_over: bool = False) -> None:
        self.name, self.log, self.cheap_switch, self.hands_over = name, log, cheap_switch, hands_over

    async def stop(self) -> None:
        pass

    async def close(self) -> None:
        self.log.append((self.name, "close"))

    async def hand_over(self, successor) -> bool:
        if self.hands_over:
            self.log.append((self.name, "hand over", successor.name))
        return self.hands_over


class _Sweep:
    """A serial sweep's surface (spectune.sweep.runner.FolderSweep) that logs what it is asked to measure."""

    def __init__(self, name: str, plan: SweepPlan, log: list, cheap_switch: bool = True,
                 hands_over: bool = False) -> None:
        self.name, self.plan, self.log = name, plan, log
        self.backend = _Server(name, log, cheap_switch, hands_over)
        self.meta = SimpleNamespace(order=None)
        self.order, self.current = "blocks", None

    async def measure_block(self, keys) -> None:
        self.log += [(self.name, tuple(k)) for k in keys]

    async def run(self, todo) -> None:
        self.log.append((self.name, "run", len(todo)))

    async def end_check(self) -> None:
        self.log.append((self.name, "end"))

    def _save_meta(self) -> None:
        pass


def _measured(cheap_switch: bool = True, repeats: int = 2, concurrency: tuple[int, ...] = (1,),
              hands_over: bool = False) -> list:
    """The log of a PMinRunner over static K=0,2 and one cutoff at K=2."""
    log: list = []
    plan = SweepPlan(steps=(0, 2), concurrency=concurrency, repeats=repeats)
    static = _Sweep("static", plan, log, cheap_switch, hands_over)
    cutoff = _Sweep("p0.5", SweepPlan(steps=(2,), concurrency=concurrency, repeats=repeats), log, cheap_switch,
                    hands_over)
    runner = PMinRunner(static, [(cutoff, cutoff.plan.points())])
    asyncio.run(runner.run(plan.points()))
    return log


def test_with_repeats_each_cutoff_runs_in_the_repeat_of_its_static_cells():
    points = [entry[1] for entry in _measured() if isinstance(entry[1], tuple)]
    assert [p[2] for p in points] == [0, 0, 0, 1, 1, 1]


def test_the_static_cells_of_a_repeat_come_first_and_reverse_in_odd_repeats():
    names = [(entry[0], entry[1][0]) for entry in _measured() if isinstance(entry[1], tuple)]
    assert names == [("static", 0), ("static", 2), ("p0.5", 2), ("static", 2), ("static", 0), ("p0.5", 2)]


def test_within_a_repeat_each_concurrency_measures_its_cutoff_cells_before_the_next():
    points = [(e[0], e[1][1]) for e in _measured(repeats=2, concurrency=(1, 4)) if isinstance(e[1], tuple)][:6]
    assert points == [("static", 1), ("static", 1), ("p0.5", 1), ("static", 4), ("static", 4), ("p0.5", 4)]


def test_a_server_is_closed_before_the_next_sweep_measures():
    log = _measured()
    first_cutoff = next(i for i, e in enumerate(log) if e[0] == "p0.5")
    assert log[first_cutoff - 1] == ("static", "close")


def test_a_backend_that_hands_its_server_over_is_not_closed_between_turns():
    log = _measured(hands_over=True)
    first_cutoff = next(i for i, e in enumerate(log) if e[0] == "p0.5")
    assert log[first_cutoff - 1] == ("static", "hand over", "p0.5")


def test_with_hand_overs_the_only_closes_are_at_the_end():
    assert [e for e in _measured(hands_over=True) if e[1] == "close"] == [("static", "close"), ("p0.5", "close")]


def test_blocks_order_measures_the_cutoffs_after_the_static_sweep():
    assert _measured(cheap_switch=False) == [("static", "run", 4), ("p0.5", "run", 2)]


def test_one_repeat_measures_the_cutoffs_after_the_static_sweep():
    assert _measured(repeats=1) == [("static", "run", 2), ("p0.5", "run", 1)]


def test_the_list_is_sorted_and_deduplicated():
    assert parse_p_min_list("0.6, 0,0.3,0.6") == (0.0, 0.3, 0.6)


def test_no_list_is_no_cutoff():
    assert parse_p_min_list(None) == ()


def test_a_value_above_one_is_a_user_error():
    with pytest.raises(UserError, match="outside 0..1"):
        parse_p_min_list("0,1.5")


def test_a_word_is_a_user_error():
    with pytest.raises(UserError, match="bad --p-min value 'high'"):
        parse_p_min_list("0,high")


def test_a_backend_without_the_knob_names_those_with_it(tmp_path):
    backend = make_backend("openai", BackendOptions(endpoints={-1: "http://127.0.0.1:9"}))
    with pytest.raises(UserError, match=r"backends that can: .*llamacpp \(--spec-draft-p-min\)"):
        p_min_passes((0.3,), SweepPlan(steps=(0, 2)), backend)


def test_the_cutoff_cells_run_at_the_largest_num_steps(tmp_path):
    (side,) = p_min_passes((0.3,), SweepPlan(steps=(0, 2, 4), concurrency=(1, 4)), llamacpp(tmp_path))
    assert (side.plan.steps, side.plan.concurrency) == ((4,), (1, 4))


def test_a_cutoff_pass_has_its_folder_and_its_servers_cutoff(tmp_path):
    (side,) = p_min_passes((0.3,), SweepPlan(steps=(0, 2, 4), concurrency=(1, 4)), llamacpp(tmp_path))
    assert (side.folder, side.options) == ("p-min/0.3", {"draft_p_min": 0.3})


def test_only_num_steps_zero_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="needs a num_steps above 0"):
        p_min_passes((0.3,), SweepPlan(steps=(0,)), llamacpp(tmp_path))


def test_cli_bad_list_is_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "spectune.cli", "sweep", "--backend", "llamacpp", "--steps", "0,2",
                          "--p-min", "0,2", "--output-dir", str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=120)
    assert (run.returncode, run.stderr.count("\n"), "Traceback" in run.stderr) == (2, 1, False)


@pytest.mark.slow
@needs_server
def test_llamacpp_sweep_over_two_cutoffs_then_recommend(tmp_path):
    """The default pair: static K=0 and 2 and cutoffs 0 and 0.9 at K=2, concurrency 1, four requests a point."""
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "spectune.cli", "sweep", "--backend", "llamacpp", "--steps", "0,2", "--concurrency",
           "1", "--p-min", "0,0.9", "--num-prompts", "4", "--max-tokens", "32", "--no-drift-check",
           "--output-dir", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {float(r["p_min"]): r for p in ("0", "0.9")
            for r in csv.DictReader((out / "p-min" / p / "summary.csv").open())}
    assert [rows[p]["status"] for p in (0.0, 0.9)] == ["ok", "ok"]
    points = {p: json.loads((out / "p-min" / p / "points.jsonl").read_text().splitlines()[0]) for p in ("0", "0.9")}
    share = {p: pt["schedule_check"]["drafted_per_step"] for p, pt in points.items()}
    assert share["0.9"] < share["0"]  # the cutoff shortened the drafts
    launch = json.loads((out / "p-min" / "0.9" / "sweep.json").read_text())["backend"]["launches"][0]["command"]
    assert "--spec-draft-n-max 2 --spec-draft-p-min 0.9" in launch
    rec = subprocess.run([sys.executable, "-m", "spectune.cli", "recommend", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert rec.returncode == 0, rec.stderr[-3000:]
    settings = json.loads((out / "recommendation" / "llamacpp-settings.json").read_text())
    assert "p_min_reason" in settings
