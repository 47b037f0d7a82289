"""`spectune gate`: exit 0 on identical input, 1 on a doctored regression (naming the cell), 2 on bad input."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import pytest

from spectune.cli import main
from spectune.tune.gate import GateLimits, gate_checks
from spectune.results.reader import load_results
from helpers.results_folders import row, write_sweep

BASE = {(k, c): 100.0 * c + 10 * k for k in (0, 1, 3) for c in (1, 8)}


def sweep(tmp_path, name, tpot=None, thr=None, repeats=(0,), **kw):
    """Folder with every (K, c) of BASE; ``tpot``/``thr``: {(K, c): [value per repeat]} overrides."""
    rows = []
    for (k, c), v in BASE.items():
        for i, rep in enumerate(repeats):
            over = {}
            if tpot and (k, c) in tpot:
                over["tpot_p50_ms"] = tpot[(k, c)][i]
            if thr and (k, c) in thr:
                over["output_throughput_tok_s"] = thr[(k, c)][i]
            rows.append(row(k, c, over.pop("output_throughput_tok_s", v), rep=rep, **{**kw, **over}))
    return write_sweep(tmp_path / name, rows)


def cli(monkeypatch, capsys, *args):
    """Run ``spectune gate`` through the real entry point; returns (exit code, stdout + stderr, spaces squashed)."""
    monkeypatch.setattr(sys, "argv", ["spectune", "gate", *map(str, args)])
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    return exc.value.code, " ".join((out.out + out.err).split())


def test_identical_input_passes(tmp_path, monkeypatch, capsys):
    base = sweep(tmp_path, "base")
    code, out = cli(monkeypatch, capsys, "--baseline", base, "--current", base / "summary.csv")
    assert code == 0
    assert "gate passed" in out


def test_doctored_regression_exits_1_and_names_the_cell(tmp_path, monkeypatch, capsys):
    base = sweep(tmp_path, "base")
    cur = sweep(tmp_path, "cur", tpot={(3, 8): [12.0]})  # TPOT p50 10 -> 12 ms: +20% > 5%
    junit, md = tmp_path / "gate.xml", tmp_path / "gate.md"
    code, out = cli(monkeypatch, capsys, "--baseline", base, "--current", cur, "--junit", junit, "--markdown", md)
    assert code == 1
    assert "K=3 c=8" in out
    assert "tpot" in out
    failures = [(case.get("classname"), case.get("name"), case.find("failure").get("message"))
                for case in ET.parse(junit).getroot() if case.find("failure") is not None]
    assert failures == [("steps3.concurrency8", "tpot", "K=3 c=8 tpot: baseline 10, current 12, limit rise <= 5.0%")]
    text = md.read_text()
    assert "❌ 1 regression(s)" in text
    assert "| K=3 c=8 | tpot | 10 | 12 | rise <= 5.0% | ❌ FAIL |" in text
    # a looser limit passes the same data
    code, _ = cli(monkeypatch, capsys, "--baseline", base, "--current", cur, "--max-tpot-regression", "25")
    assert code == 0


def test_throughput_acceptance_and_failed_cells(tmp_path):
    base = load_results(sweep(tmp_path, "base"))
    cur_rows = [row(k, c, v * (0.9 if (k, c) == (1, 1) else 1.0), **({"acceptance_length": 1.5} if (k, c) == (3, 8)
                                                                      else {}))
                for (k, c), v in BASE.items()]
    checks, _ = gate_checks(base, load_results(write_sweep(tmp_path / "cur", cur_rows)), GateLimits())
    fails = {(c.steps, c.concurrency, c.name) for c in checks if c.outcome == "fail"}
    # throughput -10% at (1, 1); acceptance at (3, 8): 1 + 1.533 -> 1.5 drops by 1.03 > 0.1 tokens
    assert fails == {(1, 1, "throughput"), (3, 8, "acceptance")}
    failed_rows = [row(k, c, v, status="failed" if (k, c) == (0, 8) else "ok") for (k, c), v in BASE.items()]
    checks, _ = gate_checks(base, load_results(write_sweep(tmp_path / "cur2", failed_rows)), GateLimits())
    assert [(c.steps, c.concurrency) for c in checks if c.name == "status" and c.outcome == "fail"] == [(0, 8)]


def test_regression_within_repeat_spread_is_not_counted(tmp_path):
    # baseline repeats 9..11 ms, current 10.4..12 ms: median 10 -> 11 (+10% > 5%) but the ranges overlap
    base = load_results(sweep(tmp_path, "base", tpot={(3, 8): [9.0, 10.0, 11.0]}, repeats=(0, 1, 2)))
    cur = load_results(sweep(tmp_path, "cur", tpot={(3, 8): [10.4, 11.0, 12.0]}, repeats=(0, 1, 2)))
    check = next(c for c in gate_checks(base, cur, GateLimits())[0] if (c.steps, c.concurrency, c.name) == (3, 8, "tpot"))
    assert check.outcome == "pass"
    assert "within the repeats' spread" in check.message
    cur = load_results(sweep(tmp_path, "cur2", tpot={(3, 8): [11.5, 12.0, 12.5]}, repeats=(0, 1, 2)))
    check = next(c for c in gate_checks(base, cur, GateLimits())[0] if (c.steps, c.concurrency, c.name) == (3, 8, "tpot"))
    assert check.outcome == "fail"


def test_slo_attainment_floor(tmp_path):
    base = load_results(sweep(tmp_path, "base", slo_attainment=0.95))
    cur = load_results(sweep(tmp_path, "cur", slo_attainment=0.85))
    fails = [c for c in gate_checks(base, cur, GateLimits(min_slo_attainment=0.9))[0] if c.outcome == "fail"]
    assert {c.name for c in fails} == {"slo_attainment"}
    assert len(fails) == len(BASE)


@pytest.mark.parametrize("case", ["missing", "garbage", "no-common", "nan-only"])
def test_bad_input_exits_2(tmp_path, monkeypatch, capsys, case):
    base = sweep(tmp_path, "base")
    if case == "missing":
        cur, expect = tmp_path / "nope", "no such file"
    elif case == "garbage":
        cur, expect = tmp_path / "garbage.csv", "missing column"
        cur.write_bytes(b"\x00\x01 not,a\ncsv")
    elif case == "no-common":
        cur, expect = write_sweep(tmp_path / "other", [row(7, 64, 1.0)]), "no (num_steps, concurrency) cell"
    else:
        cur, expect = sweep(tmp_path, "nan", tpot_p50_ms=None), "'tpot_p50_ms' has no values"
    code, out = cli(monkeypatch, capsys, "--baseline", base, "--current", cur)
    assert code == 2
    assert expect in out


def test_summary_md_appends_each_metric_with_interval_and_verdict(tmp_path, monkeypatch, capsys):
    """--summary-md appends (GitHub's step summary file may hold earlier steps' text): a FAIL headline naming the
    metric, then the failed check's row with baseline, current, change, the repeats' intervals, limit and verdict."""
    base = sweep(tmp_path, "base", tpot={(3, 8): [9.5, 10.5]}, repeats=(0, 1))
    cur = sweep(tmp_path, "cur", tpot={(3, 8): [11.8, 12.2]}, repeats=(0, 1))  # median 10 -> 12 ms, ranges apart
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    code, _ = cli(monkeypatch, capsys, "--baseline", base, "--current", cur, "--summary-md", summary)
    assert code == 1
    text = summary.read_text()
    assert text.startswith("earlier step\n## spectune gate: FAIL (TPOT p50 ms)\n")
    assert "| K=3 c=8 | TPOT p50 ms | 10 | 12 | +20.0% | [9.5, 10.5] / [11.8, 12.2] | rise <= 5.0% | FAIL |" in text


def test_summary_md_of_a_pass(tmp_path, monkeypatch, capsys):
    base = sweep(tmp_path, "base")
    summary = tmp_path / "out" / "summary.md"
    code, _ = cli(monkeypatch, capsys, "--baseline", base, "--current", base, "--summary-md", summary)
    assert code == 0
    assert summary.read_text().startswith(f"## spectune gate: PASS\n\n0 failed, {len(BASE) * 4 - 2} passed, 0 skipped")
