"""The ``local`` sweep backend: the bundled engine in a server subprocess, reused across num_steps.

One server is launched for the whole sweep with its cache sized for the largest swept num_steps; between points
``start(K)`` switches it with ``POST /spectune/num_steps`` (the engine is idle then), so weights load once. If the
server died (killed mid-point) the next ``start`` relaunches it. Acceptance comes from the engine's own
``spectune:spec_decode_*`` counters over each window. With ``options.adaptive_config`` (an SGLang adaptive JSON or
a vLLM schedule, checked when the backend is built) the engine is launched with that per-batch-size policy and the
K given to ``start`` only sets its initial tier. ``--server-args`` are ``spectune serve``'s engine options
(``--native-dense-above 8``, ``--dtype native``, ...: :func:`~spectune.backends.local.options.parse_server_args`),
written into the server's options and recorded in sweep.json's ``backend.engine.server_args``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Sequence

import aiohttp

from spectune.backends.base import Backend, BackendStartError, ScheduleServer
from spectune.backends.options import BackendOptions, Endpoint
from spectune.backends.snapshots import ENGINE_ROWS_KEY, ENGINE_TIME_KEYS, SpecSnapshot
from spectune.backends.eagle_heads import eagle_version
from spectune.backends.launch import LaunchingBackend
from spectune.backends.local.options import DEFAULT_HEAD, check_compile_mode, parse_server_args
from spectune.backends.local.weights.loader import is_default_model
from spectune.backends.num_steps import load_config_file
from spectune.backends.prometheus import scrape_snapshot
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject

KV_BYTES_PER_TOKEN_GUESS = 32 * 1024  # SmolLM2 target + draft use ~24 KB per token in bf16; sizes the budget
#: What a bundled CPU server holds besides its KV cache (GiB): weights with the native path's dense copy, torch and the
#: compiled graphs. The default pair's servers of a validate bake-off (32 slots, a 2.0 GiB cache budget) held 2.4-2.8
#: GiB resident each (``ps -o rss``; the five with num_steps capacity 4 the most; docs/validate.md).
SERVER_BASE_GIB = 0.9


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _head_method(model: str | None, draft: str | None) -> tuple[str | None, str]:
    """(EAGLE version of the head the bundled engine loads for ``model``/``draft``, where it came from); (None, why)
    when it loads none. The head is chosen as :func:`spectune.backends.local.options.resolve_draft` does."""
    if draft is not None and str(draft).lower() == "none":
        return None, "no draft head"
    if draft is None:
        if not is_default_model(model):
            return None, "no draft head"
        return eagle_version(str(DEFAULT_HEAD))[0], f"bundled head backends/local/heads/{DEFAULT_HEAD.name}"
    return eagle_version(str(draft))


def engine_threads() -> int:
    """Torch threads for the sweep's server: one fewer than the machine's CPUs (at least 1), as the ``llamacpp``
    backend's ``-t``. The load generator runs on the same machine, and torch's OpenMP threads meet at a barrier
    after every op: when one shares its core with another busy process, each barrier waits for a scheduler slice.
    Measured on 2 cores with other processes busy: the README's main job decoded about
    2 tokens/s per request with 2 threads (6 requests in 7 minutes) where one thread decodes 22 tokens/s
    (``benchmarks/engine_speed.py --threads 1``)."""
    return max(1, (os.cpu_count() or 1) - 1)


def _launch_options(opts: JsonObject) -> JsonObject:
    """A server's EngineOptions fields less those ``POST /spectune/num_steps`` sets in place."""
    return {k: v for k, v in opts.items() if k not in ("num_steps", "num_steps_capacity", "draft_p_min")}


class LocalBackend(LaunchingBackend):
    """Bundled EAGLE engine (``python -m spectune.backends.local``), one process per sweep."""

    name = "local"
    embeds_default_pair = True
    cheap_switch = True  # start(K) switches the running engine in place
    allow_remote = False
    running_gauges = ("spectune:num_requests_running",)
    p_min_flag = "--draft-p-min"  # spectune serve's flag; the server subprocess reads it as EngineOptions.draft_p_min

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        if not is_default_model(options.model) and not Path(str(options.model)).expanduser().exists():
            raise UserError(f"--model {options.model} does not exist: give a GGUF file or a Hugging Face folder")
        if options.draft is not None and options.draft.lower() != "none" and not Path(options.draft).is_dir():
            raise UserError(f"--draft {options.draft} is not a folder: give an EAGLE head folder")
        check_compile_mode(options.local.compile)
        self.server_overrides = parse_server_args(list(options.server_args))  # a bad one fails here, before launching
        if options.adaptive_config:
            load_config_file(options.adaptive_config)  # a bad file fails here, not in the server process
        self.capacity = 0
        self.engine_path: JsonObject | None = None
        self.server_capacity = 0  # the largest num_steps the running server's cache was sized for
        self.server_p_min: float | None = None  # the cutoff the running server was last set to (None: never set)

    async def preflight(self, steps_list: Sequence[int]) -> list[str]:
        self.capacity = max(steps_list, default=0)
        return await super().preflight(steps_list)

    def build_argv(self, steps: int, host: str, port: int) -> list[str]:
        opts = self._server_options(steps)
        return [sys.executable, "-m", "spectune.backends.local", "--options", json.dumps(opts), "--host", host,
                "--port", str(port)]

    def server_memory_gib(self, steps: int) -> float | None:
        """The server's KV cache budget (``kv_cache_gb`` of its options) plus :data:`SERVER_BASE_GIB` for the rest of
        the process, on CPU; None on CUDA (the cache lives on the GPU)."""
        device = str(self.options.local.device)
        if device == "cuda" or (device == "auto" and _cuda_available()):
            return None
        return float(self._server_options(steps)["kv_cache_gb"]) + SERVER_BASE_GIB

    def _server_options(self, steps: int) -> dict[str, Any]:
        """The server process's EngineOptions fields for num_steps ``steps`` (``--server-args`` applied)."""
        o = self.options
        max_len = 2048
        slots = max(o.max_concurrency, 1)
        opts = {"model": o.model, "draft": o.draft, "num_steps": steps, "num_steps_capacity": max(self.capacity, steps),
                "dtype": o.local.dtype, "device": o.local.device, "max_num_seqs": slots, "max_model_len": max_len,
                "kv_cache_gb": max(1.0, slots * (max_len + 8) * KV_BYTES_PER_TOKEN_GUESS / 2**30),
                "threads": engine_threads(), "compile": o.local.compile}
        pinned = self.pinned_config_path(steps)
        if pinned or o.adaptive_config:
            opts["adaptive_config"] = pinned or str(Path(o.adaptive_config or "").resolve())
        if o.schedule_server_max_k is not None:
            opts["num_steps_capacity"] = max(self.capacity, steps, o.schedule_server_max_k)
        if o.draft_p_min is not None:  # sweep --p-min: each row stops drafting under P, at most num_steps tokens
            opts["draft_p_min"] = o.draft_p_min
        opts.update(self.server_overrides)  # --server-args win, as on every launched server
        return opts

    def schedule_server(self) -> ScheduleServer | None:
        """The bundled engine's schedule server: adaptive mode with a vLLM schedule, whose lazy drafting runs no head
        in prefills and K=0 rounds (``backends/local/engine/speculative.py``), so it is not expected to cost more
        than the static server; measured when asked (``--schedule-server on``). A schedule server is relaunched
        per num_steps instead of switched in place."""
        return ScheduleServer("spectune", "adaptive mode with num_speculative_tokens_per_batch_size [[1, N, K]] "
                              "(lazy drafting)", "backends/local/engine/speculative.py", costs_more=False)

    async def start(self, steps: int) -> Endpoint:
        """Switch the running server to ``steps`` or launch one (see module docstring)."""
        if self.options.schedule_server_max_k is not None:  # a pinned schedule is the server's config: relaunch per K
            if self.server is not None and self.steps != steps:
                await LaunchingBackend.stop(self)
            endpoint = await super().start(steps)
            self.engine_path = await self._engine_path(endpoint.base_url)
            return endpoint
        if self.server is not None and self.server.alive() and steps <= self.server_capacity:
            url = f"{self.server.base_url}/spectune/num_steps"
            body: JsonObject = {"num_steps": steps}
            if self.options.draft_p_min != self.server_p_min:  # another cutoff (a server handed over): 0 = off
                body["draft_p_min"] = self.options.draft_p_min or 0.0
            detail = ""
            for _ in range(60):  # 409 while aborted requests of the last point are still leaving: retry
                try:
                    async with aiohttp.ClientSession() as session:
                        async with session.post(url, json=body) as resp:
                            if resp.status == 200:
                                self.steps, self.server_p_min = steps, self.options.draft_p_min
                                return Endpoint(self.server.base_url, None)
                            detail = await resp.text()
                            if resp.status != 409:
                                break
                except aiohttp.ClientError as err:
                    detail = str(err)
                    break
                await asyncio.sleep(0.5)
            raise BackendStartError(f"could not switch the bundled server to num_steps {steps}: {detail}",
                                    self.server.log_tail())
        self.steps = None  # forces a (re)launch in the parent
        endpoint = await super().start(steps)
        self.server_capacity = int(self._server_options(steps)["num_steps_capacity"])
        self.server_p_min = self.options.draft_p_min
        self.engine_path = await self._engine_path(endpoint.base_url)
        return endpoint

    async def _engine_path(self, base_url: str) -> JsonObject | None:
        """The compute path the server chose (``/server_info`` ``engine_path``: ``--dtype auto`` is decided in the
        server at start-up), or None when the server does not say."""
        info = await self._server_info(base_url)
        return None if info is None else info.get("engine_path")

    async def _server_info(self, base_url: str) -> JsonObject | None:
        """The server's ``/server_info`` object, or None when it does not answer with one."""
        from spectune.backends.http import auth_headers

        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base_url}/server_info",
                                       headers=auth_headers(self.options.api_key_env)) as resp:
                    body = await resp.json() if resp.status == 200 else None
                    return body if isinstance(body, dict) else None
        except (aiohttp.ClientError, ValueError):
            return None

    async def stop(self) -> None:
        """Keep the server between num_steps: the next ``start(K)`` switches it instead of reloading weights."""

    async def close(self) -> None:
        """End of the sweep: stop the server and wait until its port is free."""
        await LaunchingBackend.stop(self)

    async def hand_over(self, successor: Backend) -> bool:
        """Give the running server to ``successor`` when it is a ``local`` backend whose server would differ only in
        num_steps (within this server's capacity) and draft-confidence cutoff: its ``start(K)`` then sets both in
        place (``POST /spectune/num_steps`` with ``draft_p_min``, ``backends/local/server/app.py``) instead of
        launching a server of its own (loading weights and compiling again). ``sweep --p-min`` thus measures every
        cutoff on the static cells' server. The successor's ``launches`` records the server it switched
        (``adopted``: its pid, port, command and log). Not for schedule servers (relaunched per num_steps)."""
        if not isinstance(successor, LocalBackend) or successor.server is not None or self.server is None \
                or not self.server.alive():
            return False
        if self.options.schedule_server_max_k is not None or successor.options.schedule_server_max_k is not None:
            return False
        if _launch_options(self._server_options(0)) != _launch_options(successor._server_options(0)) \
                or successor.capacity > self.server_capacity:
            return False
        last = self.launches[-1] if self.launches else {}
        if all(r.get("pid") != last.get("pid") for r in successor.launches):  # not its own server back
            record: JsonObject = {"adopted": True, **{k: last[k] for k in ("command", "port", "pid") if k in last}}
            if last.get("log") and successor.options.log_dir:  # from the successor's results folder (logs/..)
                log = Path(str(last["log"]))
                if last.get("adopted") and self.options.log_dir:  # relative to this backend's results folder
                    log = Path(self.options.log_dir).absolute().parent / log
                record["log"] = os.path.relpath(log.absolute(), Path(successor.options.log_dir).absolute().parent)
            successor.launches.append(record)
        successor.server, successor.steps, successor._windows_on_server = self.server, self.steps, \
            self._windows_on_server
        successor.server_capacity, successor.server_p_min = self.server_capacity, self.server_p_min
        successor.engine_path = self.engine_path
        self.server = None
        return True

    async def snapshot(self) -> SpecSnapshot | None:
        """The engine's ``spectune:`` counters from /metrics, with its time counters in ``raw``
        (:data:`~spectune.backends.snapshots.ENGINE_TIME_KEYS` and ``ENGINE_ROWS_KEY``;
        ``backends/local/server/metrics.py``) and, when its ``spectune:engine_slow_round_shapes`` counter is above 0,
        the step model's warnings from ``/server_info`` in ``raw["engine_warnings"]``
        (``backends/local/engine/step_model.py``)."""
        if self.base_url is None:
            return None
        snap = await scrape_snapshot(self.base_url, prefixes=("spectune:",), extra_counters={
            **{key: f"spectune:engine_{key}" for key in (*ENGINE_TIME_KEYS, ENGINE_ROWS_KEY)},
            "slow_round_shapes": "spectune:engine_slow_round_shapes"})
        if snap is not None and float(snap.raw.get("slow_round_shapes") or 0) > 0:  # type: ignore[arg-type]
            info = await self._server_info(self.base_url)
            warnings = ((info or {}).get("step_model") or {}).get("warnings")
            if isinstance(warnings, list):
                snap.raw["engine_warnings"] = warnings
        return snap

    def speculative_method(self) -> str | None:
        """The EAGLE version of the head the engine loads (the bundled EAGLE-3 head for the default target)."""
        return _head_method(self.options.model, self.options.draft)[0]

    @classmethod
    def draft_algorithm(cls, description: JsonObject) -> tuple[str | None, str]:
        """``draft_algorithm``, else the head the recorded ``engine`` options load (``draft`` None with the
        default target: the bundled head, ``backends/local/heads/smollm2-135m-eagle3``)."""
        if description.get("draft_algorithm"):
            return super().draft_algorithm(description)
        engine = description.get("engine") or {}
        return _head_method(engine.get("model", description.get("model")),
                            engine.get("draft", description.get("draft")))

    def describe(self) -> JsonObject:
        """Launching description plus the engine options (model, draft, device, dtype, max_concurrency) and, once
        the server is up, the compute path it runs (``engine.path``: see
        ``backends/local/weights/compute_paths.py``)."""
        d = super().describe()
        o = self.options
        d["engine"] = {"model": o.model, "draft": o.draft, "max_concurrency": o.max_concurrency,
                       "device": o.local.device, "dtype": o.local.dtype}
        if getattr(self, "engine_path", None) is not None:
            d["engine"]["path"] = self.engine_path  # what --dtype auto chose on this machine
        if self.server_overrides:
            d["engine"]["server_args"] = dict(self.server_overrides)  # what --server-args set on its servers
        return d
