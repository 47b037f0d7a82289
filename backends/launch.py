"""Backends that launch one server per num_steps: the shared machinery and the ``launch`` (command template) backend.

:class:`LaunchingBackend` keeps at most one server alive. ``start(K)`` returns the running endpoint when the
server for K is alive, relaunches it when it died, and otherwise stops the current server and launches the one
for K (checking the executable and the port first). Every launch's command line (secrets redacted), port, log
and pid are recorded for ``describe()``. Subclasses build the argv (:meth:`LaunchingBackend.build_argv`).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

from spectune.backends.base import Backend, BackendStartError, PinnedSchedule, ScheduleServer, pinned_vllm_schedule
from spectune.backends.options import BackendOptions, Endpoint
from spectune.backends.snapshots import Acceptance, SpecSnapshot, has_counters, zero_steps_acceptance
from spectune.backends.eagle_heads import eagle_version
from spectune.backends.http import HEALTH_PATHS, auth_headers, check_reachable
from spectune.backends.openai import EndpointSet
from spectune.backends.process import ServerProcess, free_port, port_in_use, redact_argv
from spectune.backends.prometheus import RUNNING_GAUGES, scrape_running, scrape_snapshot, scrape_switches
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord

PLACEHOLDERS = ("steps", "draft_tokens", "port", "model", "draft", "host", "adaptive_config")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def find_executable(name: str, install_hint: str) -> str:
    """Absolute path of ``name`` (a path or a name on PATH).

    Raises:
        UserError: not found or not executable; the message ends with ``install_hint``.
    """
    path = shutil.which(name)
    if path is None:
        raise UserError(f"{name} not found: {install_hint}")
    return path


def split_template(template: str) -> list[str]:
    """Split a command template with :func:`shlex.split` and check its placeholders.

    Raises:
        UserError: empty template, unbalanced quotes, or an unknown ``{name}`` placeholder.
    """
    try:
        argv = shlex.split(template or "")
    except ValueError as err:
        raise UserError(f"cannot split the --launch template ({err}): check its quotes") from None
    if not argv:
        raise UserError("empty --launch template: give the server command, e.g. 'vllm serve MODEL --port {port}'")
    for arg in argv:
        for name in _PLACEHOLDER.findall(arg):
            if name not in PLACEHOLDERS:
                known = ", ".join("{%s}" % p for p in PLACEHOLDERS)
                raise UserError(f"unknown placeholder {{{name}}} in the --launch template: use {known}")
    return argv


def render_template(argv: Sequence[str], values: JsonObject) -> list[str]:
    """Replace ``{name}`` placeholders in each argv element (other braces, e.g. JSON, are left alone)."""
    def fill(match: re.Match[str]) -> str:
        return str(values[match.group(1)]) if match.group(1) in values else match.group(0)

    return [_PLACEHOLDER.sub(fill, arg) for arg in argv]


class LaunchingBackend(Backend):
    """A backend that launches and stops its own server per num_steps (see module docstring).

    Subclasses implement :meth:`build_argv` and :meth:`check_executable`, and may set ``health_paths``. With
    ``options.endpoints`` (and ``allow_remote``) nothing is launched: ``start`` selects the running server for K,
    as the ``openai`` backend does, and :meth:`remote_checks` may warn about what those servers report.
    """

    name = "launching"
    health_paths: tuple[str, ...] = HEALTH_PATHS
    allow_remote = True  # with options.endpoints, use running servers instead of launching
    running_gauges: tuple[str, ...] = RUNNING_GAUGES  # the engine's running-requests gauge(s), first found wins
    #: the :meth:`describe` key under which this engine records the speculative method it launched (SGLang's
    #: ``algorithm``, vLLM's ``method``), read back by :meth:`draft_algorithm`; None: no such key
    method_key: str | None = None

    def __init__(self, options: BackendOptions) -> None:
        if options.startup_timeout_s <= 0:
            raise UserError(f"startup timeout must be > 0 s, got {options.startup_timeout_s}")
        if options.port is not None and not 0 < options.port < 65536:
            raise UserError(f"bad port {options.port}: use 1-65535, or omit it to pick a free port")
        self.options = options
        self.server: ServerProcess | None = None
        self.steps: int | None = None  # num_steps of the last start()
        self.launches: list[JsonObject] = []
        self._windows_on_server = 0
        self.remote = EndpointSet(options.endpoints) if (options.endpoints and self.allow_remote) else None
        self.headers = auth_headers(options.api_key_env) if self.remote else {}
        self._remote_url: str | None = None

    # -- subclass hooks -------------------------------------------------------------------------------------
    def build_argv(self, steps: int, host: str, port: int) -> list[str]:
        """The server command for num_steps ``steps`` listening on ``host:port``."""
        raise NotImplementedError

    def check_executable(self) -> None:
        """Raise :class:`UserError` naming the package to install when the server program is missing."""

    def server_env(self) -> dict[str, str]:
        """Environment variables added for launched servers (recorded with each launch); none here."""
        return {}

    async def remote_checks(self, steps_list: Sequence[int]) -> list[str]:
        """Warnings about running servers (endpoints mode), e.g. a server whose num_steps differs; none here."""
        return []

    @classmethod
    def draft_algorithm(cls, description: JsonObject) -> tuple[str | None, str]:
        """``draft_algorithm``, else the method recorded under :attr:`method_key` (``EAGLE3``, ``eagle3``... in
        lower case), else the base rule (:meth:`spectune.backends.base.Backend.draft_algorithm`)."""
        key = cls.method_key
        if key and not description.get("draft_algorithm") and description.get(key):
            return str(description[key]).lower(), f"sweep.json {key}"
        return super().draft_algorithm(description)

    def pinned_config(self, steps: int, max_k: int) -> PinnedSchedule | JsonObject:
        """The per-batch-size config that pins this engine's schedule server to num_steps ``steps`` (``max_k``: the
        largest K a schedule would carry): a vLLM schedule by default (:func:`pinned_vllm_schedule`, the last range
        ending at the plan's highest concurrency); backends whose engine reads another format override it."""
        return pinned_vllm_schedule(steps, max_k, self.options.max_concurrency)

    def pinned_config_path(self, steps: int) -> str | None:
        """With ``options.schedule_server_max_k``: :meth:`pinned_config` for ``steps`` written as JSON into the log
        folder (a temporary folder without one), and its absolute path; None for a static server."""
        max_k = self.options.schedule_server_max_k
        if max_k is None:
            return None
        folder = Path(self.options.log_dir) if self.options.log_dir else Path(tempfile.mkdtemp(prefix="spectune-"))
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"schedule-server-steps{steps}.json"
        path.write_text(json.dumps(self.pinned_config(steps, max_k)) + "\n")
        return str(path.resolve())

    @property
    def base_url(self) -> str | None:
        """URL of the current server (launched or selected), or None between points."""
        return self.server.base_url if self.server is not None else self._remote_url

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def preflight(self, steps_list: Sequence[int]) -> list[str]:
        """Before measuring: the executable exists, every argv builds, a fixed port is free.

        Raises:
            UserError: a missing executable, a bad option for some num_steps, or the port in use; in endpoints
                mode, a num_steps without endpoint or an endpoint that does not answer.
        """
        if self.remote is not None:
            for url in sorted({self.remote.url_for(k) for k in steps_list}):
                await check_reachable(url, self.headers)
            return await self.remote_checks(steps_list)
        self.check_executable()
        for k in steps_list:
            self.build_argv(k, self.options.host, self.options.port or 0)
        if self.server is None and self.options.port is not None:
            self._check_port(self.options.port)
        return []

    def _check_port(self, port: int) -> None:
        if port_in_use(self.options.host, port):
            raise UserError(
                f"port {port} on {self.options.host} is already in use: stop what listens there, "
                "pass another --port, or omit --port to pick a free one"
            )

    async def start(self, steps: int) -> Endpoint:
        """Return the endpoint of an alive server for ``steps``, launching (or relaunching) it if needed.

        Raises:
            UserError: missing executable, bad options, port in use.
            BackendStartError: the server exited during startup or was not healthy in time (log tail attached).
        """
        if self.remote is not None:
            url = self.remote.url_for(steps)
            await check_reachable(url, self.headers)
            self.steps, self._remote_url = steps, url
            return Endpoint(url, None)
        if self.server is not None and self.steps == steps and self.server.alive():
            return Endpoint(self.server.base_url, None)
        if self.server is not None:
            if not self.server.alive() and self.launches:  # killed or crashed since the last point
                self.launches[-1]["died"] = True
            await self.stop()
        self.check_executable()
        port = self.options.port or free_port(self.options.host)
        argv = self.build_argv(steps, self.options.host, port)
        self._check_port(port)
        log_path = Path(self.options.log_dir) / f"server-steps{steps}.log" if self.options.log_dir else None
        label = f"server for num_steps {steps}"
        env = self.server_env()
        server = ServerProcess(argv, self.options.host, port, log_path, self.health_paths, label, env)
        record: JsonObject = {"steps": steps, "command": redact_argv(argv), "port": port, "started": time.time()}
        if env:
            record["env"] = dict(env)
        self.launches.append(record)
        self.server, self.steps, self._windows_on_server = server, steps, 0
        try:
            await server.start(self.options.startup_timeout_s)
        except BaseException as err:
            if not isinstance(err, BackendStartError):  # cancelled or interrupted mid-startup: leave nothing behind
                server.kill_now()
            self.server, self.steps = None, None
            record["failed"] = True
            raise
        finally:
            record.update(log=str(server.log_path), pid=server.pid, ready_after_s=server.ready_after_s)
        return Endpoint(server.base_url, None)

    async def stop(self) -> None:
        """Stop the running server (SIGTERM, then SIGKILL) and wait until its port is free; no-op if none."""
        server, self.server, self._remote_url = self.server, None, None  # self.steps stays: the last point's K
        if server is not None:
            await server.stop()

    async def running_requests(self) -> tuple[float, str] | None:
        """The current server's running-requests gauge (:attr:`running_gauges` on ``/metrics``), or None."""
        url = self.base_url
        return None if url is None else await scrape_running(url, self.running_gauges, self.headers or None)

    async def switches(self) -> tuple[float, str] | None:
        """The ``spectune:spec_num_steps_switches_total`` counter on /metrics (the bundled engine's, and any
        server exposing it), or None."""
        url = self.base_url
        return None if url is None else await scrape_switches(url, self.headers or None)

    def next_window(self) -> bool:
        """Count one measured window on the running server; True if it was the first since the server launched."""
        self._windows_on_server += 1
        return self.server is not None and self._windows_on_server == 1

    def failure_log(self) -> str:
        """The launched server's log tail when it has exited (crashed or killed), else "". Called when a point
        failed: a server killed moments ago may not be reaped yet, so it gets up to 1 s to be seen as exited."""
        if self.server is not None and self.server.proc is not None:
            try:
                self.server.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                return ""  # still running: the point failed for another reason
        if self.server is not None and not self.server.alive():
            self.server.wait_log(2.0)  # the copier thread writes the server's last lines after it exits
            return self.server.log_tail()
        return ""

    def acceptance(
        self, before: SpecSnapshot | None, after: SpecSnapshot | None, records: Sequence[RequestRecord]
    ) -> Acceptance:
        """Counter deltas from ``/metrics`` when present; else 1.0 at num_steps 0
        (:func:`~spectune.backends.snapshots.zero_steps_acceptance`); else the proxy (:meth:`Backend.acceptance` for
        both)."""
        self.next_window()
        if self.steps == 0 and not has_counters(before, after):
            return zero_steps_acceptance(records)
        return super().acceptance(before, after, records)

    def speculative_method(self) -> str | None:
        """The launched servers' speculative method in lower case (``"eagle"``/``"eagle3"``), or None when unknown:
        here the draft head's EAGLE version (:func:`eagle_version`); engine backends return what they launch with."""
        return eagle_version(self.options.draft)[0] if self.options.draft else None

    def describe(self) -> JsonObject:
        """Backend name, model, draft, its speculative method (``draft_algorithm``), every launch so far (command
        lines with secrets redacted), for a schedule server what it is (``schedule_server``: ScheduleServer's
        fields and ``max_k``) and, with ``options.draft_p_min``, the cutoff (``draft_p_min``)."""
        if self.remote is not None:
            return {"backend": self.name, "endpoints": self.remote.describe(), "api_key_env": self.options.api_key_env}
        d = {"backend": self.name, "model": self.options.model, "draft": self.options.draft,
             "draft_algorithm": self.speculative_method(), "launches": [dict(r) for r in self.launches]}
        server = self.schedule_server() if self.options.schedule_server_max_k is not None else None
        if server is not None:
            d["schedule_server"] = {**server.to_json(), "max_k": self.options.schedule_server_max_k}
        if self.options.draft_p_min is not None:
            d["draft_p_min"] = self.options.draft_p_min
        return d

    def p_min_args(self, p_min: float) -> list[str] | None:
        """:meth:`Backend.p_min_args` for the servers this backend launches; None with running endpoints (their flags
        are not spectune's to set)."""
        return None if self.remote is not None else super().p_min_args(p_min)


class LaunchBackend(LaunchingBackend):
    """The ``launch`` backend: any server from a command template (``options.launch``).

    Placeholders: ``{steps}`` (num_steps K), ``{draft_tokens}`` (K + 1), ``{port}``, ``{model}``, ``{draft}``,
    ``{host}``, ``{adaptive_config}`` (``options.adaptive_config``, the empty string when unset). Acceptance:
    vLLM-style or spectune counters from ``/metrics`` when the server has them, else the tokens-per-chunk proxy.

    Raises (constructor):
        UserError: no template, an unknown placeholder, or ``{model}``/``{draft}`` used without a value.
    """

    name = "launch"
    allow_remote = False

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        if not options.launch:
            raise UserError("the launch backend needs --launch 'COMMAND ... --port {port} ...' (a command template)")
        self.template = split_template(options.launch)
        used = {n for a in self.template for n in _PLACEHOLDER.findall(a)}
        for name in ("model", "draft"):
            if name in used and not getattr(options, name):
                raise UserError(f"the --launch template uses {{{name}}} but no --{name} was given")
        if "port" not in used and options.port is None:
            raise UserError("the --launch template has no {port}: add '--port {port}' or pass a fixed --port")

    def check_executable(self) -> None:
        find_executable(self.template[0], "install it or fix the first word of the --launch template")

    def schedule_server(self) -> ScheduleServer | None:
        """A template with ``{adaptive_config}`` can run a schedule server: it gets a vLLM schedule pinned to K
        (:meth:`LaunchingBackend.pinned_config`). Whether it costs more than the static server is the engine's
        business, unknown here, so it is measured only when asked (``--schedule-server on``)."""
        if "adaptive_config" not in {n for a in self.template for n in _PLACEHOLDER.findall(a)}:
            return None
        return ScheduleServer("launch", "{adaptive_config} = a vLLM schedule {\"num_speculative_tokens\": max K, "
                              "\"num_speculative_tokens_per_batch_size\": [[1, N, K]]}", "the --launch template",
                              costs_more=False)

    def build_argv(self, steps: int, host: str, port: int) -> list[str]:
        """The template with placeholders filled for ``steps`` (K), ``port`` and the options; ``{adaptive_config}``
        is the pinned schedule's file on a schedule server (:meth:`LaunchingBackend.pinned_config_path`)."""
        pinned = self.pinned_config_path(steps)
        values = {"steps": steps, "draft_tokens": steps + 1, "port": port, "host": host,
                  "model": self.options.model or "", "draft": self.options.draft or "",
                  "adaptive_config": pinned or self.options.adaptive_config or ""}
        return render_template(self.template, values)

    async def snapshot(self) -> SpecSnapshot | None:
        """Counters from ``/metrics`` if the launched server exposes vLLM-style or spectune ones."""
        if self.base_url is None:
            return None
        return await scrape_snapshot(self.base_url)
