"""Shared helpers for tests that run the real SmolLM2 target: a random EAGLE-3 head and a server in a thread."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import torch

from backends.local.build import DEFAULT_HEAD, EngineOptions, build_engine


def random_smollm2_head(folder: Path) -> Path:
    """A random EAGLE-3 head shaped for SmolLM2-135M (draft vocab 1024), saved in the published layout."""
    from backends.local.eagle import DraftConfig, DraftHead
    from backends.local.heads import save_head
    from backends.local.weights import load_target

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
    """Runs :class:`backends.local.server.Server` on its own event loop in a daemon thread."""

    def __init__(self, opts: EngineOptions, model_name: str = "smollm2-test", api_key: str | None = None) -> None:
        from aiohttp import web

        from backends.local.server import Server

        self.engine = build_engine(opts)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        app = Server(self.engine, model_name, api_key).app()
        self.runner = web.AppRunner(app)
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.runner.setup())
            self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(30)

    def close(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop)
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
