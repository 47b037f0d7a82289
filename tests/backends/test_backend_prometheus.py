"""The Prometheus helper on vLLM's real exposition format: two engines, _total/_created samples, per position."""

from __future__ import annotations


import pytest

from spectune.backends.snapshots import SpecSnapshot, counter_acceptance, counters_reset
from spectune.backends.prometheus import gauge_values, parse_metrics, snapshot_from_text, sum_counter
from helpers.paths import FIXTURES as FIXTURES_DIR
from helpers.web import runner_url

FIXTURES = FIXTURES_DIR


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_sum_counter_sums_engines_and_ignores_created():
    fams = parse_metrics(text("vllm_metrics_before.txt"))
    # engine 0: 100 drafts, engine 1: 50; the _created samples (1.7632e9 each) must not be added
    assert sum_counter(fams, "vllm:spec_decode_num_drafts") == 150.0
    assert sum_counter(fams, "vllm:spec_decode_num_drafts_total") == 150.0
    assert sum_counter(fams, "vllm:spec_decode_num_accepted_tokens") == 240.0
    assert sum_counter(fams, "vllm:no_such_counter") is None


def test_sum_counter_grouped_by_position():
    fams = parse_metrics(text("vllm_metrics_before.txt"))
    # position 0: 80 + 35, position 1: 60 + 20, position 2: 40 + 5
    grouped = sum_counter(fams, "vllm:spec_decode_num_accepted_tokens_per_pos", group_by="position")
    assert grouped == {"0": 115.0, "1": 80.0, "2": 45.0}


def test_counter_family_without_total_suffix_in_its_type_line():
    # a hand-written exposition whose TYPE line names the family without _total, samples with and without it
    exposition = (
        "# TYPE spectune:spec_decode_num_drafts counter\n"
        'spectune:spec_decode_num_drafts_total{engine="0"} 7\n'
        'spectune:spec_decode_num_drafts_created{engine="0"} 1.7e9\n'
        "# TYPE other untyped\nother 1\n"
    )
    assert sum_counter(parse_metrics(exposition), "spectune:spec_decode_num_drafts_total") == 7.0


def test_snapshot_from_text_reads_every_counter():
    snap = snapshot_from_text(text("vllm_metrics_after.txt"), "vllm:", taken_at=5.0)
    assert (snap.num_drafts, snap.num_draft_tokens, snap.num_accepted_tokens) == (250.0, 750.0, 420.0)
    assert snap.accepted_per_pos == {0: 195.0, 1: 140.0, 2: 85.0}
    assert snap.instance == repr(1763200000.5)
    assert snap.taken_at == 5.0


def test_snapshot_with_another_prefix_has_no_counters():
    snap = snapshot_from_text(text("vllm_metrics_after.txt"), "spectune:")
    assert snap.num_drafts is None
    assert snap.num_accepted_tokens is None
    assert snap.accepted_per_pos == {}


def test_spectune_prefix_is_read_like_vllm():
    snap = snapshot_from_text(text("vllm_metrics_after.txt").replace("vllm:", "spectune:"), "spectune:")
    assert (snap.num_drafts, snap.num_accepted_tokens) == (250.0, 420.0)


def test_counter_acceptance_exact():
    before = snapshot_from_text(text("vllm_metrics_before.txt"), "vllm:")
    after = snapshot_from_text(text("vllm_metrics_after.txt"), "vllm:")
    acc = counter_acceptance(before, after, "vllm:/metrics counters")
    # d(drafts) = 250 - 150 = 100, d(accepted) = 420 - 240 = 180, d(draft tokens) = 750 - 450 = 300
    assert acc.acceptance_length == pytest.approx(1 + 180 / 100)  # 2.8
    assert acc.acceptance_rate == pytest.approx(180 / 300)  # 0.6
    # per position: (195-115)/100, (140-80)/100, (85-45)/100
    assert acc.per_position == pytest.approx([0.8, 0.6, 0.4])
    assert acc.num_drafts == 100.0
    assert acc.source == "vllm:/metrics counters"
    assert acc.warning is None


def test_counter_acceptance_detects_a_reset_and_uses_after_values():
    before = snapshot_from_text(text("vllm_metrics_after.txt"), "vllm:")
    after = snapshot_from_text(text("vllm_metrics_restarted.txt"), "vllm:")
    assert counters_reset(before, after)
    acc = counter_acceptance(before, after, "vllm:/metrics counters")
    # restarted server: drafts 20 + 10, accepted 30 + 15, draft tokens 60 + 30, per position 23, 15, 7
    assert acc.acceptance_length == pytest.approx(1 + 45 / 30)
    assert acc.acceptance_rate == pytest.approx(45 / 90)
    assert acc.per_position == pytest.approx([23 / 30, 15 / 30, 7 / 30])
    assert acc.warning is not None
    assert "reset" in acc.warning


def test_reset_seen_through_instance_even_when_counters_grew():
    before = SpecSnapshot(0.0, num_drafts=10, num_accepted_tokens=10, instance="1.0")
    after = SpecSnapshot(1.0, num_drafts=40, num_accepted_tokens=20, instance="2.0")
    acc = counter_acceptance(before, after, "x")
    assert acc.acceptance_length == pytest.approx(1 + 20 / 40)  # after-values, not the delta 1 + 10/30
    assert acc.warning is not None


def test_no_drafts_in_window_gives_one():
    snap = snapshot_from_text(text("vllm_metrics_before.txt"), "vllm:")
    acc = counter_acceptance(snap, snap, "vllm:/metrics counters")
    assert acc.acceptance_length == 1.0
    assert acc.num_drafts == 0.0
    assert acc.acceptance_rate is None


def test_gauge_values_one_per_label_set():
    fams = parse_metrics(text("sglang_metrics.txt"))
    assert gauge_values(fams, "sglang:spec_accept_length") == [3.25]
    assert gauge_values(fams, "sglang:missing") == []


def test_running_batch_gauges_of_each_engine():
    from spectune.backends.prometheus import RUNNING_GAUGES, running_from_families

    fams = parse_metrics(text("vllm_metrics_before.txt"))
    assert running_from_families(fams, RUNNING_GAUGES) == (8.0, "vllm:num_requests_running")  # 4 per engine
    sglang = parse_metrics('# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 5.0\n')
    assert running_from_families(sglang, RUNNING_GAUGES) == (5.0, "sglang:num_running_reqs")
    llamacpp = parse_metrics("# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n")
    assert running_from_families(llamacpp, RUNNING_GAUGES) == (2.0, "llamacpp:requests_processing")
    assert running_from_families(sglang, ("vllm:num_requests_running",)) is None


async def test_bundled_engine_backend_reads_its_own_gauge():
    """The bundled engine publishes spectune:num_requests_running (backends/local/server/metrics.py); LocalBackend reads
    only that one."""
    from types import SimpleNamespace

    from aiohttp import web

    from spectune.backends import make_backend
    from spectune.backends.options import BackendOptions

    page = ("# TYPE spectune:num_requests_running gauge\nspectune:num_requests_running{model_name=\"m\"} 3.0\n"
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 9.0\n")
    app = web.Application()
    app.router.add_get("/metrics", lambda r: web.Response(text=page))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        backend = make_backend("local", BackendOptions())
        backend.server = SimpleNamespace(base_url=runner_url(runner))
        assert await backend.running_requests() == (3.0, "spectune:num_requests_running")
        backend.server = None
        assert await backend.running_requests() is None
    finally:
        await runner.cleanup()
