"""Prometheus metrics of the bundled engine (prometheus-client), named after vLLM's with a ``spectune:`` prefix.

Engine counters are read from :class:`~spectune.backends.local.engine.loop.EngineStats` at scrape time (no per-step
cost); latency histograms are observed by the server per request. Spec-decode counters follow vLLM V1
(vllm/v1/spec_decode/metrics.py): ``spectune:spec_decode_num_drafts_total`` (verify steps with drafting, per
request), ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` (bonus token excluded) and
``..._num_accepted_tokens_per_pos_total{position="i"}`` (drafts whose first i+1 tokens were accepted), so a window's
acceptance length is 1 + d(accepted) / d(drafts).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from spectune.backends.local.engine.loop import Engine

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
                   20.0, 40.0, 80.0)


class _EngineCollector:
    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine, self.labels = engine, {"model_name": model_name}
        self.started = time.time()

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=list(self.labels))
        c.add_metric(list(self.labels.values()), value)
        return c

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=list(self.labels))
        g.add_metric(list(self.labels.values()), value)
        return g

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        e, s = self.engine, self.engine.stats
        yield self._gauge("spectune:num_requests_running", "Requests in the running batch.", e.num_running)
        yield self._gauge("spectune:num_requests_waiting", "Requests waiting for a slot.", e.num_waiting)
        yield self._gauge("spectune:spec_num_steps", "num_steps of the last decode round (active tier).",
                          s.active_num_steps)
        yield self._gauge("spectune:process_start_time_seconds", "Server start, s since the epoch.", self.started)
        yield self._counter("spectune:prompt_tokens", "Prefilled prompt tokens.", s.prompt_tokens)
        yield self._counter("spectune:generation_tokens", "Generated tokens.", s.generation_tokens)
        yield self._counter("spectune:spec_num_steps_switches", "Changes of num_steps between rounds.",
                            s.num_steps_switches)
        yield self._counter("spectune:engine_decode_rounds", "Decode rounds (one verify of the running batch).",
                            s.num_rounds)
        yield self._counter("spectune:engine_decode_seconds", "Wall time of the decode rounds, s.", s.decode_seconds)
        yield self._counter("spectune:engine_decode_rows", "Rows of the decode rounds (each round's running batch), "
                            "summed.", s.batch_total)
        yield self._counter("spectune:engine_slow_round_shapes", "(batch, num_steps) shapes whose decode rounds ran "
                            "over 1.5x the engine's step model (warnings in /server_info step_model).",
                            len(e.guard.warnings))
        yield self._counter("spectune:engine_prefill_forwards", "Packed prefill forwards.", s.num_prefill_forwards)
        yield self._counter("spectune:engine_prefill_seconds", "Wall time of the prefill forwards, s.",
                            s.prefill_seconds)
        yield self._counter("spectune:spec_decode_num_drafts", "Verify steps with drafting, per request.",
                            s.spec.verify_steps)
        yield self._counter("spectune:spec_decode_num_draft_tokens", "Draft tokens proposed.", s.spec.draft_tokens)
        yield self._counter("spectune:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                            s.spec.accepted_tokens)
        per_pos = CounterMetricFamily("spectune:spec_decode_num_accepted_tokens_per_pos",
                                      "Drafts whose first position+1 tokens were accepted.",
                                      labels=[*self.labels, "position"])
        for i, n in enumerate(s.spec.accepted_per_pos):
            per_pos.add_metric([*self.labels.values(), str(i)], n)
        yield per_pos


class ServerMetrics:
    """The registry a server exposes on /metrics.

    Args:
        engine: the engine whose stats are exported.
        model_name: value of the ``model_name`` label.
    """

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model_name))
        names = ["model_name"]
        self._model = model_name
        self.ttft = Histogram("spectune:time_to_first_token_seconds", "Time to first token, s.", names,
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram("spectune:time_per_output_token_seconds", "Mean time per output token after the "
                              "first, per request, s.", names, buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("spectune:e2e_request_latency_seconds", "End-to-end request latency, s.", names,
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        from prometheus_client import Counter

        self.finished = Counter("spectune:request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=self.registry)

    def observe_request(self, ttft_s: float | None, tpot_s: float | None, e2e_s: float, reason: str) -> None:
        """Record one finished request's latencies (s) and finish reason."""
        if ttft_s is not None:
            self.ttft.labels(self._model).observe(ttft_s)
        if tpot_s is not None:
            self.tpot.labels(self._model).observe(tpot_s)
        self.e2e.labels(self._model).observe(e2e_s)
        self.finished.labels(self._model, reason).inc()

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
