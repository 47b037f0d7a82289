"""How fast can the load generator read streams on ONE core? (The client must never be the bottleneck.)

A local aiohttp server, in separate processes pinned to other cores, streams chat-completion chunks with
continuous usage (1, 3, 2, 4 tokens per chunk in turn) as fast as it can, every stream getting one chunk per
"decode step" (each handler yields after each chunk, as an engine emits one chunk per step for every running
request). Each chunk's content is its send time from ``time.monotonic()`` (CLOCK_MONOTONIC, system-wide on
Linux; ``time.perf_counter`` reads the same clock), so the client's per-chunk lag = receive time - send time.

The client process is pinned to one core and runs closed loops of 64 and 256 streams with long outputs, twice:

- ``loadgen``: :func:`spectune.loadgen.run_point` with :class:`spectune.loadgen.StreamingClient` (SSE parsing, one
json.loads per
  event, usage deltas, records), i.e. exactly what ``spectune sweep`` runs;
- ``baseline``: a minimal raw aiohttp reader in the same process that only counts events per read
  (``bytes.count``) and pulls the stamps out with one regex per read, no JSON parsing.

Printed per row: sustained chunks/s and tokens/s over the steady part of the run, timestamp lag p50/p99 in ms, and
the client process's CPU use (100 % = the client core is saturated). Bar: >= 20,000 chunks/s at 256 streams.

Run: ``python benchmarks/loadgen_overhead.py`` (about 35 s; ``--seconds`` shortens it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import socket
import time

import numpy as np

SIZES = (1, 3, 2, 4)
STAMP = re.compile(rb'"content":"([0-9.]+);')


# --- server (separate processes) ---------------------------------------------------------------------------------


def serve(port: int, cores: set[int], ready) -> None:
    """Run the streaming server on ``port`` (SO_REUSEPORT, so several processes can share it)."""
    from aiohttp import web

    os.sched_setaffinity(0, cores)
    head = b'data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,'
    pre = head + b'"delta":{"content":"'
    mid = (b';"},"logprobs":null,"finish_reason":null}],'
           b'"usage":{"prompt_tokens":40,"total_tokens":0,"completion_tokens":')
    done = (b'data: {"id":"chatcmpl-0","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":%d}}\n\n'
            b"data: [DONE]\n\n")

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        ct, monotonic, write, step = 0, time.monotonic, resp.write, asyncio.sleep
        try:
            for i in range(body["max_tokens"]):
                ct += SIZES[i & 3]
                await write(b"%s%.6f%s%d}}\n\n" % (pre, monotonic(), mid, ct))
                await step(0)  # next stream's turn: one chunk per stream per "decode step"
            await write(done % ct)
        except (ConnectionError, RuntimeError):
            pass  # client went away (end of a run)
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, reuse_port=True, backlog=1024).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


# --- clients ------------------------------------------------------------------------------------------------------


async def cpu_window(t0: float, warm: float, seconds: float) -> tuple[float, float, float, float]:
    """(t_a, cpu_a, t_b, cpu_b): wall time (perf_counter) and this process's CPU time at t0 + warm and t0 + seconds."""
    await asyncio.sleep(max(0.0, t0 + warm - time.perf_counter()))
    ta, ca = time.perf_counter(), time.process_time()
    await asyncio.sleep(max(0.0, t0 + seconds - time.perf_counter()))
    return ta, ca, time.perf_counter(), time.process_time()


async def run_loadgen(url: str, streams: int, seconds: float, chunks: int, warm: float):
    """Closed loop through loadgen; returns arrays of chunk times, tokens and lags, and the CPU window."""
    from spectune.loadgen import ClientConfig, ClosedLoop, Constraints, StreamingClient, run_point
    from spectune.loadgen.datasets import user_prompt

    prompts = [user_prompt(str(i), None, "hello " * 20) for i in range(16)]
    async with StreamingClient(ClientConfig(url, model="m", max_tokens=chunks)) as client:
        limits = Constraints(max_duration_s=seconds, drain_timeout_s=0.5)
        point = run_point(client, prompts, ClosedLoop(streams), limits)
        res, cpu = await asyncio.gather(point, cpu_window(time.perf_counter(), warm, seconds))
    times, tokens, lags = [], [], []
    for r in res.records:
        stamps = np.array(r.output_text.split(";")[:-1], dtype=float)
        times.append(np.array(r.chunk_times))
        tokens.append(np.array(r.chunk_tokens))
        lags.append(times[-1] - stamps)
    return np.concatenate(times), np.ones(sum(map(len, times))), np.concatenate(tokens), np.concatenate(lags), cpu


async def run_baseline(url: str, streams: int, seconds: float, chunks: int, warm: float):
    """Closed loop of minimal raw readers: read times, events per read, tokens (2.5 per event), lags, CPU window."""
    import aiohttp

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello " * 20}], "stream": True,
                       "max_tokens": chunks, "stream_options": {"include_usage": True,
                                                                "continuous_usage_stats": True}}).encode()
    t0 = time.perf_counter()
    end = t0 + seconds
    times, counts, lags = [], [], []

    async def worker(session) -> None:
        while time.perf_counter() < end:
            async with session.post(url + "/v1/chat/completions", data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                async for data in resp.content.iter_any():
                    now = time.perf_counter()
                    times.append(now)
                    counts.append(data.count(b"\n\n"))
                    lags.extend(now - float(s) for s in STAMP.findall(data))
                    if now > end + 0.5:
                        break

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        *_, cpu = await asyncio.gather(*(worker(session) for _ in range(streams)), cpu_window(t0, warm, seconds))
    n = np.array(counts, dtype=float)
    return np.array(times), n, n * 2.5, np.array(lags), cpu


def measure(kind: str, url: str, streams: int, seconds: float, chunks: int, warm: float) -> dict:
    """One run; rates over the steady part (after the ramp-up, before sending stops)."""
    run = run_loadgen if kind == "loadgen" else run_baseline
    times, counts, tokens, lags, (ta, ca, tb, cb) = asyncio.run(run(url, streams, seconds, chunks, warm))
    sel = (times >= ta) & (times < tb)
    span, cpu = tb - ta, cb - ca
    n = counts[sel].sum()
    return {"mode": kind, "streams": streams, "chunks_s": n / span, "tokens_s": tokens[sel].sum() / span,
            "lag_p50_ms": np.percentile(lags, 50) * 1e3, "lag_p99_ms": np.percentile(lags, 99) * 1e3,
            "cpu_pct": 100 * cpu / span, "chunks_cpu_s": n / cpu if cpu else float("nan")}


def hot_loop_cost(events: int = 100_000) -> list[tuple[int, float, float]]:
    """In-process cost of the client's per-event work, no network: (events per read, loadgen us/event, baseline).

    Feeds pre-built reads to :meth:`StreamingClient._read_stream` (SSE split, json, usage delta, timestamps) and to
    the baseline's per-read work (count + stamp regex).
    """
    from spectune.loadgen import ClientConfig, StreamingClient
    from spectune.loadgen.record import RequestRecord

    event = (b'data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index"'
             b':0,"delta":{"content":"12345.678901;"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens"'
             b':40,"total_tokens":0,"completion_tokens":%d}}\n\n')

    class Content:
        def __init__(self, reads: list[bytes]) -> None:
            self.reads = iter(reads)

        async def readany(self) -> bytes:
            return next(self.reads, b"")

        def at_eof(self) -> bool:
            return True

    class Resp:
        pass

    out = []
    for per_read in (1, 8):
        evs = [event % (i + 1) for i in range(events)]
        reads = [b"".join(evs[i : i + per_read]) for i in range(0, events, per_read)] + [b"data: [DONE]\n\n"]
        resp, client = Resp(), StreamingClient(ClientConfig("http://x", model="m"))
        resp.content = Content(reads)
        rec = RequestRecord("r", "p", None, 0.0)
        t = time.perf_counter()
        asyncio.run(client._read_stream(resp, rec))  # noqa: SLF001 - measuring the hot loop itself
        lg = (time.perf_counter() - t) / events * 1e6
        assert len(rec.chunk_times) == events
        t, n, lags = time.perf_counter(), 0, []
        for data in reads:
            now = time.perf_counter()
            n += data.count(b"\n\n")
            lags.extend(now - float(s) for s in STAMP.findall(data))
        out.append((per_read, lg, (time.perf_counter() - t) / events * 1e6))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--seconds", type=float, default=6.0, help="sending time per run, s")
    ap.add_argument("--warm", type=float, default=1.5, help="ramp-up excluded from the rates, s")
    ap.add_argument("--chunks", type=int, default=2000, help="chunks per request (long outputs)")
    ap.add_argument("--server-procs", type=int, default=1, help="server processes (more need more cores)")
    args = ap.parse_args()
    if time.get_clock_info("perf_counter").implementation != time.get_clock_info("monotonic").implementation:
        print("warning: perf_counter and monotonic differ on this platform: lag numbers are meaningless")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs at least 2 CPU cores (client on one, server on another)")
    client_core, server_cores = cores[0], set(cores[1 : 1 + args.server_procs])
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        procs = []
        for _ in range(args.server_procs):
            ready = ctx.Event()
            p = ctx.Process(target=serve, args=(port, server_cores, ready), daemon=True)
            p.start()
            ready.wait(30)
            procs.append(p)
    os.sched_setaffinity(0, {client_core})
    url = f"http://127.0.0.1:{port}"
    print(f"client on core {client_core}; {args.server_procs} server process(es) on cores {sorted(server_cores)}; "
          f"{args.seconds:g} s per run, rates over [{args.warm:g}, {args.seconds:g}] s")
    rows = []
    try:
        for streams in args.streams:
            for kind in ("baseline", "loadgen"):
                rows.append(measure(kind, url, streams, args.seconds, args.chunks, args.warm))
    finally:
        for p in procs:
            p.terminate()
            p.join(5)
    print(f"{'mode':<9} {'streams':>7} {'chunks/s':>10} {'tokens/s':>10} {'lag p50 ms':>11} {'lag p99 ms':>11} "
          f"{'client CPU':>10} {'chunks/CPU-s':>12}")
    for r in rows:
        print(f"{r['mode']:<9} {r['streams']:>7} {r['chunks_s']:>10,.0f} {r['tokens_s']:>10,.0f} "
              f"{r['lag_p50_ms']:>11.2f} {r['lag_p99_ms']:>11.2f} {r['cpu_pct']:>9.0f}% {r['chunks_cpu_s']:>12,.0f}")
    print("\nhot loop alone, in-process (no network, no aiohttp), us per event:")
    for per_read, lg, base in hot_loop_cost():
        print(f"  {per_read} event(s) per read: loadgen {lg:.2f} us (ceiling {1e6 / lg:,.0f} events/s), "
              f"baseline {base:.2f} us")


if __name__ == "__main__":
    main()
