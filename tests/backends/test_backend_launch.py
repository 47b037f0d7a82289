"""The launch backend and process machinery end to end on tests/fake_server.py (real subprocesses)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from spectune.backends import make_backend
from spectune.backends.base import BackendStartError
from spectune.backends.options import BackendOptions
from spectune.backends.launch import render_template, split_template
from spectune.backends.process import port_in_use, redact_argv
from spectune.core.errors import UserError
from helpers.paths import FAKE_SERVER

FAKE = FAKE_SERVER
SERVER = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --port {{port}} --steps {{steps}}"


def launch(tmp_path: Path, extra: str = "", **kw) -> object:
    opts = BackendOptions(launch=f"{SERVER} {extra}", log_dir=tmp_path, startup_timeout_s=kw.pop("timeout", 15.0), **kw)
    return make_backend("launch", opts)


async def stream(base_url: str, max_tokens: int) -> list[dict]:
    """One streamed chat completion; returns the parsed SSE events."""
    import json

    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    events = []
    async with aiohttp.ClientSession() as session:
        async with session.post(base_url + "/v1/chat/completions", json=body) as resp:
            async for line in resp.content:
                line = line.strip()
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    events.append(json.loads(line[6:]))
    return events


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_launch_measure_reuse_and_stop(tmp_path):
    backend = launch(tmp_path, "--accept-prob 1.0")
    assert await backend.preflight([0, 3]) == []
    endpoint = await backend.start(3)
    pid, port = backend.server.pid, backend.server.port
    assert endpoint.base_url == f"http://127.0.0.1:{port}"
    before = await backend.snapshot()
    events = await stream(endpoint.base_url, 9)
    after = await backend.snapshot()
    # every draft accepted: chunks of 1 (prefill) + 4 + 4 tokens, two verify steps with 3 accepted each
    assert [e["usage"]["completion_tokens"] for e in events if e["choices"]] == [1, 5, 9]
    acc = backend.acceptance(before, after, [])
    assert (acc.acceptance_length, acc.acceptance_rate, acc.num_drafts) == (4.0, 1.0, 2.0)
    assert acc.per_position == [1.0, 1.0, 1.0]
    assert acc.source == "vllm:/metrics counters"
    again = await backend.start(3)  # same K, alive: the same server
    assert again == endpoint
    assert backend.server.pid == pid
    launches = backend.describe()["launches"]
    assert len(launches) == 1
    assert "--steps 3" in launches[0]["command"]
    assert launches[0]["pid"] == pid
    await backend.stop()
    assert gone(pid)
    assert not port_in_use("127.0.0.1", port)
    assert "fake_server: starting" in (tmp_path / "server-steps3.log").read_text()


def wait_dead(backend) -> int:
    deadline = time.monotonic() + 5
    while backend.server.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return backend.server.proc.returncode


async def test_relaunch_after_death_and_switch_steps(tmp_path):
    backend = launch(tmp_path, "--exit-after-requests 1")
    endpoint = await backend.start(1)
    first = backend.server.pid
    await stream(endpoint.base_url, 4)  # the server exits (code 3) after this request: it died mid-point
    assert wait_dead(backend) == 3
    await backend.start(1)
    second = backend.server.pid
    assert second != first
    assert backend.describe()["launches"][0]["died"] is True
    os.killpg(second, signal.SIGKILL)  # killed from outside between two points
    assert wait_dead(backend) == -signal.SIGKILL
    await backend.start(1)
    third = backend.server.pid
    await backend.start(0)  # another K: the K = 1 server is stopped first
    assert gone(third)
    assert backend.steps == 0
    assert backend.acceptance(None, None, []).source == "config:num_steps=0"  # --metrics vllm but K = 0: no counters
    await backend.close()
    launches = backend.describe()["launches"]
    assert backend.server is None
    assert [x["steps"] for x in launches] == [1, 1, 1, 0]
    assert [x.get("died", False) for x in launches] == [True, True, False, False]


async def test_server_that_fails_to_start(tmp_path):
    backend = launch(tmp_path, "--fail-start")
    with pytest.raises(BackendStartError, match="exited with code 1 during startup") as info:
        await backend.start(2)
    assert "simulated startup failure" in info.value.log_tail
    assert "out of GPU memory" not in str(info.value)
    assert backend.server is None
    assert backend.describe()["launches"][0]["failed"] is True


async def test_startup_out_of_memory_is_named(tmp_path):
    backend = launch(tmp_path, "--fail-start --fail-message 'torch.OutOfMemoryError: CUDA out of memory.'")
    with pytest.raises(BackendStartError, match="out of GPU memory"):
        await backend.start(2)


async def test_server_that_never_becomes_healthy_is_stopped(tmp_path):
    backend = launch(tmp_path, "--startup-delay 60", timeout=1.0)
    with pytest.raises(BackendStartError, match="not healthy within 1 s"):
        await backend.start(0)
    assert gone(backend.launches[0]["pid"])


async def test_port_in_use_is_a_user_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        backend = launch(tmp_path, port=port)
        with pytest.raises(UserError, match=f"port {port} on 127.0.0.1 is already in use"):
            await backend.preflight([1])
        with pytest.raises(UserError, match=f"port {port}"):
            await backend.start(1)


async def test_missing_executable_is_a_user_error(tmp_path):
    backend = make_backend("launch", BackendOptions(launch="no-such-server-xyz --port {port}"))
    with pytest.raises(UserError, match="no-such-server-xyz not found"):
        await backend.preflight([0])


def test_template_placeholders():
    argv = split_template("srv --port {port} --n {draft_tokens} --cfg '{\"k\": {steps}}' --m {model}")
    assert render_template(argv, {"port": 8, "draft_tokens": 4, "steps": 3, "model": "a b"}) == [
        "srv", "--port", "8", "--n", "4", "--cfg", '{"k": 3}', "--m", "a b"]
    with pytest.raises(UserError, match=r"unknown placeholder \{stepz\}"):
        split_template("srv --port {port} --k {stepz}")
    with pytest.raises(UserError, match=r"uses \{draft\} but no --draft"):
        make_backend("launch", BackendOptions(launch="srv --port {port} --d {draft}"))
    with pytest.raises(UserError, match=r"no \{port\}"):
        make_backend("launch", BackendOptions(launch="srv --k {steps}"))
    with pytest.raises(UserError, match="needs --launch"):
        make_backend("launch", BackendOptions())
    static = make_backend("launch", BackendOptions(launch="srv --port {port} --cfg {adaptive_config}"))
    assert static.build_argv(2, "h", 8) == ["srv", "--port", "8", "--cfg", ""]
    adaptive = make_backend("launch", BackendOptions(launch="srv --port {port} --cfg {adaptive_config}",
                                                     adaptive_config="/x/a.json"))
    assert adaptive.build_argv(2, "h", 8) == ["srv", "--port", "8", "--cfg", "/x/a.json"]


def test_command_lines_hide_secrets():
    line = redact_argv(["srv", "--api-key", "s3cret", "--hf-token=abc", "--port", "1"])
    assert "s3cret" not in line
    assert "abc" not in line
    assert line.startswith("srv --api-key")
    assert "--port 1" in line
