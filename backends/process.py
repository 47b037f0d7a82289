"""One launched server process: start it in its own session, wait until healthy, stop its whole group.

The command runs without a shell (an argv list). Its stdout and stderr go through a pipe to a thread that redacts
each line (:class:`spectune.backends.redact.Redactor`: the secret values of the environment and of the command line, API
keys printed with the server's arguments, credentials in URLs) before appending it to the log file, so nothing
the server prints about its secrets reaches the results folder. ``stop`` sends SIGTERM to the process group
(servers such as SGLang and vLLM spawn workers), waits, then SIGKILLs what is left and waits until the port is
free, so the next launch can bind it. Servers still alive when the interpreter exits are killed by an ``atexit``
hook.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Callable

from spectune.backends.base import BackendStartError
from spectune.backends.http import HEALTH_PATHS, probe
from spectune.backends.redact import Redactor, argv_secrets, redact_argv
from spectune.core.errors import UserError

__all__ = ["ServerProcess", "free_port", "port_in_use", "redact_argv", "wait_port_free", "wait_while", "OOM_PATTERNS"]

#: Log lines that mean the server ran out of (GPU) memory while starting.
OOM_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|Not enough memory|"
    r"No available memory for the cache blocks|CUBLAS_STATUS_ALLOC_FAILED|insufficient (GPU |KV cache )?memory",
    re.IGNORECASE,
)
_LIVE: set["ServerProcess"] = set()
_LINE_LIMIT = 1 << 16  # bytes; a longer line is redacted and written in pieces


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free on ``host`` right now (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """True when binding ``host:port`` fails with SO_REUSEADDR set (a listener holds it; TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


async def wait_while(busy: Callable[[], bool], timeout_s: float, interval_s: float) -> bool:
    """Poll ``busy()`` every ``interval_s`` s until it is False; False if it is still True after ``timeout_s`` s."""
    deadline = time.monotonic() + timeout_s
    while busy():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval_s)
    return True


async def wait_port_free(host: str, port: int, timeout_s: float = 30.0) -> bool:
    """Poll until nothing listens on ``host:port``; False if it is still taken after ``timeout_s`` s."""
    return await wait_while(lambda: port_in_use(host, port), timeout_s, 0.1)


def _copy_redacted(pipe: IO[bytes], log: IO[bytes], redactor: Redactor) -> None:
    """Copy ``pipe`` to ``log`` line by line through ``redactor`` until the pipe closes (every writer exited)."""
    with pipe:
        for line in iter(lambda: pipe.readline(_LINE_LIMIT), b""):
            try:
                log.write(redactor(line.decode("utf-8", "replace")).encode("utf-8"))
                log.flush()
            except (OSError, ValueError):  # full disk, or the log closed under us: keep draining the pipe
                pass


class ServerProcess:
    """A server started from ``argv`` that listens on ``host:port``.

    Args:
        argv: the command, run without a shell; ``argv[0]`` must be an executable path or name on PATH.
        host, port: where the server listens (its base URL is ``http://host:port``).
        log_path: file that receives stdout and stderr (appended), or None for a new temporary file.
        health_paths: paths probed until one answers 200.
        label: a short name for messages (``"server for num_steps 3"``).
        env: variables added to this process's environment for the server (None: none).
    """

    def __init__(
        self, argv: list[str], host: str, port: int, log_path: Path | None = None,
        health_paths: tuple[str, ...] = HEALTH_PATHS, label: str = "server", env: dict[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env or {})
        self.host = host
        self.port = port
        self.health_paths = health_paths
        self.label = label
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="spectune-server-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self.log_path = Path(log_path)
        self._log_offset = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_after_s: float | None = None
        self.redactor = Redactor(argv_secrets(self.argv))
        self._copier: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port`` (a wildcard bind address is reached through loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id of the launched command (also its process group id), or None before launch."""
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        """True while the launched process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines this launch wrote to its log ("" if none)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])

    async def start(self, timeout_s: float) -> None:
        """Launch and wait until a health path answers 200.

        Raises:
            UserError: ``argv[0]`` cannot be executed (callers normally check this first).
            BackendStartError: the process exited during startup, or was not healthy within ``timeout_s`` s (it
                is then stopped); the message says so, names an out-of-memory failure, and carries the log tail.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self._log_offset = log.tell()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"=== spectune {stamp}: {redact_argv(self.argv, self.redactor)}\n".encode())
        log.flush()
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, **self.env} if self.env else None
            )
        except OSError as err:  # not found / not executable
            log.close()
            raise UserError(f"cannot run {self.argv[0]}: {err.strerror or err}") from None
        assert self.proc.stdout is not None
        self._copier = threading.Thread(target=self._copy, args=(self.proc.stdout, log), daemon=True,
                                        name=f"spectune-log-{self.port}")
        self._copier.start()
        _LIVE.add(self)
        t0 = time.monotonic()
        delay = 0.05
        while True:
            if not self.alive():
                code = self.proc.returncode
                await self.stop()
                raise self._start_error(f"{self.label} exited with code {code} during startup")
            reply = await probe(self.base_url, self.health_paths, timeout_s=3.0)
            if reply.status == 200 and self.alive():
                self.ready_after_s = time.monotonic() - t0
                return
            if time.monotonic() - t0 > timeout_s:
                await self.stop()
                raise self._start_error(f"{self.label} was not healthy within {timeout_s:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _copy(self, pipe: IO[bytes], log: IO[bytes]) -> None:
        with log:
            _copy_redacted(pipe, log, self.redactor)

    def wait_log(self, timeout_s: float = 5.0) -> None:
        """Wait until everything the server printed is in the log (its output pipe closed), at most ``timeout_s``."""
        if self._copier is not None:
            self._copier.join(timeout_s)

    def _start_error(self, message: str) -> BackendStartError:
        if not self.alive():
            self.wait_log(2.0)
        tail = self.log_tail()
        if OOM_PATTERNS.search(tail):
            message += " (out of GPU memory: lower the memory fraction, max running requests or context length)"
        return BackendStartError(f"{message}; log {self.log_path}:\n{tail}", log_tail=tail)

    async def stop(self, grace_s: float = 30.0, port_timeout_s: float = 30.0) -> None:
        """SIGTERM the process group, wait up to ``grace_s`` s, SIGKILL what is left, then wait for the port."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        _signal_group(pgid, signal.SIGTERM)
        if not await _wait_group(self.proc, pgid, grace_s):
            _signal_group(pgid, signal.SIGKILL)
            await _wait_group(self.proc, pgid, 10.0)
        _LIVE.discard(self)
        await asyncio.get_running_loop().run_in_executor(None, self.wait_log, 5.0)
        await wait_port_free(self.host, self.port, port_timeout_s)

    def kill_now(self) -> None:
        """Synchronous SIGKILL of the group (interpreter exit)."""
        if self.proc is not None:
            _signal_group(self.proc.pid, signal.SIGKILL)
        _LIVE.discard(self)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(proc: subprocess.Popen[bytes], pgid: int) -> bool:
    if proc.poll() is None:
        return True
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def _wait_group(proc: subprocess.Popen[bytes], pgid: int, timeout_s: float) -> bool:
    return await wait_while(lambda: _group_alive(proc, pgid), timeout_s, 0.05)


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_LIVE):
        server.kill_now()
