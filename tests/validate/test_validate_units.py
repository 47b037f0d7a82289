"""spectune validate without servers: workload specs and traces, phase assignment, per-phase numbers, the verdict,
validate.md, the switches reader and the backends' adaptive_config plumbing."""

from __future__ import annotations

from types import SimpleNamespace

import json

import pytest
from aiohttp import web

from spectune.backends import make_backend
from spectune.backends.options import BackendOptions
from spectune.loadgen.datasets import user_prompt
from spectune.core.errors import UserError
from spectune.loadgen.record import RequestRecord
from spectune.results.primary import Primary
from spectune.results.validate_run import RunWindow, ValidateRun
from spectune.validate.plan import ValidatePlan
from spectune.validate.repeats import combine_repeats
from spectune.validate.verdict import render_markdown, verdict
from spectune.validate.phases import inflight_average, phase_index, summarize_run, tokens_between
from spectune.measure.workload import Arrival
from spectune.measure.workload import arrange_prompts, load_arrivals, parse_workload

from helpers.web import serve_app


def test_presets():
    swing = parse_workload("swing", 60)
    assert [p.label for p in swing.phases] == ["c=1", "c=32", "c=1", "c=32"]
    assert swing.bounds == [(0, 60), (60, 120), (120, 180), (180, 240)]
    assert swing.total_s == 240
    assert swing.server_concurrency() == 32
    assert swing.max_requests() is None
    ramp = parse_workload("ramp", 10)
    assert [p.concurrency for p in ramp.phases] == [1, 2, 4, 8, 16, 32, 16, 8, 4, 2, 1]
    assert ramp.total_s == 110
    assert [p.label for p in parse_workload("burst", 5, cycles=1).phases] == ["r=1/s", "r=8/s"]
    default = parse_workload(None, 1, cycles=3)
    assert default.name == "swing"
    assert [p.label for p in default.phases] == ["c=1", "c=32"] * 3


def test_phase_spec_and_its_strategy():
    wl = parse_workload("c1@30, c32@90, r4", 60, cycles=2, burstiness=0.5)
    assert [p.label for p in wl.phases] == ["c=1", "c=32", "r=4/s"] * 2
    assert wl.bounds[:3] == [(0, 30), (30, 120), (120, 180)]
    assert wl.total_s == 360
    assert wl.server_concurrency() == 64  # an open-loop phase: the cap
    assert parse_workload("c1@30,c32@90,r4", 60, max_concurrency=16).server_concurrency() == 32
    strategy = wl.strategy()
    strategy.start(100.0)
    assert strategy.limit(100.0) == 1
    assert strategy.limit(131.0) == 32
    assert strategy.limit(221.0) == 64
    assert strategy.next_arrival(100.0) is None  # closed loop
    assert strategy.next_arrival(221.0) == 220.0  # the open-loop phase's arrivals start at its start


@pytest.mark.parametrize("spec, message", [
    ("c1.5", "whole number"), ("r0", "rate must be > 0"), ("x3", "bad phase 'x3'"), ("c0", "whole number"),
    ("c1@0", "duration must be > 0"), ("c1,,c2", "bad phase ''"),
])
def test_bad_phase_specs(spec, message):
    with pytest.raises(UserError, match=message):
        parse_workload(spec)


def test_bad_workload_options():
    with pytest.raises(UserError, match="--cycles"):
        parse_workload("swing", cycles=0)
    with pytest.raises(UserError, match="--burstiness"):
        parse_workload("swing", burstiness=0)
    with pytest.raises(UserError, match="--phase-seconds"):
        parse_workload("swing", 0)


def test_arrival_trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"t": 0.5, "category": "a"}\n{"t": 0.1}\n\n{"t": 2.5, "category": "b"}\n')
    wl = load_arrivals(path, phase_s=1.0, max_concurrency=8)
    assert [a.t for a in wl.arrivals] == [0.1, 0.5, 2.5]
    assert wl.arrivals[1].category == "a"
    assert wl.bounds == [(0, 1), (1, 2), (2, 3)]
    assert [p.label for p in wl.phases] == ["trace"] * 3
    assert wl.max_requests() == 3
    assert wl.server_concurrency() == 8
    strategy = wl.strategy()
    strategy.start(10.0)
    assert strategy.next_arrival(10.0) == pytest.approx(10.1)
    assert strategy.limit(10.0) == 8
    strategy.consume()
    assert strategy.next_arrival(10.2) == pytest.approx(10.5)
    (tmp_path / "bad.jsonl").write_text('{"t": 1}\n{"t": -2}\n')
    with pytest.raises(UserError, match="line 2"):
        load_arrivals(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no arrivals"):
        load_arrivals(tmp_path / "empty.jsonl")


def test_trace_prompts_follow_categories():
    p0, p1, p2 = user_prompt("0", "a", "x"), user_prompt("1", "b", "y"), user_prompt("2", "a", "z")
    arrivals = [Arrival(0, "a"), Arrival(1), Arrival(2, "a"), Arrival(3, "a"), Arrival(4, "b")]
    assert arrange_prompts([p0, p1, p2], arrivals) == [p0, p0, p2, p0, p1]
    assert arrange_prompts([p0, p1], []) == [p0, p1]
    with pytest.raises(UserError, match="categories: a, b"):
        arrange_prompts([p0, p1], [Arrival(0, "code")])


def test_phase_index_from_send_offsets():
    bounds = [(0.0, 2.0), (2.0, 4.0)]
    assert [phase_index(t, bounds) for t in (-0.1, 0.0, 1.99, 2.0, 3.9, 5.0)] == [0, 0, 0, 1, 1, 1]


def rec(send: float, times: list[float], tokens: list[int], end: float, error: str | None = None) -> RequestRecord:
    return RequestRecord("r", "p", None, send, chunk_times=times, chunk_tokens=tokens, end_time=end,
                         completion_tokens=sum(tokens) if times else None, error=error)


def test_tokens_and_concurrency_in_a_window():
    ok = rec(0.0, [1.0, 1.5, 2.5], [1, 3, 2], 2.5)
    failed = rec(0.0, [1.2], [5], 1.3, error="boom")
    assert tokens_between([ok, failed], 0.0, 2.0) == 4
    assert tokens_between([ok], 2.0, 3.0) == 2
    a, b = rec(0.0, [], [], 2.0), rec(1.0, [], [], 3.0)
    assert inflight_average([a, b], 0.0, 4.0) == pytest.approx(1.0)
    assert inflight_average([a, b], 1.0, 2.0) == pytest.approx(2.0)
    assert inflight_average([a], 1.0, 1.0) is None


def test_summarize_run_by_phase():
    t0, bounds = 100.0, [(0.0, 2.0), (2.0, 4.0)]
    r1 = rec(100.0, [100.5, 101.0, 101.5], [1, 2, 2], 101.5)  # phase 1, TPOT 1.0 s / 4 = 250 ms
    r2 = rec(101.5, [102.0, 103.0], [1, 4], 103.0)  # sent in phase 1, streams in phase 2, TPOT 250 ms
    r3 = rec(102.5, [102.6, 103.6], [1, 1], 103.6)  # phase 2, TPOT 1000 ms
    r4 = rec(103.0, [], [], 103.1, error="HTTP 500")  # phase 2, failed
    phases, overall = summarize_run([r1, r2, r3, r4], t0, bounds, slo_tpot_ms=300)
    one, two = phases
    assert (one.phase, one.num_requests, one.num_failed) == (1, 2, 0)
    assert one.output_tokens == 5
    assert one.output_throughput_tok_s == pytest.approx(2.5)
    assert one.tpot_p50_ms == pytest.approx(250.0)
    assert one.slo_attainment == 1.0
    assert one.achieved_concurrency == pytest.approx((1.5 + 0.5) / 2)
    assert (two.num_requests, two.num_failed, two.output_tokens) == (2, 1, 7)
    assert two.output_throughput_tok_s == pytest.approx(3.5)
    assert two.tpot_p50_ms == pytest.approx(1000.0)
    assert two.slo_attainment == 0.0
    assert two.achieved_concurrency == pytest.approx((1.0 + 1.1 + 0.1) / 2)
    assert overall.phase == "all"
    assert overall.output_throughput_tok_s == pytest.approx(12 / 4)
    assert overall.slo_attainment == 0.5
    assert overall.tpot_p50_ms == pytest.approx(250.0)


def run(name: str, tput: float | None, slo: float | None = None, status: str = "ok", error: str = "") -> ValidateRun:
    steps = int(name.split(":")[1]) if name.startswith("static:") else 3
    return ValidateRun.from_dict({"run": name, "steps": steps, "status": status, "error": error,
                                  "overall": {"output_throughput_tok_s": tput, "slo_attainment": slo}, "phases": []})


STATICS = [run("static:0", 100.0, 0.99), run("static:1", 150.0, 0.95), run("static:3", 150.0, 0.80)]


def test_verdict_pass_names_the_best_static():
    v = verdict([*STATICS, run("config", 160.0, 0.96)], with_slo=True)
    assert v.passed
    assert v.best_static == 1
    assert v.margin_pct == pytest.approx(100 * 10 / 150)
    assert v.line.startswith("PASS")
    assert "K=1" in v.line
    assert "+6.7%" in v.line
    assert "SLO attainment 96.0% vs 95.0% (K=1)" in v.line
    assert v.line.endswith("decided by throughput and SLO attainment")


def test_verdict_fail_with_the_margin():
    v = verdict([*STATICS, run("config", 140.0)], with_slo=False)
    assert not v.passed
    assert v.best_static == 1
    assert v.margin_pct == pytest.approx(-100 * 10 / 150)
    assert v.line == ("FAIL: static K=1 beats the config by 6.7% in output throughput (150.0 vs 140.0 tok/s); "
                      "decided by throughput")
    assert verdict([*STATICS, run("config", 140.0)], with_slo=False, tolerance=0.1).passed  # 140 >= 0.9 x 150


def test_verdict_fails_on_lower_slo_attainment():
    v = verdict([*STATICS, run("config", 160.0, 0.90)], with_slo=True)
    assert not v.passed
    assert "K=1 meets the SLOs more often" in v.line
    assert "95.0% vs 90.0%, 5.0 points" in v.line
    assert verdict([*STATICS, run("config", 160.0, 0.90)], with_slo=False).passed
    # open loop: every run serves the same tokens, the tie goes to K=0, yet K=3 meets the SLOs more often
    tied = [run("static:0", 340.0, 0.0), run("static:3", 340.0, 0.775), run("config", 340.0, 0.75)]
    v = verdict(tied, with_slo=True)
    assert not v.passed
    assert v.best_static == 3
    assert v.margin_pct == 0.0
    assert "K=3 meets the SLOs more often than the config (77.5% vs 75.0%, 2.5 points)" in v.line
    assert verdict([*tied[:2], run("config", 340.0, 0.78)], with_slo=True).passed


def test_equal_slo_attainment_is_a_tie_the_config_passes():
    """Only a static that meets the SLOs *more* often fails the config: equal attainment (a tie) passes, in open loop
    (throughput tied too) and when the config is faster."""
    tied = [run("static:0", 340.0, 0.0), run("static:3", 340.0, 0.775), run("config", 340.0, 0.775)]
    v = verdict(tied, with_slo=True)
    assert v.passed, v.line
    assert "SLO attainment 77.5% vs 77.5% (K=3)" in v.line
    faster = verdict([*STATICS, run("config", 160.0, 0.95)], with_slo=True)
    assert faster.passed, faster.line
    assert faster.decided_by == "throughput and SLO attainment"


def phased(name: str, tput: float, atts: list[float], reqs: list[int]) -> ValidateRun:
    """A run with per-phase SLO attainment (overall: the request-weighted mean)."""
    r = run(name, tput, sum(a * n for a, n in zip(atts, reqs)) / sum(reqs))
    r.phases = [RunWindow.from_json({"phase": i + 1, "slo_attainment": a, "num_requests": n})
                for i, (a, n) in enumerate(zip(atts, reqs))]
    return r


def test_unattainable_slos_do_not_decide_a_phase():
    # phase 2 (c=32): no static meets the TPOT SLO for most requests; the config's 1 point less there is noise
    runs = [phased("static:0", 144.0, [1.00, 0.02], [40, 130]), phased("static:1", 145.0, [0.95, 0.05], [50, 130]),
            phased("config", 146.0, [1.00, 0.01], [50, 130])]
    v = verdict(runs, with_slo=True)
    assert v.passed
    assert v.decided_by == "throughput and SLO attainment"
    assert v.slo_phases == [1]
    assert "SLO attainment 100.0% vs 95.0% (K=1, phase 1)" in v.line


def test_a_phase_the_slos_decide_still_fails_the_config():
    runs = [phased("static:0", 144.0, [1.00, 0.02], [40, 130]), phased("config", 146.0, [0.90, 0.30], [50, 130])]
    v = verdict(runs, with_slo=True)
    assert not v.passed  # far better where nothing meets the SLOs, worse where K=0 does
    assert "(100.0% vs 90.0%, 10.0 points, phase 1)" in v.line


def test_throughput_decides_when_no_phase_is_attainable():
    runs = [phased("static:0", 144.0, [0.30, 0.02], [40, 130]), phased("config", 146.0, [0.10, 0.01], [50, 130])]
    v = verdict(runs, with_slo=True)
    assert v.passed
    assert v.decided_by == "throughput"
    assert v.slo_phases == []
    assert "SLO attainment did not count" in v.line
    assert v.line.endswith("decided by throughput")


def test_verdict_without_something_to_compare():
    failed = verdict([*STATICS, run("config", None, status="failed", error="server never started")], True)
    assert not failed.passed
    assert failed.line == "FAIL: the config run failed (server never started)"
    lonely = verdict([run("static:0", None, status="failed"), run("config", 10.0)], False)
    assert not lonely.passed
    assert "no static" in lonely.line


def test_markdown_has_a_table_per_phase():
    phase = {"output_throughput_tok_s": 12.5, "tpot_p50_ms": 4.0, "tpot_p99_ms": 9.0, "num_requests": 3,
             "num_failed": 0}
    meta = {"status": "done", "config": {"path": "c.json", "format": "sglang-adaptive", "candidate_steps": [1, 3]},
            "plan": {"steps": [0, 3], "workload": {"name": "swing", "total_s": 4, "phases": [
                {"phase": 1, "label": "c=1", "start_s": 0.0, "end_s": 2.0},
                {"phase": 2, "label": "c=32", "start_s": 2.0, "end_s": 4.0}]}},
            "runs": [{"run": "static:0", "status": "ok", "overall": phase, "phases": [phase, phase]},
                     {"run": "static:3", "status": "failed", "error": "no server", "overall": {}, "phases": []}],
            "verdict": {"line": "FAIL: the config run failed (it did not run)"}}
    md = render_markdown(meta)
    assert "**FAIL: the config run failed (it did not run)**" in md
    assert "## Phase 1: c=1 (0-2 s)" in md
    assert "## Phase 2: c=32 (2-4 s)" in md
    assert md.count("| static:0 | 12.5 * | 4.00 | 9.00 |") == 3
    assert "| static:3 | failed: no server |" in md


def test_repeats_alternate_the_order():
    plan = ValidatePlan(config="c.json", steps=(0, 2), workload=parse_workload("c1@1", 1.0, None, 1.0, 8, 0),
                        repeats=3)
    assert plan.run_order(3) == [("static:0", 0, 1), ("static:2", 2, 1), ("config", 3, 1),
                                 ("config", 3, 2), ("static:2", 2, 2), ("static:0", 0, 2),
                                 ("static:0", 0, 3), ("static:2", 2, 3), ("config", 3, 3)]
    with pytest.raises(UserError, match="--repeats must be at least 1"):
        ValidatePlan(config="c.json", steps=(0,), workload=plan.workload, repeats=0).validate()


def test_combine_repeats_means_and_sums():
    def rep(name, repeat, tput, p50, reqs, status="ok"):
        window = {"phase": "all", "output_throughput_tok_s": tput, "tpot_p50_ms": p50, "num_requests": reqs,
                  "num_failed": 0, "slo_attainment": None, "acceptance_length": 1.5, "label": "all"}
        return ValidateRun.from_dict({"run": name, "steps": 0 if name != "config" else 3, "repeat": repeat,
                                      "status": status, "error": None if status == "ok" else "died",
                                      "overall": window, "phases": [dict(window, phase=1)]})

    runs = [rep("static:0", 1, 100.0, 10.0, 5), rep("config", 1, 120.0, 8.0, 6),
            rep("config", 2, 90.0, 12.0, 4), rep("static:0", 2, 110.0, 20.0, 7)]
    combined = combine_repeats(runs)
    assert [r.run for r in combined] == ["static:0", "config"]
    s0, cfg = combined
    assert s0.repeats == 2
    assert s0.throughput_by_repeat == [100.0, 110.0]
    assert s0.overall.output_throughput_tok_s == pytest.approx(105.0)
    assert s0.overall.tpot_p50_ms == pytest.approx(15.0)
    assert s0.overall.num_requests == 12
    assert s0.overall.slo_attainment is None
    assert s0.phases[0].phase == 1
    assert cfg.overall.output_throughput_tok_s == pytest.approx(105.0)
    v = verdict(combined, with_slo=False)  # 105 vs 105: a tie passes
    assert v.passed
    assert v.best_static == 0
    assert combine_repeats(runs[:2]) == runs[:2]  # measured once: unchanged
    broken = combine_repeats([*runs[:3], rep("static:0", 2, 0.0, 0.0, 0, status="failed")])
    assert broken[0].status == "failed"
    assert broken[0].error == "repeat 2: died"
    meta = {"status": "done", "config": {}, "runs": [r.to_dict() for r in runs], "verdict": None,
            "plan": {"steps": [0], "repeats": 2, "workload": {"name": "x", "total_s": 1, "phases": [
                {"phase": 1, "label": "c=1", "start_s": 0.0, "end_s": 1.0}]}}}
    md = render_markdown(meta)
    assert "2 repeats in alternating order" in md
    assert "| static:0 | 100.0 | 110.0 |" in md
    assert "| config | 120.0 | 90.0 |" in md
    assert "static:0 #1, config #1, config #2, static:0 #2" in md


def _metrics_app(text: str) -> web.Application:
    app = web.Application()
    app.router.add_get("/health", lambda _: web.Response(text="ok"))
    app.router.add_get("/metrics", lambda _: web.Response(text=text, content_type="text/plain"))
    return app


SWITCHES_PAGE = ('# TYPE spectune:spec_num_steps_switches counter\n'
                 'spectune:spec_num_steps_switches_total{model_name="m"} 7.0\n')


async def test_switches_come_from_the_metrics_counter():
    async with serve_app(_metrics_app(SWITCHES_PAGE)) as url:
        backend = make_backend("sglang", BackendOptions(model="m", endpoints={-1: url}))
        await backend.start(3)
        assert await backend.switches() == (7.0, "spectune:spec_num_steps_switches_total")


async def test_sglang_switches_come_from_its_log_without_the_counter(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("x\nAdaptive spec params updated: steps 3 -> 1 (ema_accept_len=0.40)\ny\n"
                   "Adaptive spec params updated: steps 1 -> 0 (ema_accept_len=0.10)\n")
    async with serve_app(_metrics_app("# no counters\n")) as url:
        backend = make_backend("sglang", BackendOptions(model="m"))
        backend.server = SimpleNamespace(base_url=url, log_path=log)  # what start() leaves after a launch
        assert await backend.switches() == (2.0, "sglang:server log")


async def test_vllm_has_no_switches():
    async with serve_app(_metrics_app("# no counters\n")) as url:
        backend = make_backend("vllm", BackendOptions(model="m", endpoints={-1: url}))
        await backend.start(3)
        assert await backend.switches() is None


def test_local_backend_launches_the_engine_with_the_config(tmp_path):
    cfg = tmp_path / "a.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}}))
    backend = make_backend("local", BackendOptions(adaptive_config=str(cfg)))
    argv = backend.build_argv(3, "127.0.0.1", 9)
    opts = json.loads(argv[argv.index("--options") + 1])
    assert opts["adaptive_config"] == str(cfg.resolve())
    assert opts["num_steps"] == 3
    assert "adaptive_config" not in json.loads(make_backend("local", BackendOptions()).build_argv(
        1, "h", 9)[argv.index("--options") + 1])
    cfg.write_text("[[1, 4, 2], [3, 8, 1]]")  # overlapping ranges
    with pytest.raises(UserError, match="overlap"):
        make_backend("local", BackendOptions(adaptive_config=str(cfg)))


RECOMMENDED_K1 = Primary("static", 1, "no slot gains")


def intervals(table: dict[tuple[str, str], tuple[float, float]]):
    """A ``ratio(a, b)`` callable from fixed paired intervals (run a / run b)."""
    return lambda a, b: table.get((a, b))


def test_static_recommendation_agreed_when_no_static_beats_it_and_the_config_ties():
    runs = [run("static:0", 140.0), run("static:1", 150.0), run("static:2", 152.0), run("config", 149.0)]
    ratio = intervals({("config", "static:1"): (0.97, 1.02), ("static:2", "static:1"): (0.98, 1.05),
                       ("static:0", "static:1"): (0.90, 0.96)})
    v = verdict(runs, with_slo=False, ratio=ratio, recommended=RECOMMENDED_K1)
    assert v.passed
    assert v.recommended_static == 1
    assert v.line.startswith("PASS: agrees with recommend, which named static K=1")
    assert "K=2 measured 152.0 tok/s, not beyond the interval" in v.line
    assert "and the config ties it, 149.0 tok/s" in v.line
    assert (v.ratio_low, v.ratio_high) == (0.97, 1.02)


def test_a_config_wholly_ahead_of_the_recommended_static_is_said_to_run_ahead():
    runs = [run("static:0", 140.0), run("static:1", 150.0), run("config", 155.0)]
    ratio = intervals({("config", "static:1"): (1.01, 1.06), ("static:0", "static:1"): (0.90, 0.96)})
    v = verdict(runs, with_slo=False, ratio=ratio, recommended=RECOMMENDED_K1)
    assert v.passed
    assert "and the config runs ahead of it, 155.0 tok/s" in v.line


def test_static_recommendation_refuted_by_a_faster_static():
    runs = [run("static:0", 140.0), run("static:1", 150.0), run("static:2", 160.0), run("config", 150.0)]
    ratio = intervals({("config", "static:1"): (0.98, 1.02), ("static:2", "static:1"): (1.03, 1.10)})
    v = verdict(runs, with_slo=False, ratio=ratio, recommended=RECOMMENDED_K1)
    assert not v.passed
    assert v.best_static == 2
    assert "recommend named static K=1 (no per-batch-size gain), but static K=2 beats it" in v.line


def test_static_recommendation_fails_when_the_config_falls_behind_its_num_steps():
    runs = [run("static:1", 150.0), run("config", 140.0)]
    v = verdict(runs, with_slo=False, ratio=intervals({("config", "static:1"): (0.90, 0.96)}),
                recommended=RECOMMENDED_K1)
    assert not v.passed
    assert v.line.startswith("FAIL: the config falls behind static K=1, the num_steps it stands for")


def test_schedule_recommendation_keeps_the_ordinary_rule():
    runs = [run("static:1", 150.0), run("config", 149.0)]
    ratio = intervals({("config", "static:1"): (0.97, 1.02)})
    v = verdict(runs, with_slo=False, ratio=ratio, recommended=Primary("schedule", None, ""))
    assert not v.passed  # 149 < 150 with no tolerance: the schedule was meant to beat every static
    assert v.recommended_static is None
