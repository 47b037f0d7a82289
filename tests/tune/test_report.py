"""`spectune report`: PNGs written and valid, HTML self-contained; per-category acceptance from points.jsonl."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from spectune.cli import app
from spectune.tune.report import per_category_acceptance
from helpers.results_folders import row, write_sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("tpot_vs_concurrency", "throughput_vs_concurrency", "acceptance_vs_steps", "slo_attainment_vs_concurrency")


def points() -> list[dict]:
    cats = {0: (1.0, 1.0), 2: (2.0, 2.6)}
    out = [{"steps": k, "concurrency": c, "repeat": 0, "status": "ok", "metrics": {},
            "per_category": {"writing": {"acceptance_length": cats[k][0]}, "coding": {"acceptance_length": cats[k][1]}}}
           for k in (0, 2) for c in (1, 4)]
    out.append({"steps": 2, "concurrency": 8, "status": "failed", "per_category": {"coding": {"acceptance_length": 9}}})
    return out


def test_per_category_acceptance_medians_ok_points_only():
    assert per_category_acceptance(points()) == {"coding": {0: 1.0, 2: 2.6}, "writing": {0: 1.0, 2: 2.0}}


def test_report_writes_valid_pngs_and_self_contained_html(tmp_path):
    rows = [row(k, c, 100.0 * c + k, slo_attainment=0.9) for k in (0, 2) for c in (1, 4)]
    rows.append(row(2, 8, status="failed"))
    folder = write_sweep(tmp_path / "r", rows, plan={"steps": [0, 2], "concurrency": [1, 4, 8]}, points=points())
    res = CliRunner().invoke(app, ["report", str(folder), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    for name in PLOTS:
        data = (tmp_path / "out" / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert len(data) > 5000
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert (width, height) == (600, 400)  # 6 x 4 inches at 100 dpi
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(PLOTS)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "<link" not in page
    assert "<script" not in page
    assert "Failed points (1)" in page
    assert "<table" in page


def test_report_of_bare_csv_default_output(tmp_path):
    folder = write_sweep(tmp_path / "r", [row(0, 1), row(1, 1, 150.0)])
    res = CliRunner().invoke(app, ["report", str(folder / "summary.csv")])
    assert res.exit_code == 0, res.output
    assert (folder / "report" / "report.html").is_file()
    assert len(list((folder / "report").glob("*.png"))) == 4
