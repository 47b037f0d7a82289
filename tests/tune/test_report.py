"""`spectune report`: PNGs written and valid, HTML self-contained; per-category acceptance from points.jsonl."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spectune.cli import app, main
from spectune.tune.report import per_category_acceptance
from helpers.paths import EXAMPLES
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
    assert page.count('src="data:image/png;base64,') == len(PLOTS) + 2  # + the Pareto plot and the heatmap
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
    assert len(list((folder / "report").glob("*.png"))) == 6  # + the Pareto plot and the speedup heatmap


def test_report_draws_the_choice(tmp_path):
    """The Pareto plot and the speedup heatmap are written, and the heatmap's numbers are the cells' ratios to K=0."""
    from spectune.results.reader import load_results
    from spectune.tune.recommend import RecommendOptions, recommend
    from spectune.tune.report_choice import speedups

    rows = [row(k, c, {0: 100.0, 1: 130.0, 2: 90.0}[k] * c ** (0.5 if k else 0.7)) for k in (0, 1, 2) for c in (1, 8)]
    folder = write_sweep(tmp_path / "r", rows)
    assert CliRunner().invoke(app, ["report", str(folder), "-o", str(tmp_path / "out")]).exit_code == 0
    for name in ("pareto_throughput_vs_tpot", "speedup_heatmap"):
        assert (tmp_path / "out" / f"{name}.png").read_bytes().startswith(PNG_MAGIC)
    sp = speedups(recommend(load_results(folder), RecommendOptions()))
    assert sp[(1, 1)].value == 1.3
    assert sp[(2, 8)].value == (90.0 * 8 ** 0.5) / (100.0 * 8 ** 0.7)
    assert sp[(0, 8)].value == 1.0


def test_report_without_num_steps_0_has_no_heatmap(tmp_path):
    folder = write_sweep(tmp_path / "r", [row(k, c, 100.0 + k) for k in (1, 2) for c in (1, 4)])
    assert CliRunner().invoke(app, ["report", str(folder), "-o", str(tmp_path / "out")]).exit_code == 0
    assert (tmp_path / "out" / "pareto_throughput_vs_tpot.png").exists()
    assert not (tmp_path / "out" / "speedup_heatmap.png").exists()


EXAMPLE = EXAMPLES / "smollm2-cpu"


def test_sweep_page_leads_with_the_answer(tmp_path):
    """The example sweep's page (recommend names static K=1 there): the answer section comes first with one line per
    engine and K=1's paired interval against K=0, then the heatmap, then the plots; the plan is linked, not dumped."""
    res = CliRunner().invoke(app, ["report", str(EXAMPLE / "sweep"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "out" / "report.html").read_text()
    answer = page[page.index('<section id="answer"'):page.index("</section>")]
    assert page.index('id="answer"') < page.index('id="heatmap"') < page.index("<h2>Plots</h2>")
    assert "Static num_steps K=1 for every engine" in answer
    assert "1.26x [1.21, 1.31] at concurrency 1, 0.99x [0.97, 1.02] at concurrency 32" in answer
    engines = [(e, re.sub(r"<[^>]+>", "", code)) for e, code in re.findall(r"<li><b>([^<]+)</b> <code>(.+?)</code>",
                                                                             answer)]
    assert engines == [("SGLang", "--speculative-num-steps 1 --speculative-num-draft-tokens 2"),
                       ("vLLM", "&quot;num_speculative_tokens&quot;: 1"), ("TensorRT-LLM", "max_draft_len 1"),
                       ("llama.cpp", "--spec-draft-n-max 1")]
    assert "<pre>" not in page
    assert '"noise_band"' not in page
    assert re.search(r'<a href="(\.\./)+[^"]*smollm2-cpu/sweep/sweep.json">sweep.json</a>', page)  # relative


def test_validation_page_leads_with_the_verdict(tmp_path):
    res = CliRunner().invoke(app, ["report", str(EXAMPLE / "validate"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "out" / "report.html").read_text()
    assert '<section id="answer" class="answer pass"><p class="lead"><span class="verdict">PASS</span>: agrees' in page
    assert page.index('id="answer"') < page.index("Each phase")
    assert ('<td class="text">1: c=1</td><td>59.9</td><td>73.3</td><td>78.4</td><td>74.5</td><td>71.6</td>'
            "<td>77.9</td><td>K=2</td><td>0.993x [0.939, 1.043]</td>") in page


def test_validation_page_links_gzipped_requests(tmp_path):
    """docs/examples/smollm2-h200 ships its validation's requests as requests.jsonl.gz: the page links that file."""
    res = CliRunner().invoke(app, ["report", str(EXAMPLES / "smollm2-h200" / "validate"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert ">requests.jsonl.gz</a>" in (tmp_path / "out" / "report.html").read_text()


def test_gate_page_leads_with_pass_or_fail_per_metric(tmp_path):
    base = write_sweep(tmp_path / "base", [row(k, c, 100.0 * c + k) for k in (0, 2) for c in (1, 4)])
    cur = write_sweep(tmp_path / "cur", [row(k, c, (100.0 * c + k) * (0.8 if (k, c) == (2, 4) else 1))
                                         for k in (0, 2) for c in (1, 4)])
    res = CliRunner().invoke(app, ["report", str(cur), "--baseline", str(base), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "out" / "report.html").read_text()
    answer = page[page.index('<section id="answer"'):page.index("</section>")]
    assert '<span class="verdict">FAIL</span>: 1 of' in answer
    assert '<span class="fail-cell">FAIL</span> <b>output tokens/s</b>: 1 of 4 cells failed (K=2 c=4)' in answer
    assert '<span class="pass-cell">pass</span> <b>TPOT p50 ms</b>: 0 of 4 cells failed' in answer


def test_report_of_a_folder_without_results_is_a_user_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["spectune", "report", str(tmp_path)])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "no summary.csv or points.jsonl: is this a 'spectune sweep' results folder?" in err
    assert "Traceback" not in err


def test_answer_of_a_schedule_gives_llamacpp_its_best_static(tmp_path):
    """Where recommend names a per-batch-size schedule (K=2 1.5x ahead at concurrency 1, K=0 at 8), SGLang, vLLM and
    TensorRT-LLM get the schedule with its interval; llama.cpp, one static num_steps, gets the best static K=0."""
    from spectune.results.reader import load_results
    from spectune.tune.report_choice import answer, default_recommendation

    thr = {(0, 1): 100, (2, 1): 150, (0, 8): 800, (2, 8): 500}
    rows = [row(k, c, v * (1 + 0.002 * r), rep=r) for (k, c), v in thr.items() for r in range(3)]
    head, lines = answer(default_recommendation(load_results(write_sweep(tmp_path / "s", rows))))
    assert head == "A per-batch-size schedule: batch 1-2: K=2, batch 3-: K=0"
    assert [(e, s) for e, s, _ in lines] == [
        ("SGLang", "sglang-adaptive-custom.json (batch 1-2: K=2, batch 3-: K=0)"),
        ("vLLM", "num_speculative_tokens_per_batch_size (batch 1-2: K=2, batch 3-: K=0)"),
        ("TensorRT-LLM", "draft_len_schedule (batch 1-2: K=2, batch 3-: K=0)"),
        ("llama.cpp", "no draft model (one static num_steps: K=0)")]
    assert lines[0][2] == ("vs K=0: 1.50x [1.49, 1.51] at concurrency 1, K=0 at concurrency 8 (best K=2 there: "
                           "0.62x [0.62, 0.63])")


@pytest.mark.parametrize("concurrencies", [(1, 4), (1, 2, 4, 8, 16, 32)])
def test_every_plot_keeps_its_text_inside_the_image(tmp_path, monkeypatch, concurrencies):
    """Titles, axis labels, tick labels and cell numbers of every plot lie inside the saved image (a narrow heatmap,
    two concurrencies, once cut its title at both edges)."""
    import matplotlib.pyplot  # noqa: F401 - imported before the patch: pyplot wraps Figure.savefig on import
    from matplotlib.figure import Figure

    outside: list[str] = []
    save = Figure.savefig

    def checked_savefig(fig, path, *a, **kw):
        """Before saving: the box around everything drawn (matplotlib's tight bbox, inches) within the figure's."""
        tight = fig.get_tightbbox(fig.canvas.get_renderer())
        w, h = fig.get_size_inches()
        if tight.x0 < -0.01 or tight.y0 < -0.01 or tight.x1 > w + 0.01 or tight.y1 > h + 0.01:
            outside.append(f"{Path(path).name}: drawn {tight.bounds} in a {w} x {h} in figure")
        return save(fig, path, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", checked_savefig)
    rows = [row(k, c, 100.0 * c ** (0.6 if k else 0.7) * (1.2 if k == 1 else 1.0)) for k in (0, 1, 3)
            for c in concurrencies]
    folder = write_sweep(tmp_path / "r", rows)
    assert CliRunner().invoke(app, ["report", str(folder), "-o", str(tmp_path / "out")]).exit_code == 0
    assert (tmp_path / "out" / "speedup_heatmap.png").is_file()
    assert outside == []
