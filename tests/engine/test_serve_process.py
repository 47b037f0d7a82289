"""`spectune serve` as users run it: ``python -m spectune.cli serve`` in a real process (the engine loop on the main
thread, SIGTERM/SIGINT handlers), the default SmolLM2 pair on the CPU. API-key auth (from ``$SPECTUNE_API_KEY``
and from ``--api-key``), the control route ``POST /spectune/num_steps`` (200, 400, 409) and a clean exit on
SIGTERM and SIGINT with the port released."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from helpers.engine import bundled_head_available, free_port, wait_healthy

pytestmark = pytest.mark.skipif(not bundled_head_available(), reason="the bundled SmolLM2 head is not installed")

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-test-7f3a"
CHAT = "/v1/chat/completions"
# uncompiled: these tests are about the process, not torch.compile (engine/test_engine_compile.py tests that)
SMALL = ["--device", "cpu", "--max-num-seqs", "2", "--max-model-len", "256", "--kv-cache-gb", "0.2",
         "--compile", "off"]


class Serve:
    """``spectune serve ARGS --port P`` as a subprocess, waited on until /health answers."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, timeout_s: float = 180.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = dict(os.environ)
        full_env.pop("SPECTUNE_API_KEY", None)
        full_env.update(env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "spectune.cli", "serve", *args, "--port", str(self.port)],
                                     cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        why = wait_healthy(self.proc, self.url, timeout_s, interval_s=0.3)
        if why == "exited":
            raise RuntimeError(f"spectune serve exited with {self.proc.returncode}: {self.proc.stderr.read()}")
        if why == "timeout":
            self.proc.kill()
            raise RuntimeError(f"spectune serve not healthy in {timeout_s} s")

    def stop(self, sig: int, timeout_s: float = 30.0) -> tuple[int, str]:
        """Send ``sig``; return (exit code, stderr)."""
        self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"spectune serve ignored signal {sig} for {timeout_s} s: {err[-2000:]}") from None
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def port_is_free(port: int) -> bool:
    """Nothing listens on ``port`` any more: a new server could bind it (SO_REUSEADDR, as aiohttp binds, so
    connections of the old one in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def num_steps(server: Serve) -> int:
    return requests.get(server.url + "/server_info", headers=auth(), timeout=10).json()["speculative_num_steps"]


def draft_length(server: Serve) -> dict | None:
    return requests.get(server.url + "/server_info", headers=auth(), timeout=10).json()["draft_length"]


@pytest.fixture(scope="module")
def served():
    """The default pair at num_steps 3, the key from $SPECTUNE_API_KEY (as the help says: not on the command line)."""
    server = Serve(["--num-steps", "3", "--model-name", "tiny-smol", *SMALL], env={"SPECTUNE_API_KEY": KEY})
    yield server
    server.kill()


def test_the_key_from_the_environment_guards_every_route_but_health(served) -> None:
    assert requests.get(served.url + "/health", timeout=10).status_code == 200
    for path in ("/v1/models", "/metrics", "/server_info"):
        assert requests.get(served.url + path, timeout=10).status_code == 401, path
        assert requests.get(served.url + path, headers=auth("sk-wrong"), timeout=10).status_code == 401, path
    r = requests.post(served.url + CHAT, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                      timeout=30)
    assert r.status_code == 401
    models = requests.get(served.url + "/v1/models", headers=auth(), timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny-smol"]


def test_served_chat_answers_with_the_key(served) -> None:
    body = {"model": "tiny-smol", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6,
            "temperature": 0}
    r = requests.post(served.url + CHAT, json=body, headers=auth(), timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 6


def test_num_steps_route_switches_and_refuses(served) -> None:
    url = served.url + "/spectune/num_steps"
    assert requests.post(url, json={"num_steps": 1}, timeout=10).status_code == 401  # no key
    r = requests.post(url, json={"num_steps": 1}, headers=auth(), timeout=10)
    assert r.json() == {"num_steps": 1, "draft_p_min": 0.0}
    assert num_steps(served) == 1
    # 400: not an integer; above the 3 the cache was sized for (--num-steps 3); above MAX_NUM_STEPS 64
    for body, fragment in (({"num_steps": "two"}, "num_steps"), ({"num_steps": 4}, "exceeds the 3"),
                           ({"num_steps": 65}, "0..64")):
        r = requests.post(url, json=body, headers=auth(), timeout=10)
        assert r.status_code == 400, body
        assert fragment in r.json()["error"]["message"], r.text
    assert num_steps(served) == 1  # refused changes leave it alone
    r = requests.post(url, json={"num_steps": 2, "draft_p_min": 0.6}, headers=auth(), timeout=10)
    assert r.json() == {"num_steps": 2, "draft_p_min": 0.6}
    assert draft_length(served) == {"strategy": "p_min", "threshold": 0.6, "n_max": 2, "acceptance_head": False}
    r = requests.post(url, json={"num_steps": 1, "draft_p_min": 1.5}, headers=auth(), timeout=10)
    assert (r.status_code, r.json()["error"]["param"]) == (400, "draft_p_min")
    r = requests.post(url, json={"num_steps": 1, "draft_p_min": 0}, headers=auth(), timeout=10)
    assert draft_length(served) is None  # a cutoff of 0 switches per-row drafting off
    # 409: a request is in flight (a stream that has sent its first chunk and has many tokens to go)
    body = {"messages": [{"role": "user", "content": "Count to one hundred."}], "max_tokens": 200, "stream": True,
            "temperature": 0, "ignore_eos": True}
    with requests.post(served.url + CHAT, json=body, headers=auth(), stream=True, timeout=120) as stream:
        next(line for line in stream.iter_lines() if line.startswith(b"data:"))
        busy = requests.post(url, json={"num_steps": 3}, headers=auth(), timeout=10)
    assert busy.status_code == 409
    assert "no request is in flight" in busy.json()["error"]["message"]
    deadline = time.monotonic() + 60  # the cut stream is aborted; then the switch goes through
    while requests.post(url, json={"num_steps": 3}, headers=auth(), timeout=10).status_code == 409:
        assert time.monotonic() < deadline, "the aborted stream never left the engine"
        time.sleep(0.2)
    assert num_steps(served) == 3


def test_sigterm_ends_serve_cleanly_and_frees_the_port(served) -> None:
    port = served.port
    code, err = served.stop(signal.SIGTERM)
    assert code == 0, err[-2000:]
    assert "serving tiny-smol on http://127.0.0.1:" in err
    assert "API key required" in err
    assert KEY not in err  # the key is never printed
    assert "Traceback" not in err
    assert port_is_free(port)


def test_sigint_ends_serve_cleanly_api_key_flag_and_open_metrics() -> None:
    """No draft (num_steps 0), ``--api-key`` on the command line, ``--metrics-without-key``; then Ctrl-C."""
    server = Serve(["--draft", "none", "--num-steps", "0", "--api-key", KEY, "--metrics-without-key", *SMALL])
    try:
        assert requests.get(server.url + "/metrics", timeout=10).status_code == 200  # scraper without credentials
        assert requests.get(server.url + "/v1/models", timeout=10).status_code == 401
        assert requests.get(server.url + "/v1/models", headers=auth(), timeout=10).status_code == 200
        r = requests.post(server.url + "/spectune/num_steps", json={"num_steps": 1}, headers=auth(), timeout=10)
        assert r.status_code == 400
        assert "needs a draft head" in r.json()["error"]["message"]
        info = requests.get(server.url + "/server_info", headers=auth(), timeout=10).json()
        assert info["speculative_algorithm"] is None
    finally:
        port = server.port
        code, err = server.stop(signal.SIGINT)
    assert code == 0, err[-2000:]
    assert "Traceback" not in err
    assert port_is_free(port)
