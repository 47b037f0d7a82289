"""Shared helpers for tests that run the real SmolLM2 target: a random EAGLE-3 head and a server in a thread."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import torch

from spectune.backends.local.build import build_engine
from spectune.backends.local.options import DEFAULT_HEAD, EngineOptions


def random_smollm2_head(folder: Path) -> Path:
    """A random EAGLE-3 head shaped for SmolLM2-135M (draft vocab 1024), saved in the published layout."""
    from spectune.backends.local.model.eagle import DraftConfig, DraftHead
    from spectune.backends.local.weights.heads import save_head
    from spectune.backends.local.weights.loader import load_target

    if (folder / "config.json").is_file():
        return folder
    target, _ = load_target(None, torch.float32, "cpu")
    c = target.cfg
    cfg = DraftConfig(kind="eagle3", hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, vocab_size=c.vocab_size,
                      draft_vocab_size=1024, target_hidden_size=c.hidden_size, aux_layers=(1, 14, 26))
    torch.manual_seed(0)
    head = DraftHead(cfg, target.embed_tokens, target.lm_head)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.02)
        head.d2t.zero_()
    save_head(head.to(torch.bfloat16), folder)
    return folder


def bundled_head_available() -> bool:
    """True when the trained SmolLM2 head ships in the package."""
    return (DEFAULT_HEAD / "config.json").is_file()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadedServer:
    """Runs :class:`spectune.backends.local.server.app.Server` on its own event loop in a daemon thread."""

    def __init__(self, opts: EngineOptions | Any, model_name: str = "smollm2-test", api_key: str | None = None,
                 metrics_without_key: bool = False) -> None:
        """``opts``: EngineOptions to build the engine from, or an already built engine (tests/tiny_models.py)."""
        from aiohttp import web

        from spectune.backends.local.server.app import Server

        self.engine = build_engine(opts) if isinstance(opts, EngineOptions) else opts
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self.server = Server(self.engine, model_name, api_key, metrics_without_key)
        self.app_runner = self.server.app_runner()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(self.app_runner.setup())
                self.loop.run_until_complete(web.TCPSite(self.app_runner, "127.0.0.1", self.port).start())
            except BaseException as err:  # noqa: BLE001 - handed to the constructor, which raises it
                failure.append(err)
                return
            finally:
                ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        if not ready.wait(30):
            raise RuntimeError("the test server did not start listening in 30 s")
        if failure:
            raise RuntimeError(f"the test server failed to start: {failure[0]!r}") from failure[0]

    def close(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.app_runner.cleanup(), self.loop)
        fut.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def serve_in_thread(opts: EngineOptions, **kw: Any) -> Iterator[ThreadedServer]:
    """Generator for pytest fixtures: yields a running server and closes it afterwards."""
    server = ThreadedServer(opts, **kw)
    try:
        yield server
    finally:
        server.close()


def wait_healthy(proc: Any, url: str, timeout_s: float, interval_s: float = 0.2) -> str:
    """Poll ``url``/health until it answers 200 while the subprocess ``proc`` runs: "" once healthy, "exited" when
    ``proc`` ended first, "timeout" after ``timeout_s`` seconds (the caller reports and cleans up)."""
    import time

    import requests

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            return "exited"
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return ""
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            return "timeout"
        time.sleep(interval_s)


class SubprocessServer:
    """The real ``python -m spectune.backends.local`` server process (what ``spectune serve`` and the ``local`` sweep
    backend run: the engine loop on the main thread, so an exception that escapes it ends the process).

    Args:
        options: EngineOptions fields as a dict (``--options`` JSON).
        api_key: served API key (passed through an environment variable), or None.
        extra: more command-line arguments.
    """

    def __init__(self, options: dict[str, Any], api_key: str | None = None, extra: tuple[str, ...] = (),
                 log_path: Path | None = None, startup_timeout_s: float = 120.0) -> None:
        import json
        import os
        import subprocess
        import sys
        import tempfile

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        env = dict(os.environ, SPECTUNE_TEST_SERVER_KEY=api_key or "")
        root = Path(__file__).resolve().parents[2]
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="spectune-test-server-", suffix=".log")[1])
        self._log = open(self.log_path, "wb")
        argv = [sys.executable, "-m", "spectune.backends.local", "--options", json.dumps(options), "--port", str(self.port),
                *(["--api-key-env", "SPECTUNE_TEST_SERVER_KEY"] if api_key else []), *extra]
        self.proc = subprocess.Popen(argv, cwd=root, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        why = wait_healthy(self.proc, self.url, startup_timeout_s)
        if why == "exited":
            raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()[-2000:]}")
        if why == "timeout":
            self.close()
            raise RuntimeError(f"server not healthy in {startup_timeout_s} s: {self.log()[-2000:]}")

    def log(self) -> str:
        """Everything the server printed so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def gauge(self, name: str) -> float:
        """A sample of /metrics, e.g. ``spectune:num_requests_running``."""
        import requests

        text = requests.get(self.url + "/metrics", headers=self.headers, timeout=10).text
        line = next(l for l in text.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def watch_rounds(engine) -> list[list[int]]:
    """Record, from now on, each decode round's per-row draft lengths (``decoder.last_round.drafted``): the list
    returned grows by one entry per round of ``engine``."""
    rounds: list[list[int]] = []
    original = engine.decoder.decode_round

    def watched(*args, **kwargs):
        out = original(*args, **kwargs)
        rounds.append(list(engine.decoder.last_round.drafted))
        return out

    engine.decoder.decode_round = watched
    return rounds
