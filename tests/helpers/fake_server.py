"""A fake speculative OpenAI-compatible server for subprocess tests of the backends and the load generator.

    python tests/fake_server.py --port P [--steps K] [--accept-prob p] [--fail-start] [--exit-after-requests N]
                                [--tokens-per-second R | --step-ms MS] [--metrics vllm|spectune|none]
                                [--startup-delay S]
                                [--adaptive-config PATH] [--per-request-metrics] [--chunk-tokens N] [--never-answer]
                                [--api-key KEY] [--speculative-num-draft-tokens N]

At start it prints its command line and, when set, the ``HF_TOKEN`` it uses (as SGLang and vLLM print their
arguments), so tests can check that spectune redacts launched servers' logs.

Serves ``GET /health``, ``GET /v1/models``, ``GET /metrics`` and ``POST /v1/chat/completions`` and
``/v1/completions`` (SSE streaming with ``stream_options.include_usage`` / ``continuous_usage_stats``, or one
JSON answer). Each verify step drafts K tokens, accepts each in turn with probability p (seeded), and emits
accepted + 1 tokens as one chunk, as a speculative server streaming once per step does; the first token (the
prefill's) is a chunk of its own. ``/metrics`` holds vLLM's V1 spec-decode counters (labels ``model_name`` and
``engine``, ``position`` per draft position) in prometheus-client's exposition, with the chosen prefix, and the
``{prefix}num_requests_running`` gauge (requests being answered now).
``return_spec_tokens_details: true`` adds SGLang's ``sglext.spec_tokens_details`` to the answer;
``--per-request-metrics`` adds vLLM's ``metrics.speculative_decoding`` (``--per-request-spec-decode-metrics
summary``) to the final usage chunk (or the answer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import sys
import time

from aiohttp import web


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--steps", type=int, default=0, help="num_steps K (draft tokens per verify step)")
    p.add_argument("--accept-prob", type=float, default=0.7, help="per-draft-token acceptance probability")
    p.add_argument("--tokens-per-second", type=float, default=5000.0, help="decode speed (sleep per chunk)")
    p.add_argument("--step-ms", type=float, default=0.0, help="each verify step (chunk) takes this long whatever "
                   "its tokens, instead of --tokens-per-second: accepted drafts come free, so a larger K is faster")
    p.add_argument("--metrics", choices=("vllm", "spectune", "none"), default="vllm")
    p.add_argument("--model", default="fake-model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-delay", type=float, default=0.0, help="s to wait before listening")
    p.add_argument("--fail-start", action="store_true", help="print an error and exit 1 before listening")
    p.add_argument("--fail-message", default="RuntimeError: fake_server: simulated startup failure")
    p.add_argument("--exit-after-requests", type=int, default=0, help="exit (code 3) after N completions")
    p.add_argument("--adaptive-config", default="", help="a vLLM schedule is followed (K per request from the "
                   "requests in flight when it starts, capped at --steps); anything else accepted and ignored (a "
                   "launch template's {adaptive_config})")
    p.add_argument("--per-request-metrics", action="store_true", help="add vLLM's metrics.speculative_decoding")
    p.add_argument("--chunk-tokens", type=int, default=1, help="merge this many steps into one streamed chunk (a "
                   "server that streams several tokens per chunk, with or without speculation)")
    p.add_argument("--never-answer", action="store_true", help="healthy, but completions never send a byte")
    p.add_argument("--api-key", default=None, help="accepted and ignored (printed at start, like real servers)")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None, help="accepted and ignored")
    return p.parse_args(argv)


class Counters:
    """vLLM-style cumulative spec-decode counters in their own prometheus-client registry."""

    def __init__(self, prefix: str, steps: int, model: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        start = Gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                      registry=self.registry)
        start.set(time.time())  # what prometheus-client's ProcessCollector reports: restart detection
        labels, values = ["model_name", "engine"], [model, "0"]
        self.running = Gauge(prefix + "num_requests_running", "Requests being answered.", labels,
                             registry=self.registry).labels(*values)
        if steps <= 0:
            return

        def counter(name: str, doc: str, extra: list[str] | None = None) -> Counter:
            return Counter(prefix + name, doc, labels + (extra or []), registry=self.registry)

        self.drafts = counter("spec_decode_num_drafts", "Number of spec decoding drafts.").labels(*values)
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Number of draft tokens.").labels(*values)
        self.accepted = counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.").labels(*values)
        per_pos = counter("spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                          ["position"])
        self.per_pos = [per_pos.labels(*values, str(i)) for i in range(steps)]

    per_pos: list | None = None  # no spec-decode counters at K = 0

    def observe(self, drafted: int, accepted: int) -> None:
        self.drafts.inc()
        self.draft_tokens.inc(drafted)
        self.accepted.inc(accepted)
        for i in range(accepted):
            self.per_pos[i].inc()

    def text(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


class FakeServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        prefix = {"vllm": "vllm:", "spectune": "spectune:"}.get(args.metrics)
        self.counters = Counters(prefix, args.steps, args.model) if prefix else None
        self.finished = 0
        self.inflight = 0
        self.schedule = None  # a vLLM num_speculative_tokens_per_batch_size schedule given as --adaptive-config
        if args.adaptive_config:
            from spectune.backends.num_steps.sglang_config import VllmSchedule, load_config_file

            try:
                cfg = load_config_file(args.adaptive_config, strict=False)
            except Exception:  # noqa: BLE001 - not a config spectune reads (a llama.cpp settings file): ignored
                cfg = None
            self.schedule = cfg if isinstance(cfg, VllmSchedule) else None

    def steps_now(self) -> int:
        """K for a request starting now: --steps, or the vLLM schedule's K at the requests in flight (capped)."""
        if self.schedule is None:
            return self.args.steps
        return min(self.args.steps, self.schedule.k_for_batch_size(max(1, self.inflight)))

    def plan(self, max_tokens: int) -> tuple[list[int], dict]:
        """Chunk sizes for one request and its SGLang-style spec details."""
        k, chunks = self.steps_now(), [1]
        verify = correct = 0
        hist = [0] * (k + 1)
        while sum(chunks) < max_tokens:
            accepted = 0
            while accepted < k and self.rng.random() < self.args.accept_prob:
                accepted += 1
            accepted = min(accepted, max_tokens - sum(chunks) - 1)
            if k > 0:
                verify, correct = verify + 1, correct + accepted
                hist[accepted] += 1
                if self.counters and self.counters.per_pos is not None:
                    self.counters.observe(k, accepted)
            chunks.append(accepted + 1)
        n = max(1, self.args.chunk_tokens)
        chunks = [sum(chunks[i:i + n]) for i in range(0, len(chunks), n)]
        details = {"spec_verify_ct": verify, "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": verify * k,
                   "spec_accept_length": (sum(chunks) / verify) if verify else 0.0,
                   "spec_correct_drafts_histogram": hist if k > 0 else []}
        return chunks, details

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.inflight += 1
        if self.counters:
            self.counters.running.inc()
        try:
            return await self._completions(request)
        finally:
            self.inflight -= 1
            if self.counters:
                self.counters.running.dec()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.args.never_answer:
            await asyncio.sleep(3600)
        chat = request.path.endswith("/chat/completions")
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt_tokens = len(json.dumps(body.get("messages") or body.get("prompt") or "").split())
        chunks, details = self.plan(max(1, max_tokens))
        sglext = {"spec_tokens_details": details} if body.get("return_spec_tokens_details") else None
        k = self.args.steps
        vllm_metrics = {"speculative_decoding": {
            "num_spec_steps": details["spec_verify_ct"],
            "num_accepted_draft_tokens": details["spec_num_correct_drafts"],
            "num_draft_tokens": details["spec_num_proposed_drafts"], "num_spec_tokens": k,
            "acceptance_histogram": {str(j): n for j, n in enumerate(details["spec_correct_drafts_histogram"]) if n}}
        } if self.args.per_request_metrics and k > 0 else None
        rid, created, n = f"cmpl-{self.finished}", int(time.time()), sum(chunks)
        obj = "chat.completion" if chat else "text_completion"

        def choice(text: str, finish: str | None, stream: bool) -> dict:
            if not chat:
                return {"index": 0, "text": text, "finish_reason": finish}
            key = "delta" if stream else "message"
            return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish}

        def usage(done: int) -> dict:
            return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}

        if not body.get("stream"):
            await asyncio.sleep(n / self.args.tokens_per_second)
            out = {"id": rid, "object": obj, "created": created, "model": self.args.model,
                   "choices": [choice("tok " * n, "length", False)], "usage": usage(n)}
            if sglext:
                out["sglext"] = sglext
            if vllm_metrics:
                out["metrics"] = vllm_metrics
            self._finished()
            return web.json_response(out)
        opts = body.get("stream_options") or {}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(payload: dict) -> None:
            await resp.write(f"data: {json.dumps(payload)}\n\n".encode())

        done = 0
        for i, size in enumerate(chunks):
            step_ms = self.args.step_ms
            await asyncio.sleep(step_ms / 1000.0 if step_ms > 0 else size / self.args.tokens_per_second)
            done += size
            last = i == len(chunks) - 1
            event = {"id": rid, "object": obj + ".chunk", "created": created, "model": self.args.model,
                     "choices": [choice("tok " * size, "length" if last else None, True)]}
            if opts.get("continuous_usage_stats"):
                event["usage"] = usage(done)
            await send(event)
        if sglext:
            await send({"id": rid, "object": obj + ".chunk", "created": created, "model": self.args.model,
                        "choices": [], "sglext": sglext})
        if opts.get("include_usage"):
            final = {"id": rid, "object": obj + ".chunk", "created": created, "model": self.args.model,
                     "choices": [], "usage": usage(done)}
            await send({**final, "metrics": vllm_metrics} if vllm_metrics else final)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self._finished()
        return resp

    def _finished(self) -> None:
        self.finished += 1
        if self.args.exit_after_requests and self.finished >= self.args.exit_after_requests:
            asyncio.get_running_loop().call_later(0.05, os._exit, 3)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.args.model, "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        if self.args.metrics == "none":
            raise web.HTTPNotFound()
        text = self.counters.text() if self.counters else ""
        return web.Response(text=text, content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_post("/v1/completions", self.completions)
        return app


class FakeServers:
    """In-process fake servers, one per num_steps: ``{steps: base_url}``."""

    def __init__(self, **per_steps: str) -> None:
        self.args = {int(k[1:]): a for k, a in per_steps.items()}  # k3="--accept-prob 1.0" -> steps 3
        self.runners: list[web.AppRunner] = []
        self.urls: dict[int, str] = {}

    async def __aenter__(self) -> dict[int, str]:
        for steps, extra in self.args.items():
            args = parse_args(["--port", "0", "--steps", str(steps), *shlex.split(extra)])
            runner = web.AppRunner(FakeServer(args).app(), shutdown_timeout=1.0)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.runners.append(runner)
            self.urls[steps] = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return self.urls

    async def __aexit__(self, *exc) -> None:
        for runner in self.runners:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"fake_server: starting on {args.host}:{args.port} (steps {args.steps}); args {sys.argv[1:]}", flush=True)
    if os.environ.get("HF_TOKEN"):
        print(f"fake_server: logged in to the hub with token {os.environ['HF_TOKEN']}", flush=True)
    if args.fail_start:
        print(args.fail_message, file=sys.stderr, flush=True)
        sys.exit(1)
    time.sleep(args.startup_delay)
    web.run_app(FakeServer(args).app(), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
