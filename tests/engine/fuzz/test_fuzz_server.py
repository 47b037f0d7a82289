"""The fuzz corpus (tests/fuzz/corpus.py) against the real bundled server, concurrently, while a good request is
timed every half second: every well-formed request gets a valid answer or a 4xx/5xx JSON error, the process never
dies, no slot stays taken, and the good requests keep being served.

The figures (cases sent, statuses seen, crashes, slots leaked, the good request's answer time idle and during the
storm) are printed (``pytest -s``) and, when ``SPECTUNE_FUZZ_REPORT`` names a file, written there as JSON.
"""

from __future__ import annotations

import collections
import concurrent.futures
import http.client
import json
import os
import socket
import statistics
import struct
import threading
import time

import pytest

import corpus
from helpers.engine import SubprocessServer

KEY = "fuzz-key-0c1d"
WORKERS = 16
GOOD = json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}).encode()
TEXT_OK = {"/health", "/metrics"}  # routes whose 200 answer is text


@pytest.fixture(scope="module")
def server():
    srv = SubprocessServer({"num_steps": 2, "num_steps_capacity": 2, "max_num_seqs": 8, "max_model_len": 256,
                            "kv_cache_gb": 0.3, "threads": 1}, api_key=KEY)
    yield srv
    srv.close()


def _request_bytes(case: corpus.Case) -> bytes:
    head = f"{case.method} {case.path} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in case.headers.items())
    return head.encode("utf-8") + f"Content-Length: {len(case.body)}\r\n\r\n".encode() + case.body


def _problem(case: corpus.Case, status: int, ctype: str, body: bytes) -> str | None:
    """Why an answer breaks the rules, or None."""
    if case.method == "HEAD":
        return None
    if status >= 400:
        if not ctype.startswith("application/json"):
            return f"{status} with Content-Type {ctype!r}: {body[:80]!r}"
        err = json.loads(body).get("error")
        if not (isinstance(err, dict) and isinstance(err.get("message"), str) and err.get("code") == status):
            return f"{status} without an OpenAI error object: {body[:80]!r}"
        return None
    if status != 200:
        return f"unexpected status {status}"
    if case.path.split("?")[0] in TEXT_OK:
        return None
    if ctype.startswith("text/event-stream"):
        events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return f"stream without [DONE]: {body[-80:]!r}"
        for e in events[:-1]:
            if not isinstance(json.loads(e), dict):
                return f"stream event that is not an object: {e[:80]}"
        return None
    obj = json.loads(body)
    return None if isinstance(obj, dict) else f"200 body that is not an object: {body[:80]!r}"


def _send_http(addr: tuple[str, int], case: corpus.Case) -> tuple[str, int | None, str | None, str]:
    with socket.create_connection(addr, timeout=120) as sock:
        sock.sendall(_request_bytes(case))
        resp = http.client.HTTPResponse(sock, method=case.method)
        resp.begin()
        body = resp.read()
        status, ctype = resp.status, resp.getheader("Content-Type", "")
    note = f"{case.name}: {body[:160]!r}" if status >= 500 else ""
    try:
        return "http", status, _problem(case, status, ctype, body), note
    except (ValueError, UnicodeDecodeError) as err:
        return "http", status, f"{status} body not parseable ({err}): {body[:80]!r}", note


def _send_raw(addr: tuple[str, int], case: corpus.Case) -> tuple[str, int | None, str | None, str]:
    data = b""
    with socket.create_connection(addr, timeout=3) as sock:  # aiohttp may wait for more bytes: no answer is fine
        try:
            sock.sendall(case.raw)
            while chunk := sock.recv(65536):
                data += chunk
        except (ConnectionError, socket.timeout):
            pass  # closed (or reset) by the server: whatever came before counts
    status = int(data[9:12]) if data.startswith(b"HTTP/1.") and data[9:12].isdigit() else None
    return "raw", status, None if status is None or status >= 400 else f"raw bytes answered {status}", ""


def _disconnect(addr: tuple[str, int], case: corpus.Case, abrupt: bool) -> tuple[str, int | None, str | None, str]:
    sock = socket.create_connection(addr, timeout=30)
    try:
        sock.sendall(case.raw)
        got = 0
        while got < case.read_bytes:
            chunk = sock.recv(min(4096, case.read_bytes - got))
            if not chunk:
                break
            got += len(chunk)
        time.sleep(case.delay_s)
        if abrupt:  # RST instead of FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except (ConnectionError, socket.timeout):
        pass
    finally:
        sock.close()
    return "disconnect", None, None, ""


def _good(addr: tuple[str, int]) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(*addr, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", GOOD, {"Content-Type": "application/json",
                                                             "Authorization": f"Bearer {KEY}"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - t0
    finally:
        conn.close()


def test_the_server_survives_the_corpus(server) -> None:
    addr = ("127.0.0.1", server.port)
    cases = corpus.build(seed=18, auth={"Authorization": f"Bearer {KEY}"})
    idle = [_good(addr) for _ in range(3)]
    assert all(status == 200 for status, _ in idle)

    probes: list[tuple[int, float]] = []
    storming = threading.Event()
    storming.set()

    def probe() -> None:
        while storming.is_set():
            try:
                probes.append(_good(addr))
            except OSError as err:  # noqa: PERF203 - a refused or reset probe is a failed probe
                probes.append((0, float("nan")))
                print(f"probe failed: {err}")
            time.sleep(0.5)

    prober = threading.Thread(target=probe, daemon=True)
    t0 = time.perf_counter()
    prober.start()
    results, problems, server_errors = [], [], []
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        futures = {}
        for i, case in enumerate(cases):
            if case.kind == "http":
                futures[pool.submit(_send_http, addr, case)] = case
            elif case.kind == "raw":
                futures[pool.submit(_send_raw, addr, case)] = case
            else:
                futures[pool.submit(_disconnect, addr, case, i % 2 == 0)] = case
        for fut in concurrent.futures.as_completed(futures):
            case = futures[fut]
            try:
                kind, status, problem, note = fut.result()
            except OSError as err:
                kind, status, problem, note = case.kind, None, f"no answer: {type(err).__name__}: {err}", ""
            results.append((kind, status))
            if note:
                server_errors.append(note)
            if problem:
                problems.append(f"{case.name}: {problem}")
    storm_s = time.perf_counter() - t0
    storming.clear()
    prober.join(130)

    deadline = time.monotonic() + 60
    while (server.gauge("spectune:num_requests_running") or server.gauge("spectune:num_requests_waiting")) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    running = server.gauge("spectune:num_requests_running")
    waiting = server.gauge("spectune:num_requests_waiting")
    log = server.log()
    figures = {
        "cases": len(cases), "by_kind": dict(collections.Counter(k for k, _ in results)),
        "statuses": {str(k): v for k, v in sorted(collections.Counter(
            s for _, s in results if s is not None).items())},
        "no_status": dict(collections.Counter(k for k, s in results if s is None)),
        "5xx": server_errors,
        "rule_violations": len(problems), "crashes": 0 if server.alive() else 1,
        "tracebacks_in_server_log": log.count("Traceback"), "slots_leaked": running, "waiting_left": waiting,
        "storm_s": round(storm_s, 1),
        "good_request_idle_ms": round(statistics.median(t for _, t in idle) * 1000, 1),
        "good_requests_during_storm": len(probes),
        "good_request_storm_ms": {
            "p50": round(statistics.median(t for _, t in probes) * 1000, 1),
            "max": round(max(t for _, t in probes) * 1000, 1)} if probes else None,
        "good_requests_failed": sum(1 for s, _ in probes if s != 200),
    }
    print("\nfuzz figures:", json.dumps(figures, indent=1))
    if os.environ.get("SPECTUNE_FUZZ_REPORT"):
        with open(os.environ["SPECTUNE_FUZZ_REPORT"], "w") as fh:
            json.dump({**figures, "problems": problems}, fh, indent=1)

    assert problems == [], "\n".join(problems[:20])
    assert server.alive()
    assert figures["tracebacks_in_server_log"] == 0, log[-3000:]
    assert running == 0
    assert waiting == 0
    assert probes
    assert figures["good_requests_failed"] == 0
    assert _good(addr)[0] == 200
