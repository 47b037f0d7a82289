"""Point metrics on constructed records, against hand-computed values."""

from __future__ import annotations

import pytest

from spectune.loadgen.metrics import METRIC_COLUMNS, client_limit, compute_metrics, per_category
from spectune.loadgen.record import RequestRecord


def records() -> list[RequestRecord]:
    r1 = RequestRecord("r1", "p1", "a", send_time=0.0, chunk_times=[0.1, 0.2, 0.4], chunk_tokens=[1, 2, 3],
                       end_time=0.5, completion_tokens=6, status=200, dispatch_delay_s=0.001)
    r2 = RequestRecord("r2", "p2", "b", send_time=0.2, chunk_times=[0.5, 0.6], chunk_tokens=[1, 1], end_time=0.7,
                       completion_tokens=2, status=200, token_count_source="chunks", dispatch_delay_s=0.002)
    r3 = RequestRecord("r3", "p3", "a", send_time=0.3, chunk_times=[0.35], chunk_tokens=[1], end_time=0.4,
                       completion_tokens=1, status=200, dispatch_delay_s=0.004)
    r4 = RequestRecord("r4", "p4", "b", send_time=0.4, end_time=0.45, status=500, error="HTTP 500: boom",
                       dispatch_delay_s=0.003)
    return [r1, r2, r3, r4]


def test_point_metrics_hand_computed() -> None:
    m = compute_metrics(records(), achieved_concurrency=2.5, client_cpu_share=0.25)
    assert list(m) == list(METRIC_COLUMNS)
    # window 0.0 .. 0.7 (first send, last end); 3 successful requests, 6 + 2 + 1 = 9 output tokens
    expected = {
        "num_requests": 4, "num_failed": 1, "duration_s": 0.7, "achieved_concurrency": 2.5,
        "request_throughput_req_s": 3 / 0.7, "output_throughput_tok_s": 9 / 0.7, "total_output_tokens": 9,
        # TTFT 100, 300, 50 ms; sorted 50, 100, 300: p90 at rank 1.8 = 100 + 0.8 * 200
        "ttft_mean_ms": 150.0, "ttft_p50_ms": 100.0, "ttft_p90_ms": 260.0, "ttft_p99_ms": 296.0,
        # TPOT (0.4 - 0.1) / 5 = 60 ms, 0.1 / 1 = 100 ms; r3 has one token: no TPOT
        "tpot_mean_ms": 80.0, "tpot_p50_ms": 80.0, "tpot_p90_ms": 96.0, "tpot_p99_ms": 99.6,
        # per-token ITL: 100/2 x2, 200/3 x3, 100/1 -> 50, 50, 66.7, 66.7, 66.7, 100
        "itl_mean_ms": 400 / 6, "itl_p50_ms": 200 / 3, "itl_p90_ms": 200 / 3 + 0.5 * 100 / 3,
        "itl_p99_ms": 200 / 3 + 0.95 * 100 / 3,
        # per-chunk gaps 100, 200, 100
        "chunk_itl_p50_ms": 100.0, "chunk_itl_p99_ms": 198.0,
        # E2E 500, 500, 100
        "e2el_mean_ms": 1100 / 3, "e2el_p50_ms": 500.0, "e2el_p90_ms": 500.0, "e2el_p99_ms": 500.0,
        "mean_tokens_per_chunk": 9 / 6, "slo_attainment": None, "goodput_req_s": None,
        "token_count_source": "chunks",  # the least trustworthy source among the requests
        # dispatch delays 1, 2, 4, 3 ms (the failed request's too); sorted 1, 2, 3, 4: p90 at rank 2.7
        "dispatch_delay_p50_ms": 2.5, "dispatch_delay_p90_ms": 3.7, "dispatch_delay_max_ms": 4.0,
        "client_cpu_share": 0.25, "client_limited": False,
    }
    assert m == pytest.approx(expected)


@pytest.mark.parametrize(
    "ttft, tpot, good",
    [
        (200.0, 70.0, 2),  # r1 meets both; r2 misses TTFT; r3 has no TPOT (meets); r4 failed
        (None, 120.0, 3),  # all successful requests meet the TPOT SLO; the failed one misses
        (60.0, None, 1),  # only r3 (50 ms)
    ],
)
def test_slo_attainment_and_goodput(ttft: float | None, tpot: float | None, good: int) -> None:
    m = compute_metrics(records(), 0.0, 1.0, slo_ttft_ms=ttft, slo_tpot_ms=tpot)
    assert m["slo_attainment"] == pytest.approx(good / 4)
    assert m["goodput_req_s"] == pytest.approx(good / 1.0)
    assert m["duration_s"] == 1.0


def test_per_category() -> None:
    out = per_category(records(), 0.7)
    assert list(out) == ["a", "b"]
    assert out["a"] == pytest.approx({"num_requests": 2, "tpot_p50_ms": 60.0, "output_throughput_tok_s": 7 / 0.7})
    assert out["b"] == pytest.approx({"num_requests": 2, "tpot_p50_ms": 100.0, "output_throughput_tok_s": 2 / 0.7})


def test_no_successful_requests() -> None:
    m = compute_metrics(records()[3:], slo_ttft_ms=100.0)
    assert m["num_requests"] == 1
    assert m["num_failed"] == 1
    assert m["total_output_tokens"] == 0
    assert m["ttft_p50_ms"] is None
    assert m["itl_mean_ms"] is None
    assert m["mean_tokens_per_chunk"] is None
    assert m["slo_attainment"] == 0.0
    assert m["goodput_req_s"] == 0.0
    assert m["token_count_source"] is None
    assert compute_metrics([])["duration_s"] is None


@pytest.mark.parametrize("cpu, p90, e2e, limited", [
    (0.95, 1.0, 500.0, True),  # the event loop saturated its core
    (0.5, 6.0, 500.0, False),  # above the floor, but 1.2% of a request's life
    (0.5, 30.0, 500.0, True),  # 6% of a request's life spent waiting for the client
    (0.5, 4.0, 20.0, False),  # 20% of a short request, but under the 5 ms floor
    (None, None, None, False),
])
def test_client_limit_rule(cpu, p90, e2e, limited) -> None:
    why = client_limit({"client_cpu_share": cpu, "dispatch_delay_p90_ms": p90, "e2el_p50_ms": e2e})
    assert (why is not None) == limited
