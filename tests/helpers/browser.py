"""Headless Chromium driven over the DevTools protocol (a websocket through aiohttp), for tests that check what a
person sees on an HTML page: console errors, images that loaded, where elements sit, screenshots.

    python tests/helpers/browser.py PAGE.html OUT_DIR   # OUT_DIR/report-1280x800.png and report-390px.png

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it); :func:`find_chromium` returns None without it,
and tests skip with that reason. The browser listens on 127.0.0.1 only, on a port it picks (read from its
``DevToolsActivePort`` file), with a throw-away profile; every wait is bounded and the process group is killed on exit.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

START_TIMEOUT_S = 20.0
CALL_TIMEOUT_S = 20.0


def find_chromium() -> str | None:
    """The Chromium executable (``SPECTUNE_CHROMIUM``, else ``chromium``/``chromium-browser`` on PATH), or None."""
    env = os.environ.get("SPECTUNE_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab: navigate, evaluate JavaScript, screenshot; console errors, uncaught exceptions and failed loads
    collected in :attr:`errors`."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.errors: list[str] = []
        self.events: list[str] = []
        self.pending: dict[int, asyncio.Future] = {}
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
                continue
            method, params = data.get("method", ""), data.get("params", {})
            self.events.append(method)
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                self.errors.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                          for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                self.errors.append("exception: " + params["exceptionDetails"].get("text", ""))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                e = params["entry"]
                self.errors.append(f"{e.get('source')}: {e.get('text')} {e.get('url', '')}".strip())

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its ``result``. Raises RuntimeError on a protocol error, TimeoutError after
        CALL_TIMEOUT_S."""
        self.next_id += 1
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send_str(json.dumps({"id": self.next_id, "method": method, "params": params}))
        data = await asyncio.wait_for(fut, CALL_TIMEOUT_S)
        if "error" in data:
            raise RuntimeError(f"{method}: {data['error']}")
        return data.get("result", {})

    async def open(self, url: str, width: int, height: int, mobile: bool = False) -> None:
        """Load ``url`` in a ``width`` x ``height`` viewport (``mobile``: a phone's, honouring the viewport meta
        tag) and wait for its load event and for every image to decode (bounded)."""
        self.errors.clear()
        await self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                        mobile=mobile)
        self.events.clear()
        await self.call("Page.navigate", url=url)
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while "Page.loadEventFired" not in self.events:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: no load event in {CALL_TIMEOUT_S} s")
            await asyncio.sleep(0.05)
        await self.eval("Promise.all([...document.images].map(i => i.decode().catch(() => null))).then(() => 1)")

    async def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited), as JSON data."""
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression[:60]}: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    async def screenshot(self, path: Path, full_page: bool = False) -> None:
        """A PNG of the viewport (``full_page``: the whole document at the viewport's width) at ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = await self.eval("({w: document.documentElement.scrollWidth, "
                                   "h: document.documentElement.scrollHeight})")
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": size["w"], "height": size["h"],
                                                            "scale": 1})
        res = await self.call("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(res["data"]))


class Chromium:
    """``async with Chromium() as page:`` a headless Chromium with one tab (:class:`Page`), stopped on exit."""

    def __init__(self, executable: str | None = None) -> None:
        self.executable = executable or find_chromium()
        if not self.executable:
            raise FileNotFoundError("chromium not found (Debian: apt-get install chromium)")
        self.proc: subprocess.Popen | None = None
        self.profile = tempfile.mkdtemp(prefix="spectune-chromium-")
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.page: Page | None = None

    async def __aenter__(self) -> Page:
        try:
            return await self._start()
        except BaseException:
            await self.__aexit__()
            raise

    async def _start(self) -> Page:
        self.proc = subprocess.Popen(
            [self.executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--disable-sync", "--hide-scrollbars", "--mute-audio", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        port_file, deadline = Path(self.profile) / "DevToolsActivePort", time.monotonic() + START_TIMEOUT_S
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"chromium exited with code {self.proc.returncode}: {err[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium wrote no DevToolsActivePort in {START_TIMEOUT_S} s")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S))
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as r:
            targets = await r.json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
        self.ws = await self.session.ws_connect(url, max_msg_size=0)
        self.page = Page(self.ws)
        for domain in ("Page", "Runtime", "Log"):
            await self.page.call(f"{domain}.enable")
        return self.page

    async def __aexit__(self, *exc: object) -> None:
        if self.page:
            self.page.reader.cancel()
        if self.ws:
            await self.ws.close()
        if self.session:
            await self.session.close()
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=5)
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)


async def screenshots(page_path: Path, out: Path) -> list[Path]:
    """``report-1280x800.png`` (the first screen on a laptop) and ``report-390px.png`` (the whole page on a 390 px
    wide phone) of ``page_path`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report-1280x800.png", out / "report-390px.png"]
    async with Chromium() as page:
        await page.open(page_path.resolve().as_uri(), 1280, 800)
        await page.screenshot(paths[0])
        await page.open(page_path.resolve().as_uri(), 390, 844, mobile=True)
        await page.screenshot(paths[1], full_page=True)
    return paths


if __name__ == "__main__":
    for p in asyncio.run(screenshots(Path(sys.argv[1]), Path(sys.argv[2]))):
        print(p)
