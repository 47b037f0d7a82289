"""Emulated speculative servers with a cost model, in-process, for the guided-plan and drift tests and
benchmarks/guided_vs_grid.py.

Each server (one per num_steps K, behind the ``openai`` backend) is a continuous-batching engine in miniature: the
sequences in flight advance together, one verify step at a time; a step takes
``CostModel.step_s(batch, K)`` seconds (a fixed cost, a per-sequence cost, a verify cost per token verified =
batch x (K + 1), a per-draft-step cost and a per-draft-token cost), after which each sequence emits its accepted
drafts plus the bonus token as one SSE chunk. A new request joins at the next step and gets its first token from it
(its prefill). Draft tokens are accepted in a chain: position i with probability ``accept[i]`` given the previous
ones were, drawn from a generator seeded by the prompt and K, so a request's acceptance does not depend on the
requests beside it or on the order they ran in; every step draws the chain a draft of ``CHAIN_DRAW`` tokens would
get accepted and keeps its first K, so the acceptance of num_steps K is the prefix of that of a larger K, as in
chain drafting. ``/metrics`` carries vLLM's spec-decode counters (per position
too) and the running-requests gauge (from tests/helpers/fake_server.py's ``Counters``).

``drift_at_s``/``drift_after_requests`` and ``drift_factor``: every step after ``drift_at_s`` seconds (from the
servers' start), or after the servers together received ``drift_after_requests`` requests, takes ``drift_factor``
times as long: a machine whose speed changes halfway through a sweep.

``schedule`` (a :class:`ScheduleServer`): a server started with a vLLM per-batch-size schedule
(``num_speculative_tokens_per_batch_size``, read by :func:`load_vllm_schedule`) instead of one num_steps. Each
verify step drafts the schedule's K for the sequences it runs (vLLM's lookup, ``VllmSchedule.k_for_batch_size``);
its drafts are counted with that K, so a window of K=0 steps counts none (acceptance length 1.0). Such a server
costs more than the schedule's K alone says, as real vLLM does: its EAGLE drafter runs over the whole batch every
step even where the schedule says K=0 (``vllm/v1/spec_decode/llm_base_proposer.py``, ``propose``; 6.5-21.6% on
GPUs, vllm-project/vllm#51575), which ``draft_floor`` charges as one draft step at K=0, and a K-varying schedule
loses CUDA graphs (vllm-project/vllm#52087), which ``factor`` charges on every step.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import json
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from aiohttp import web

from helpers.fake_server import Counters

if TYPE_CHECKING:
    from spectune.backends.num_steps.vllm_schedule import VllmSchedule


CHAIN_DRAW = 8
#: prompts of a virtual window (virtual_point): request i has prompt ``p{i % PROMPTS}``
PROMPTS = 8


@dataclass(frozen=True)
class CostModel:
    """Step time of one verify step, ms: ``base + per_seq * b + per_token * b * (K + 1) + per_draft * K +
    per_draft_seq * b * K`` for a batch of b sequences at num_steps K; ``accept``: the conditional acceptance of
    draft position i (the last value repeats)."""

    name: str
    base_ms: float
    per_seq_ms: float
    per_token_ms: float
    per_draft_ms: float
    per_draft_seq_ms: float = 0.0
    accept: tuple[float, ...] = (0.8, 0.7, 0.6, 0.5)

    def step_s(self, batch: int, steps: int) -> float:
        """Seconds of one verify step of ``batch`` sequences at num_steps ``steps``."""
        b, k = max(batch, 1), steps
        return (self.base_ms + self.per_seq_ms * b + self.per_token_ms * b * (k + 1) + self.per_draft_ms * k
                + self.per_draft_seq_ms * b * k) / 1000.0

    def draft_step_s(self, batch: int) -> float:
        """Seconds of one draft step over ``batch`` sequences (``per_draft + per_draft_seq * b``): what K=1 adds to
        a step besides verifying one more token per sequence."""
        return (self.per_draft_ms + self.per_draft_seq_ms * max(batch, 1)) / 1000.0

    def scaled(self, factor: float) -> "CostModel":
        """The same model with every step-time term times ``factor`` (slower steps: the in-process client's fixed
        per-step overhead, which does not scale, weighs less)."""
        return replace(self, base_ms=self.base_ms * factor, per_seq_ms=self.per_seq_ms * factor,
                       per_token_ms=self.per_token_ms * factor, per_draft_ms=self.per_draft_ms * factor,
                       per_draft_seq_ms=self.per_draft_seq_ms * factor)

    def accept_at(self, i: int) -> float:
        return self.accept[min(i, len(self.accept) - 1)]

    def acceptance_length(self, steps: int) -> float:
        """Expected tokens per verify step at num_steps ``steps`` (1 + sum of the chain probabilities)."""
        total, run = 1.0, 1.0
        for i in range(steps):
            run *= self.accept_at(i)
            total += run
        return total


#: a memory-bound accelerator: verifying more tokens costs little, a draft step a fixed time; speculation pays at
#: every batch size, the draft's falling acceptance caps the useful num_steps
MEMORY_BOUND = CostModel("memory-bound", base_ms=6.0, per_seq_ms=0.06, per_token_ms=0.03, per_draft_ms=1.2,
                         per_draft_seq_ms=0.01, accept=(0.85, 0.65, 0.45, 0.3))
#: a compute-bound CPU: verify cost grows with batch x tokens; speculation pays at batch 1-2 and costs above
COMPUTE_BOUND = CostModel("compute-bound", base_ms=3.0, per_seq_ms=0.25, per_token_ms=0.45, per_draft_ms=0.8,
                          per_draft_seq_ms=0.08, accept=(0.7, 0.6, 0.5, 0.4))


def load_vllm_schedule(path: str) -> "VllmSchedule | None":
    """The vLLM schedule in the JSON file ``path``: a bare ``[[lo, hi, K], ...]`` list or a speculative config
    ``{"num_speculative_tokens": M, "num_speculative_tokens_per_batch_size": [...], ...}`` (unsorted ranges
    accepted, as vLLM sorts them; a K above M clamped to M, as vLLM's lookup does, where spectune's own parser
    refuses it). None for an empty ``path``, a file that cannot be read or is not JSON, and any other JSON (an
    SGLang adaptive config): a server given one of those runs its ``--steps``.

    Raises:
        ValueError: a list, or an object with ``num_speculative_tokens_per_batch_size``, that is not a valid
            schedule (vLLM refuses to start with it).
    """
    from spectune.backends.num_steps.vllm_schedule import parse_vllm_schedule, parse_vllm_speculative_config

    if not path:
        return None
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(obj, list):
        return parse_vllm_schedule(obj, strict=False)
    if not isinstance(obj, dict) or "num_speculative_tokens_per_batch_size" not in obj:
        return None
    ranges = parse_vllm_schedule(obj["num_speculative_tokens_per_batch_size"], strict=False).ranges
    most = obj.get("num_speculative_tokens")
    clamped = [[r.start, r.end, min(r.k, most) if isinstance(most, int) else r.k] for r in ranges]
    return parse_vllm_speculative_config({**obj, "num_speculative_tokens_per_batch_size": clamped}, strict=False)


@dataclass(frozen=True)
class ScheduleServer:
    """A server started with a vLLM per-batch-size ``schedule`` (module docstring): K per step from the batch
    size, and what such a server pays beyond that K. ``draft_floor``: a K=0 step still takes one draft step over
    the batch (``CostModel.draft_step_s``: the drafter runs anyway). ``factor``: every step takes this many times
    as long (CUDA graphs downgraded for a K-varying schedule)."""

    schedule: "VllmSchedule"
    draft_floor: bool = False
    factor: float = 1.0

    def steps_for(self, batch: int) -> int:
        """K of a verify step of ``batch`` sequences: the range holding ``batch`` (a gap or a size past the last
        range: the nearest range below), clamped to ``num_speculative_tokens`` when the schedule carries it."""
        k = self.schedule.k_for_batch_size(max(batch, 1))
        return k if self.schedule.max_k is None else min(k, self.schedule.max_k)

    @property
    def max_steps(self) -> int:
        """The most draft positions a step can have (``num_speculative_tokens``, else the largest K)."""
        return self.schedule.max_k if self.schedule.max_k is not None else max(r.k for r in self.schedule.ranges)

    def step_s(self, model: CostModel, batch: int, steps: int) -> float:
        """Seconds of one verify step of ``batch`` sequences at K = ``steps`` on this server: ``model``'s step,
        plus one draft step at K=0 with ``draft_floor``, times ``factor``."""
        floor = model.draft_step_s(batch) if self.draft_floor and steps == 0 else 0.0
        return (model.step_s(batch, steps) + floor) * self.factor


@dataclass
class _Seq:
    prompt: str
    max_tokens: int
    out: asyncio.Queue
    rng: random.Random
    done: int = 0


@dataclass
class EmulatedEngine:
    """One emulated server at num_steps ``steps``, or running a vLLM ``schedule`` (see module docstring)."""

    model: CostModel
    steps: int
    t0: float
    drift_at_s: float | None = None
    drift_factor: float = 1.0
    shared: dict = field(default_factory=lambda: {"served": 0})
    drift_after_requests: int | None = None
    name: str = "emulated-model"
    waiting: list[_Seq] = field(default_factory=list)
    running: list[_Seq] = field(default_factory=list)
    #: put the cumulative usage in every chunk when the client asks for ``continuous_usage_stats`` (as vLLM and
    #: SGLang do), so the client counts each chunk's tokens instead of one per chunk
    continuous_usage: bool = False
    #: a vLLM per-batch-size schedule this server runs instead of ``steps`` (and its extra cost), or None
    schedule: ScheduleServer | None = None

    def __post_init__(self) -> None:
        width = self.steps if self.schedule is None else self.schedule.max_steps
        self.counters = Counters("vllm:", width, self.name)
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None

    def steps_for(self, batch: int) -> int:
        """K of a verify step of ``batch`` sequences: ``steps``, or the schedule's K at that batch size."""
        return self.steps if self.schedule is None else self.schedule.steps_for(batch)

    def step_s(self, batch: int, steps: int) -> float:
        """Seconds of one verify step of ``batch`` sequences at K = ``steps`` (before drift): the cost model's, or
        the schedule server's."""
        if self.schedule is None:
            return self.model.step_s(batch, steps)
        return self.schedule.step_s(self.model, batch, steps)

    def factor(self) -> float:
        late = self.drift_at_s is not None and time.perf_counter() - self.t0 >= self.drift_at_s
        late = late or (self.drift_after_requests is not None and self.shared["served"] >= self.drift_after_requests)
        return self.drift_factor if late else 1.0

    async def loop(self) -> None:
        # Steps end at absolute deadlines: asyncio.sleep(step_s) alone overshoots by the event loop's
        # timer granularity (up to ~1 ms a step), an error that does not scale with the modelled cost
        # (it made K=1 at concurrency 1 look 10% better than the model and K=0 at 8 look 23% slower).
        # A deadline that fell more than 2 ms behind (the loop was busy) restarts from now instead of
        # letting later steps catch up in a burst.
        deadline: float | None = None
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                deadline = None
            new, self.waiting = self.waiting, []
            self.running += new
            self.counters.running.set(len(self.running))
            now = time.perf_counter()
            if deadline is None or deadline < now - 0.002:
                deadline = now
            k = self.steps_for(len(self.running))
            deadline += self.step_s(len(self.running), k) * self.factor()
            await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            for seq in list(self.running):
                if seq in new:
                    n = 1
                else:  # the chain a long draft would get accepted; K drafts keep its first K (chain drafting)
                    chain = 0
                    while chain < CHAIN_DRAW and seq.rng.random() < self.model.accept_at(chain):
                        chain += 1
                    accepted = min(chain, k)
                    if k > 0:
                        self.counters.observe(k, accepted)
                    n = accepted + 1
                n = min(n, seq.max_tokens - seq.done)
                seq.done += n
                seq.out.put_nowait(n)
                if seq.done >= seq.max_tokens:
                    seq.out.put_nowait(None)
                    self.running.remove(seq)
            self.counters.running.set(len(self.running))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt = json.dumps(body.get("messages") or body.get("prompt") or "")
        seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "little")
        seq = _Seq(prompt, max(1, max_tokens), asyncio.Queue(), random.Random(seed))
        self.shared["served"] += 1
        self.waiting.append(seq)
        self.wake.set()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion.chunk"
        continuous = self.continuous_usage and (body.get("stream_options") or {}).get("continuous_usage_stats")
        done = 0
        while True:
            n = await seq.out.get()
            if n is None:
                break
            done += n
            text = "tok " * n
            choice = ({"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None} if chat
                      else {"index": 0, "text": text, "finish_reason": None})
            event = {"id": "x", "object": obj, "model": self.name, "choices": [choice]}
            if continuous:
                event["usage"] = {"prompt_tokens": 8, "completion_tokens": done, "total_tokens": 8 + done}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 8, "completion_tokens": done, "total_tokens": 8 + done}
            await resp.write(f"data: {json.dumps({'id': 'x', 'object': obj, 'choices': [], 'usage': usage})}\n\n"
                             .encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name, "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.counters.text(), content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_post("/v1/completions", self.completions)
        return app


class EmulatedServers:
    """``async with EmulatedServers(model, steps) as urls``: one emulated server per num_steps, ``{K: base_url}``
    for ``BackendOptions(endpoints=urls)``."""

    def __init__(self, model: CostModel, steps: Sequence[int], drift_at_s: float | None = None,
                 drift_factor: float = 1.0, drift_after_requests: int | None = None) -> None:
        self.model, self.steps = model, list(steps)
        self.drift_at_s, self.drift_factor = drift_at_s, drift_factor
        self.drift_after_requests = drift_after_requests
        self.shared = {"served": 0}
        self.runners: list[web.AppRunner] = []
        self.engines: list[EmulatedEngine] = []

    async def __aenter__(self) -> dict[int, str]:
        t0 = time.perf_counter()
        urls = {}
        for k in self.steps:
            engine = EmulatedEngine(self.model, k, t0, self.drift_at_s, self.drift_factor, self.shared,
                                    self.drift_after_requests)
            engine.task = asyncio.ensure_future(engine.loop())
            runner = web.AppRunner(engine.app(), shutdown_timeout=1.0, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.runners.append(runner)
            self.engines.append(engine)
            urls[k] = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return urls

    async def __aexit__(self, *exc: object) -> None:
        for engine in self.engines:
            if engine.task is not None:
                engine.task.cancel()
        for runner in self.runners:
            await runner.cleanup()


def expected_throughput(model: CostModel, steps: int, concurrency: int) -> float:
    """The cost model's own steady-state output throughput (tokens/s) of a closed loop of ``concurrency`` requests:
    concurrency x acceptance length / step time (prefill steps and ramp-up ignored)."""
    return concurrency * model.acceptance_length(steps) / model.step_s(concurrency, steps)


def virtual_point(model: CostModel, key: tuple[int, int, int], requests: int, max_tokens: int, noise: float = 0.01,
                  seed: int = 0, rule=None, request_noise: float = 0.02,
                  prompt_noise: float = 0.0) -> tuple[dict, list[dict]]:
    """A point measured on a virtual server that runs ``model`` exactly, up to multiplicative noise ``noise``
    (relative standard deviation of the point's throughput, seeded by the key): the closed loop's expected
    throughput c x L / ((1 + (L - 1) / AL) x step time) for requests of L = ``max_tokens`` tokens (the first token
    takes a prefill step), TPOT = step time / AL, per-position acceptance of the chain, and ``requests`` request
    objects with latencies that give that throughput. The point reads what its requests give (c x L / mean
    latency, Little's law), whether a rule watched the window or not, so a grid's window and a guided plan's read a
    cell alike. Returns (points.jsonl object, request objects); its
    ``metrics.duration_s`` is the time the point would take (requests x L / throughput). ``request_noise``: relative
    standard deviation of one request's latency. ``prompt_noise``: relative sd of a prompt's own factor on its
    latency (its output's difficulty for the draft), drawn once per prompt of the 8 (``p0``..``p7``, request i has
    prompt i mod 8) and the same in every cell, scaled to mean 1 (a full window of a multiple of 8 requests reads
    the same with it or without; its bootstrap interval, by prompt, widens).
    ``rule``: a spectune.sweep.sequential.EarlyStop fed the requests in order (elapsed time: their latencies so far
    over c); when it stops, the requests in flight are cancelled (as the sweep's are) and
    the point keeps the finished ones (throughput, duration and intervals from them; ``early_stop`` recorded, with
    ``full_window_estimate``: the statistic over the whole planned window, what the point would have measured without
    the rule). A model with per-step noise (``step_noise``, relative sd of one step, and ``expected_step_s``, the
    mean; benchmarks/heldout_cost_model.py) adds ``step_noise / sqrt(steps in the window)`` to the point's noise, what
    a live window of that many steps averages it to."""
    import numpy as np

    k, c, r = key
    rng = np.random.default_rng([seed, k, c, r])
    al = model.acceptance_length(k)
    step = getattr(model, "expected_step_s", model.step_s)(c, k)
    per_request_s = (1 + (max_tokens - 1) / al) * step
    # a model whose every step scatters (``step_noise``, relative sd per step) moves a window by that over the
    # square root of the window's steps: requests x (1 + (L - 1) / AL) / c of them
    steps_in_window = max(requests * (1 + (max_tokens - 1) / al) / c, 1.0)
    sd = math.sqrt(noise ** 2 + getattr(model, "step_noise", 0.0) ** 2 / steps_in_window)
    tput = c * max_tokens / per_request_s * (1 + sd * rng.standard_normal())
    lat = np.full(requests, c * max_tokens / tput) * np.maximum(1 + request_noise * rng.standard_normal(requests), 0.2)
    if prompt_noise > 0:  # each prompt's own factor, the same in every cell of the sweep
        f = np.maximum(1 + prompt_noise * np.random.default_rng([seed, 7919]).standard_normal(PROMPTS), 0.3)
        lat = lat * (f / f.mean())[np.arange(requests) % PROMPTS]
    full = c * max_tokens * len(lat) / float(lat.sum())  # the whole window's statistic (the rule's, at every request)
    if rule is not None:
        from types import SimpleNamespace

        seen = []
        for i, x in enumerate(lat):
            seen.append(SimpleNamespace(ok=True, prompt_id=f"p{i % PROMPTS}", completion_tokens=max_tokens,
                                        e2e_s=float(x), tpot_s=None, dispatch_delay_s=0.0))
            if rule.check(seen, float(lat[:i + 1].sum()) / c):
                lat = lat[:i + 1]  # those in flight are cancelled (Constraints.cancel_on_early_stop)
                break
    # the window reads what its requests give, watched by a rule or not (a grid's window and a guided one alike)
    requests = len(lat)
    tput = c * max_tokens * len(lat) / float(lat.sum())
    tpot = step / al * 1000
    recs = [{"steps": k, "concurrency": c, "repeat": r, "prompt_id": f"p{i % PROMPTS}", "error": None,
             "chunk_times": [0.0] * 4,
             "completion_tokens": max_tokens, "e2e_ms": float(x * 1000), "ttft_ms": step * 1000,
             "tpot_ms": tpot} for i, x in enumerate(lat)]
    per_pos, run = [], 1.0
    for i in range(k):
        run *= model.accept_at(i)
        per_pos.append(run)
    duration = requests * max_tokens / tput
    metrics = {"num_requests": requests, "num_failed": 0, "duration_s": duration, "output_throughput_tok_s": tput,
               "total_output_tokens": requests * max_tokens, "tpot_p50_ms": tpot, "tpot_p99_ms": tpot * 1.1,
               "ttft_p50_ms": step * 1000, "acceptance_length": al, "acceptance_rate": None,
               "acceptance_length_source": "vllm:/metrics counters", "achieved_concurrency": float(c),
               "batch_size_mean": float(c), "batch_size_source": "vllm:num_requests_running"}
    from spectune.results.confidence import point_intervals

    metrics.update(point_intervals(recs, metrics))
    point = {"steps": k, "concurrency": c, "repeat": r, "status": "ok", "error": "", "metrics": metrics,
             "acceptance": {"per_position": per_pos, "num_drafts": requests * max_tokens / al, "warning": None},
             "batch_size": None, "per_category": {}, "window": {"start_s": 0.0, "end_s": duration},
             "requests_planned": requests, "stop_reason": "early_stop" if rule is not None and rule.reason
             else "max_requests",
             **({"early_stop": {**rule.describe(), "full_window_estimate": full}} if rule is not None else {})}
    return point, recs
