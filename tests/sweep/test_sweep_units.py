"""spectune sweep building blocks without servers: plan parsing and defaults, point status, per-category
acceptance, the results folder (checks, resume clean-up, truncation, summary columns) and the final table."""

from __future__ import annotations

import csv
import json
import re

import pytest
from rich.console import Console

from spectune.backends.snapshots import Acceptance
from spectune.core.errors import UserError
from spectune.loadgen.record import RequestRecord
from spectune.commands.sweep import parse_endpoints
from spectune.sweep.display import summarize, summary_table
from spectune.measure.acceptance import per_category_points, spec_decode_acceptance
from spectune.measure.status import point_status
from spectune.results.folder import SweepFolder
from spectune.results.point import SweepPoint
from spectune.results.schema import SUMMARY_COLUMNS
from spectune.results.sweep_meta import SweepMeta
from spectune.sweep.run import failed_point
from spectune.commands.options import parse_int_list
from spectune.sweep.plan import SweepPlan
from helpers.paths import DOCS as DOCS_DIR

DOCS = DOCS_DIR


def rec(i: int, ok: bool = True, category: str | None = "chat", tokens: int = 5, spec: dict | None = None,
        error: str | None = None) -> RequestRecord:
    r = RequestRecord(request_id=f"r{i}", prompt_id=str(i), category=category, send_time=0.0)
    if ok:
        r.chunk_times, r.chunk_tokens, r.completion_tokens, r.end_time = [0.1, 0.2], [1, tokens - 1], tokens, 0.3
    else:
        r.error, r.end_time = error or "HTTP 500: boom", 0.1
    if spec is not None:
        r.server_stats = {"spec_decode": spec}
    return r


# -- plan ---------------------------------------------------------------------------------------------------

def test_parse_int_list_sorts_and_dedupes():
    assert parse_int_list("0,1,2,3,5", "steps", 0) == [0, 1, 2, 3, 5]
    assert parse_int_list(" 3, 1,1 ", "steps", 0) == [1, 3]
    assert parse_int_list("16,4", "concurrency", 1) == [4, 16]


@pytest.mark.parametrize("text,what,minimum,words", [
    ("", "steps", 0, "bad --steps list"),
    ("1,,2", "steps", 0, "bad --steps list"),
    ("1,a", "steps", 0, "bad --steps value 'a'"),
    ("1.5", "concurrency", 1, "bad --concurrency value '1.5'"),
    ("-1,2", "steps", 0, "--steps -1 is negative"),
    ("0,4", "concurrency", 1, "--concurrency 0 is not positive"),
])
def test_parse_int_list_errors(text, what, minimum, words):
    with pytest.raises(UserError) as err:
        parse_int_list(text, what, minimum)
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_plan_defaults_and_limits():
    plan = SweepPlan(num_prompts=80)
    # max(num_prompts, 4 x concurrency), capped at max(num_prompts, 1024)
    assert [plan.requests_for(c) for c in (1, 16, 64, 512)] == [80, 80, 256, 1024]
    assert SweepPlan(num_prompts=2000).requests_for(512) == 2000
    assert SweepPlan(requests_per_point=10).requests_for(64) == 10
    assert [plan.warmup_for(c) for c in (1, 2, 16)] == [1, 2, 4]
    assert SweepPlan(warmup_requests=0).warmup_for(16) == 0
    # 10% of 20 requests = 2 failures allowed: the third stops the point (it is failed whatever happens next)
    c = SweepPlan(max_failure_rate=0.1, duration_per_point_s=30.0).constraints(20)
    assert (c.max_requests, c.max_failures, c.max_duration_s) == (20, 3, 30.0)
    assert SweepPlan(max_failure_rate=0.0).constraints(8).max_failures == 1
    assert SweepPlan(steps=(0, 2), concurrency=(1, 4), repeats=2).points() == [
        (0, 1, 0), (0, 1, 1), (0, 4, 0), (0, 4, 1), (2, 1, 0), (2, 1, 1), (2, 4, 0), (2, 4, 1)]
    assert SweepPlan(steps=(0, 3)).to_json()["steps"] == [0, 3]
    key = SweepPlan(steps=(2,), concurrency=(4,)).points()[0]
    assert (key.steps, key.concurrency, key.repeat, key.cell) == (2, 4, 0, (2, 4))
    assert json.dumps(key) == "[2, 4, 0]"  # a PointKey writes as the bare tuple did


def test_sweep_and_validate_plans_share_one_load_spec_and_keep_their_json_order():
    """Both plans extend LoadSpec; their JSON objects keep the keys' file order (sweep.json / validate.json)."""
    from spectune.measure.load_settings import LoadSpec
    from spectune.measure.workload import parse_workload
    from spectune.validate.plan import ValidatePlan

    load = ["dataset", "num_prompts", "max_tokens", "temperature", "seed", "ignore_eos", "api", "slo_ttft_ms",
            "slo_tpot_ms", "warmup_requests"]
    assert list(LoadSpec.keys()) == load
    sweep = SweepPlan(max_tokens=7, api="completions")
    assert isinstance(sweep, LoadSpec) and (sweep.max_tokens, sweep.api) == (7, "completions")
    assert list(sweep.to_json()) == ["steps", "concurrency", "repeats", *load, "requests_per_point",
                                     "duration_per_point_s", "max_failure_rate", "design", "order", "drift_check",
                                     "objective", "budget_points", "budget_s", "confidence", "noise_band",
                                     "early_stop"]
    check = ValidatePlan(config="c.json", steps=(0,), workload=parse_workload("c1@1"), num_prompts=5)
    assert isinstance(check, LoadSpec) and check.num_prompts == 5
    assert list(check.to_json()) == ["config", "steps", "workload", *load, "tolerance", "max_failure_rate",
                                     "repeats", "config_static", "servers"]
    with pytest.raises(UserError, match="--max-tokens"):
        SweepPlan(max_tokens=0).validate()
    with pytest.raises(UserError, match="--max-tokens"):
        ValidatePlan(config="c.json", steps=(0,), workload=parse_workload("c1@1"), max_tokens=0).validate()


@pytest.mark.parametrize("kwargs,words", [
    ({"repeats": 0}, "--repeats"), ({"max_failure_rate": 1.5}, "--max-failure-rate"), ({"api": "rest"}, "--api"),
    ({"duration_per_point_s": 0.0}, "--duration"), ({"concurrency": (0,)}, "--concurrency"),
    ({"slo_tpot_ms": -1.0}, "--slo-tpot-ms"), ({"max_tokens": 0}, "--max-tokens"),
])
def test_plan_validate(kwargs, words):
    with pytest.raises(UserError, match=re.escape(words)):
        SweepPlan(**kwargs).validate()


def test_parse_endpoints():
    assert parse_endpoints(["0=http://a:1", "3=http://b:2/v1"]) == {0: "http://a:1", 3: "http://b:2/v1"}
    assert parse_endpoints(["http://h:8000/?x=1"]) == {-1: "http://h:8000/?x=1"}
    assert parse_endpoints([]) is None
    for bad, words in ((["x=http://a"], "bad --endpoint"), (["-2=http://a"], "num_steps must be >= 0"),
                       (["1=http://a", "1=http://b"], "two --endpoint values for num_steps 1")):
        with pytest.raises(UserError, match=re.escape(words)):
            parse_endpoints(bad)


# -- point objects ------------------------------------------------------------------------------------------

def test_point_status():
    ten = [rec(i) for i in range(9)] + [rec(9, ok=False)]
    assert point_status(ten, 0.1) == ("ok", "")  # 1 of 10 = 10%: not more than the limit
    two = [rec(i) for i in range(8)] + [rec(8, ok=False, error="HTTP 503: busy"), rec(9, ok=False)]
    status, error = point_status(two, 0.1)
    assert status == "failed"
    assert error.startswith("2 of 10 requests failed")
    assert "HTTP 503: busy" in error
    assert point_status([], 0.1) == ("failed", "no measured request finished")
    empty = RequestRecord("r0", "0", None, 0.0, end_time=1.0)  # no error, but no output either
    assert point_status([empty], 1.0)[0] == "failed"
    assert point_status([rec(0, ok=False)], 1.0)[0] == "failed"  # 100% allowed, yet nothing produced output


def test_spec_decode_acceptance():
    a = rec(0, spec={"verify_steps": 4, "accepted_tokens": 6})
    b = rec(1, spec={"verify_steps": 6, "accepted_tokens": 9})
    assert spec_decode_acceptance([a, b, rec(2, ok=False)]) == pytest.approx(1 + 15 / 10)  # failed one ignored
    assert spec_decode_acceptance([a, rec(3)]) is None  # a successful record without counters
    assert spec_decode_acceptance([rec(4, spec={"verify_steps": 0, "accepted_tokens": 0})]) == 1.0


def test_per_category_points_sources():
    recs = [rec(0, category="code", spec={"verify_steps": 2, "accepted_tokens": 4}),
            rec(1, category="code", spec={"verify_steps": 2, "accepted_tokens": 2}),
            rec(2, category="chat"), rec(3, category=None)]
    asked: list[list[str]] = []

    def ask(records):
        asked.append([r.request_id for r in records])
        if records[0].category == "chat":
            return Acceptance(2.5, source="sglang:per-request")
        return Acceptance(3.0, source="proxy:tokens-per-chunk")

    out = per_category_points(recs, 2.0, 3, ask)
    assert (out["code"]["acceptance_length"], out["code"]["acceptance_length_source"]) == (2.5,
                                                                                           "spec_decode:per-request")
    assert (out["chat"]["acceptance_length"], out["chat"]["acceptance_length_source"]) == (2.5, "sglang:per-request")
    assert out["none"]["acceptance_length"] is None  # a proxy is not a per-request count
    assert asked == [["r2"], ["r3"]]  # the backend is asked only where no spec_decode counters exist
    assert out["code"]["num_requests"] == 2
    assert out["code"]["output_throughput_tok_s"] == pytest.approx(5.0)
    zero = per_category_points(recs, 2.0, 0, ask)
    assert {v["acceptance_length"] for v in zero.values()} == {1.0}


# -- results folder -----------------------------------------------------------------------------------------

def doc_columns() -> list[str]:
    """summary.csv column names in the order docs/results-format.md lists them."""
    text = (DOCS / "results-format.md").read_text()
    section = text.split("## summary.csv columns", 1)[1]
    cols = []
    for line in section.splitlines():
        if line.startswith("| `"):
            cols += re.findall(r"`([a-z0-9_]+)`", line.split("|")[1])
    return cols


def test_summary_columns_match_the_docs():
    assert list(SUMMARY_COLUMNS) == doc_columns()


def point(k: int, c: int, r: int = 0, status: str = "ok", tput: float | None = 100.0, tpot: float = 10.0,
          al: float = 1.0) -> dict:
    return {"steps": k, "concurrency": c, "repeat": r, "status": status, "error": "" if status == "ok" else "x",
            "metrics": {"output_throughput_tok_s": tput, "tpot_p50_ms": tpot, "acceptance_length": al,
                        "num_requests": 4}}


def test_folder_checks(tmp_path):
    plan = SweepPlan(steps=(0, 1), concurrency=(1,)).to_json()
    folder = SweepFolder(tmp_path / "out")
    assert folder.check(plan, resume=False) == []
    with pytest.raises(UserError, match="nothing to resume"):
        folder.check(plan, resume=True)
    folder.open(SweepMeta(plan=plan), [])
    folder.append_point(point(0, 1))
    folder.close()
    with pytest.raises(UserError, match="already holds 1 finished point"):
        folder.check(plan, resume=False)
    assert [p.steps for p in folder.check(plan, resume=True)] == [0]
    other = SweepPlan(steps=(0, 2), concurrency=(1,)).to_json()
    with pytest.raises(UserError, match=re.escape("different sweep plan (steps [0, 1] -> [0, 2])")):
        folder.check(other, resume=True)


def test_points_held_as_records_are_written_back_byte_for_byte(tmp_path):
    """The folder keeps its points as SweepPoint records; resuming (read, keep, rewrite) and rewriting them leave
    points.jsonl and summary.csv as they were, a key this version does not know (a distributed sweep's ``node``)
    and a minimal older line included."""
    plan = SweepPlan(steps=(0, 1), concurrency=(1, 2)).to_json()
    folder = SweepFolder(tmp_path)
    folder.open(SweepMeta(plan=plan), [])
    folder.append_point(point(0, 1) | {"node": {"id": "abc", "alike": True}})
    folder.append_point(failed_point((1, 1, 0), "server for num_steps 1 exited", 8, "boom"))
    folder.append_point({"steps": 0, "concurrency": 2, "status": "ok", "metrics": {"num_requests": 4}})
    folder.close()
    lines, summary = folder.points_file.read_bytes(), folder.summary.read_bytes()
    kept = folder.check(plan, resume=True)
    assert all(isinstance(p, SweepPoint) for p in kept) and [p.key for p in kept] == [(0, 1, 0), (1, 1, 0), (0, 2, 0)]
    assert kept[0].extra["node"]["id"] == "abc" and kept[1].log_tail == "boom"
    folder.open(SweepMeta(plan=plan), kept)
    folder.rewrite_points()
    folder.close()
    assert folder.points_file.read_bytes() == lines
    assert folder.summary.read_bytes() == summary


def test_folder_resume_drops_unfinished_records(tmp_path):
    plan = SweepPlan(steps=(0, 1), concurrency=(1,)).to_json()
    folder = SweepFolder(tmp_path)
    folder.open(SweepMeta(plan=plan), [])
    for key in ((0, 1, 0), (0, 1, 0), (1, 1, 0)):
        folder.append_request({"steps": key[0], "concurrency": key[1], "repeat": key[2], "request_id": "x"})
    folder.append_point(point(0, 1))
    failed = failed_point((1, 1, 0), "server for num_steps 1 exited", 8, "boom")
    folder.append_point(failed)
    folder.close()
    with open(folder.points_file, "a") as fh:
        fh.write('{"steps": 2, "concur')  # a line cut short by a crash
    with open(folder.requests, "a") as fh:
        fh.write(json.dumps({"steps": 9, "concurrency": 1, "repeat": 0}) + "\n")  # a point that never finished
    kept = folder.check(plan, resume=True)
    assert [(p.steps, p.status) for p in kept] == [(0, "ok"), (1, "failed")]
    folder.open(SweepMeta(plan=plan), kept)
    folder.close()
    lines = folder.requests.read_text().splitlines()
    assert [json.loads(x)["steps"] for x in lines] == [0, 0, 1]
    assert len(folder.points_file.read_text().splitlines()) == 2
    retry = folder.check(plan, resume=True, retry_failed=True)  # --retry-failed drops the failed point ...
    folder.open(SweepMeta(plan=plan), retry)
    folder.close()
    assert [json.loads(x)["steps"] for x in folder.requests.read_text().splitlines()] == [0, 0]  # ... and its records
    with open(folder.summary, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["steps"], r["status"]) for r in rows] == [("0", "ok")]


def test_truncate_and_summary(tmp_path):
    folder = SweepFolder(tmp_path)
    folder.open(SweepMeta(), [])
    folder.append_request({"steps": 0, "concurrency": 1, "repeat": 0, "i": 0})
    mark = folder.request_mark()
    folder.append_request({"steps": 0, "concurrency": 2, "repeat": 0, "i": 1})
    folder.truncate_requests(mark)  # the interrupted point's partial records go
    folder.append_request({"steps": 0, "concurrency": 2, "repeat": 0, "i": 2})
    folder.append_point(point(1, 4, status="failed", tput=None))
    folder.append_point(point(0, 4))
    folder.close()
    assert [json.loads(x)["i"] for x in folder.requests.read_text().splitlines()] == [0, 2]
    with open(folder.summary, newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert reader.fieldnames == list(SUMMARY_COLUMNS)
    assert [(r["steps"], r["status"], r["output_throughput_tok_s"]) for r in rows] == [("0", "ok", "100.0"),
                                                                                       ("1", "failed", "")]
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary files left behind


# -- final table --------------------------------------------------------------------------------------------

def test_summarize_medians_best_and_speedup():
    pts = [point(0, 1, 0, tput=100), point(0, 1, 1, tput=120), point(0, 1, 2, tput=110),
           point(2, 1, 0, tput=200, al=2.5), point(2, 1, 1, status="failed", tput=5.0),
           point(3, 1, 0, tput=200),  # ties with K=2: the smaller K wins
           point(0, 8, 0, tput=500), point(2, 8, 0, status="failed", tput=None)]
    cells = summarize(pts, [0, 2, 3], [1, 8])
    assert (cells[1, 0].throughput, cells[1, 0].ok, cells[1, 0].total) == (110, 3, 3)
    assert (cells[1, 2].throughput, cells[1, 2].ok, cells[1, 2].total) == (200, 1, 2)  # failed repeat excluded
    assert cells[1, 2].best
    assert not cells[1, 3].best
    assert not cells[1, 0].best
    assert cells[1, 2].speedup == pytest.approx(200 / 110)
    assert cells[8, 2].failed
    assert cells[8, 0].best
    assert cells[8, 3].total == 0
    console = Console(record=True, width=200)
    console.print(summary_table(pts, [0, 2, 3], [1, 8]))
    text = console.export_text()
    assert "200.0 tok/s *" in text
    assert "1.82x" in text
    assert "failed" in text
    assert "missing" in text
    assert "1/2 failed" in text
    assert "AL 2.50" in text
