"""The ``sglang`` backend: launches ``python -m sglang.launch_server`` per num_steps, or uses running servers.

Flags (SGLang ``python/sglang/srt/arg_groups/fields/spec.py``, the ``spec`` namespace; their start-up handling in
``python/sglang/srt/arg_groups/speculative_hook.py``; background §2): for K > 0 ``--speculative-algorithm
EAGLE|EAGLE3 --speculative-draft-model-path HEAD --speculative-num-steps K --speculative-eagle-topk 1
--speculative-num-draft-tokens K+1`` (with topk 1 SGLang forces num_draft_tokens = num_steps + 1,
``_handle_eagle_family``); K = 0 has no speculative flags. With EAGLE and ``--max-running-requests`` unset SGLang caps
running requests at 48 (``_handle_eagle_family``), so it is always set to max(highest swept concurrency, 48) (for
K = 0 too, so every K runs under the same scheduler limit). ``--enable-metrics`` exposes ``/metrics``. With
``options.adaptive_config`` (an SGLang adaptive JSON, checked when the backend is built) the K > 0 command also has
``--speculative-adaptive --speculative-adaptive-config FILE``: SGLang then picks num_steps per batch size among the
file's candidate steps, K is only the initial tier, and it must be one of the union of the file's candidates
(``_init_adaptive_speculative_params`` raises ``ValueError`` otherwise). SGLang drops adaptive mode (static
settings, a logged warning) with attention DP (``--enable-dp-attention``; ``adaptive_spec_params.py``,
``adaptive_unsupported_reason``): :meth:`SGLangBackend.preflight` warns.

Acceptance, best first:

1. per request: every request asks ``return_spec_tokens_details``; SGLang answers ``sglext.spec_tokens_details``
   (``spec_verify_ct``, ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``,
   ``spec_correct_drafts_histogram``; older servers put ``spec_verify_ct``, ``spec_accept_token_num``,
   ``spec_draft_token_num`` in ``meta_info``), summed over the window's requests. Acceptance length = 1 +
   accepted drafts / verify steps (the results format's definition, as vLLM's); servers that report no accepted
   count get SGLang's own ``spec_accept_length`` formula, completion tokens / verify steps
   (``tokenizer_manager.py``), which also counts each request's first (prefill) token. An adaptive server reports
   no acceptance rate: SGLang counts proposed drafts as ``spec_verify_ct * (speculative_num_draft_tokens - 1)``
   with the launch value (``tokenizer_manager.py``, ``_calculate_spec_decoding_metrics``), so every verify is
   charged the initial tier's drafts whatever tier ran it (acceptance length is not affected).
2. ``GET /server_info`` (``/get_server_info`` on old servers) ``internal_states[i].avg_spec_accept_length``: a
   server-lifetime average, scoped to the window only on a server launched for this point.
3. the ``sglang:spec_accept_length`` gauge (recent batches only), with a warning.

Running batch size: the ``sglang:num_running_reqs`` gauge (``python/sglang/srt/metrics/collector.py``; refreshed
when the scheduler logs a decode batch, every ``--decode-log-interval`` batches).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Sequence, TypedDict

from spectune.backends.base import ScheduleServer
from spectune.backends.options import BackendOptions
from spectune.backends.snapshots import Acceptance, SpecSnapshot, chunk_proxy_acceptance, zero_steps_acceptance
from spectune.backends.methods import engine_method, launch_method
from spectune.backends.http import get
from spectune.backends.launch import LaunchingBackend
from spectune.backends.num_steps import AdaptiveConfig, load_config_file
from spectune.backends.num_steps.confidence_config import ConfidenceConfig
from spectune.backends.prometheus import gauge_values, parse_metrics
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject, JsonValue
from spectune.loadgen.record import RequestRecord

#: SGLang's running-request cap with EAGLE when --max-running-requests is unset (server_args.py).
SGLANG_SPEC_MAX_RUNNING = 48
_ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_PROPOSED_KEYS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_HIST_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")


class InternalState(TypedDict, total=False):
    """One DP rank's entry of ``/server_info`` ``internal_states`` (the scheduler's ``get_internal_state``), the
    fields read here."""

    avg_spec_accept_length: float | None
    speculative_num_steps: int | None


class SpecServerArgs(TypedDict, total=False):
    """``/server_info`` ``spec``: the ``spec`` namespace of the resolved server arguments
    (``python/sglang/srt/arg_groups/fields/spec.py``), the field read here."""

    speculative_adaptive: bool


class ServerInfo(TypedDict, total=False):
    """A ``/server_info`` answer (the resolved server arguments, flat or under ``spec``, and the schedulers'
    ``internal_states``), the fields read here."""

    internal_states: list[InternalState]
    speculative_num_steps: int | None
    speculative_algorithm: str | None
    speculative_adaptive: bool
    spec: SpecServerArgs


class ServerInfoStats(TypedDict):
    """:func:`server_info_stats`: what the backend uses from a ``/server_info`` answer (None when missing)."""

    avg_spec_accept_length: float | None
    speculative_num_steps: int | None
    speculative_algorithm: str | None


def sglang_argv(
    model: str, steps: int, host: str, port: int, draft: str | None = None, algorithm: str | None = None,
    max_running_requests: int = SGLANG_SPEC_MAX_RUNNING, extra: Sequence[str] = (), python: str = sys.executable,
    adaptive_config: str | None = None,
) -> list[str]:
    """The ``sglang.launch_server`` command for num_steps ``steps`` (0 = no speculation); ``extra`` goes last.

    With ``adaptive_config`` (a file path) and ``steps`` > 0, adds ``--speculative-adaptive
    --speculative-adaptive-config FILE`` (SGLang ``server_args.py``); ``steps`` is then the initial tier.

    Raises:
        UserError: ``steps`` > 0 without a draft head, or ``steps`` < 0.
    """
    if steps < 0:
        raise UserError(f"num_steps must be >= 0, got {steps}")
    argv = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", str(port),
            "--max-running-requests", str(max_running_requests), "--enable-metrics"]
    if steps > 0:
        if not draft:
            raise UserError(f"num_steps {steps} needs a draft head: pass --draft PATH_OR_HF_ID")
        argv += ["--speculative-algorithm", engine_method("sglang", algorithm), "--speculative-draft-model-path", draft,
                 "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(steps + 1)]
        if adaptive_config:
            argv += ["--speculative-adaptive", "--speculative-adaptive-config", adaptive_config]
    return argv + list(extra)


def spec_details(server_stats: JsonObject | None) -> JsonObject | None:
    """SGLang's per-request spec counters from a record's ``server_stats``, wherever the client put them.

    Accepts the response's ``sglext`` object (``{"sglext": {"spec_tokens_details": {...}}}``), the details
    object itself (``{"spec_tokens_details": {...}}``, a list when n > 1: the first is used), a ``meta_info``
    dict, or the fields at top level. None when no ``spec_verify_ct`` is found.
    """
    if not isinstance(server_stats, dict):
        return None
    sglext = server_stats.get("sglext")
    from_sglext = sglext.get("spec_tokens_details") if isinstance(sglext, dict) else None
    for cand in (from_sglext, server_stats.get("spec_tokens_details"), server_stats.get("meta_info"), server_stats):
        if isinstance(cand, list):
            cand = cand[0] if cand else None
        if isinstance(cand, dict) and cand.get("spec_verify_ct") is not None:
            return cand
    return None


def _first(d: JsonObject, keys: Sequence[str]) -> JsonValue:
    return next((d[k] for k in keys if d.get(k) is not None), None)


def per_request_acceptance(records: Sequence[RequestRecord]) -> Acceptance | None:
    """Acceptance from SGLang's per-request spec details over successful records; None if none carry them.

    acceptance_length = 1 + sum(accepted drafts) / sum(spec_verify_ct) over requests with verify steps (bonus token
    included), or SGLang's sum(completion_tokens) / sum(spec_verify_ct) when a request lacks the accepted count
    (higher by requests / verify steps: the prefill token of each request is counted too);
    acceptance_rate = accepted / proposed drafts; per_position[i] = share of
    verify steps that accepted more than i drafts, from the summed ``spec_correct_drafts_histogram`` (entry j
    counts verify steps that accepted exactly j drafts).
    """
    ok = [r for r in records if r.ok]
    found = [(r, d) for r in ok if (d := spec_details(r.server_stats)) is not None]
    if not found:
        return None
    warning = None if len(found) == len(ok) else f"{len(ok) - len(found)} of {len(ok)} requests had no spec details"
    verify = completion = 0.0
    accepted: float | None = 0.0
    proposed: float | None = 0.0
    hist: list[float] | None = []
    for rec, d in found:
        ct = float(d["spec_verify_ct"])
        if ct <= 0:
            continue
        verify += ct
        tokens = rec.completion_tokens if rec.completion_tokens is not None else d.get("completion_tokens", 0)
        completion += float(tokens)
        acc, prop, h = _first(d, _ACCEPTED_KEYS), _first(d, _PROPOSED_KEYS), _first(d, _HIST_KEYS)
        accepted = None if acc is None or accepted is None else accepted + float(acc)
        proposed = None if prop is None or proposed is None else proposed + float(prop)
        if h is None or hist is None:
            hist = None
        else:
            hist += [0.0] * (len(h) - len(hist))
            for j, n in enumerate(h):
                hist[j] += float(n)
    source = "sglang:per-request"
    if verify <= 0:
        return Acceptance(1.0, None, [], 0.0, source, warning)
    rate = accepted / proposed if accepted is not None and proposed else None
    per_pos: list[float] = []
    if hist and sum(hist) > 0:
        per_pos = [sum(hist[i + 1:]) / sum(hist) for i in range(len(hist) - 1)]
    length = 1.0 + accepted / verify if accepted is not None else completion / verify
    return Acceptance(length, rate, per_pos, verify, source, warning)


def server_info_stats(info: ServerInfo) -> ServerInfoStats:
    """``avg_spec_accept_length`` (mean over DP ranks that report it) and ``speculative_num_steps`` from a
    ``/server_info`` answer; missing values are None."""
    states = info.get("internal_states") if isinstance(info, dict) else None
    states = [s for s in states if isinstance(s, dict)] if isinstance(states, list) else []
    avgs = [float(s["avg_spec_accept_length"]) for s in states if s.get("avg_spec_accept_length") is not None]
    steps = states[0].get("speculative_num_steps") if states else None
    if steps is None and isinstance(info, dict):
        steps = info.get("speculative_num_steps")
    return {"avg_spec_accept_length": sum(avgs) / len(avgs) if avgs else None, "speculative_num_steps": steps,
            "speculative_algorithm": info.get("speculative_algorithm") if isinstance(info, dict) else None}


def server_info_adaptive(info: ServerInfo) -> bool | None:
    """Whether a ``/server_info`` answer says the server runs ``--speculative-adaptive`` (its resolved server
    arguments, flat or under the ``spec`` namespace); None when the answer does not say."""
    if not isinstance(info, dict):
        return None
    value = info.get("speculative_adaptive")
    if value is None and isinstance(info.get("spec"), dict):
        value = info["spec"].get("speculative_adaptive")
    return None if value is None else bool(value)


ADAPTIVE_RATE_WARNING = ("no acceptance rate: SGLang charges every verify of an adaptive server the launch tier's "
                         "drafts (spec_verify_ct x (speculative_num_draft_tokens - 1)), whatever tier ran it")


SWITCH_LOG_LINE = "Adaptive spec params updated"
"""What SGLang logs on every tier change (python/sglang/srt/speculative/adaptive_spec_params.py,
``_apply_target_steps``)."""

class SGLangBackend(LaunchingBackend):
    """SGLang servers with static EAGLE/EAGLE3 settings per num_steps (see module docstring).

    Raises (constructor):
        UserError: no ``model`` and no ``endpoints``, a malformed endpoint URL, or an ``adaptive_config`` that is
            not a valid SGLang adaptive config.
    """

    name = "sglang"
    health_paths = ("/health",)
    running_gauges = ("sglang:num_running_reqs",)
    method_key = "algorithm"  # --speculative-algorithm (EAGLE/EAGLE3), as describe() records it

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        if self.remote is None and not options.model:
            raise UserError("the sglang backend needs --model (to launch servers) or --endpoint URLs of running ones")
        self._algorithm: tuple[str, str] | None = None
        self.adaptive_config: str | None = None
        self.candidate_union: tuple[int, ...] = ()
        self.remote_adaptive: bool | None = None  # what a running server's /server_info said, when read
        if options.adaptive_config:
            config = load_config_file(options.adaptive_config)
            if isinstance(config, ConfidenceConfig):
                raise UserError(f"{options.adaptive_config} is a {config.strategy} config (draft length per row): "
                                "SGLang has no such strategy; run it on the bundled engine (--backend local), or "
                                "give an SGLang adaptive config")
            if not isinstance(config, AdaptiveConfig):
                raise UserError(f"{options.adaptive_config} is a vLLM schedule: the sglang backend needs an SGLang "
                                "adaptive config (batch-size slots with candidate_steps)")
            self.adaptive_config = str(Path(options.adaptive_config).resolve())
            self.candidate_union = config.candidate_steps

    def algorithm(self) -> tuple[str, str]:
        """(``EAGLE``|``EAGLE3``|given name, how it was decided): ``options.algorithm`` or the head's config
        (:func:`spectune.backends.methods.launch_method`)."""
        if self._algorithm is None:
            self._algorithm = launch_method("sglang", self.options.algorithm, self.options.draft)
        return self._algorithm

    def check_executable(self) -> None:
        if importlib.util.find_spec("sglang") is None:
            raise UserError(f"sglang not found in {sys.executable}: pip install sglang (or use --backend launch)")

    def schedule_server(self) -> ScheduleServer | None:
        """SGLang's schedule server: ``--speculative-adaptive`` with the config's candidates; its EAGLE worker runs a
        draft extend every round at its lowest step (``python/sglang/srt/speculative/eagle_worker_v2.py``), so it
        can cost more than the static server. Pinned: one slot ``{"1": {"candidate_steps": [K]}}`` launched at
        num_steps K (the initial tier must be a candidate, ``adaptive_spec_params.py``
        ``_init_adaptive_speculative_params``). None for running endpoints."""
        if self.remote is not None:
            return None
        return ScheduleServer("sglang", "--speculative-adaptive with one slot {\"1\": {\"candidate_steps\": [K]}} at "
                              "--speculative-num-steps K", "python/sglang/srt/speculative/adaptive_spec_params.py",
                              costs_more=True)

    def schedule_steps(self, steps: Sequence[int]) -> tuple[list[int], list[str]]:
        """Every K > 0: SGLang launches an adaptive server at an initial tier that must be one of its candidates,
        and ``--speculative-num-steps 0`` is no speculative server, so K=0 cannot be pinned (one warning)."""
        kept, warnings = super().schedule_steps([k for k in steps if k > 0])
        if 0 in steps and self.schedule_server() is not None:
            warnings.append("sglang: an adaptive server cannot be pinned to num_steps 0 (its initial tier must be a "
                            "candidate > 0): the schedule server's K=0 is not measured, a K=0 slot is priced at the "
                            "static K=0 server")
        return kept, warnings

    def pinned_config(self, steps: int, max_k: int) -> JsonObject:
        """SGLang's adaptive config with one slot and one candidate: ``{"1": {"candidate_steps": [steps]}}``."""
        return {"1": {"candidate_steps": [steps]}}

    def build_argv(self, steps: int, host: str, port: int) -> list[str]:
        """:func:`sglang_argv` from the options (a schedule server gets its pinned adaptive config)."""
        running = max(self.options.max_concurrency, SGLANG_SPEC_MAX_RUNNING)
        adaptive = (self.pinned_config_path(steps) if steps > 0 else None) or self.adaptive_config
        return sglang_argv(self.options.model or "", steps, host, port, self.options.draft, self.algorithm()[0],
                           running, self.options.server_args, adaptive_config=adaptive)

    def request_extra(self) -> JsonObject:
        """Ask SGLang for per-request spec details (``sglext.spec_tokens_details`` in the response)."""
        return {"return_spec_tokens_details": True}

    async def _server_info(self, url: str) -> ServerInfo | None:
        for path in ("/server_info", "/get_server_info"):
            reply = await get(url + path, 10.0, self.headers)
            if reply.status == 200 and isinstance(reply.json(), dict):
                return reply.json()
        return None

    @property
    def adaptive(self) -> bool:
        """True when the server runs SGLang's adaptive num_steps: launched with ``adaptive_config``, or a running
        server whose ``/server_info`` said so."""
        return self.adaptive_config is not None or bool(self.remote_adaptive)

    async def preflight(self, steps_list: Sequence[int]) -> list[str]:
        """:meth:`LaunchingBackend.preflight`, plus a warning when an adaptive config is launched with attention
        DP (SGLang then falls back to static settings: ``adaptive_unsupported_reason``)."""
        warnings = await super().preflight(steps_list)
        if self.adaptive_config and self.remote is None and "--enable-dp-attention" in self.options.server_args:
            warnings.append("SGLang disables --speculative-adaptive with --enable-dp-attention (static settings "
                            f"instead): this server runs num_steps {max(steps_list, default=0)}, not the config")
        return warnings

    async def remote_checks(self, steps_list: Sequence[int]) -> list[str]:
        """Warn when a running server's speculative settings differ from what it is used for.

        Static use (no ``adaptive_config``): num_steps 0 must not speculate; K > 0 must report
        ``speculative_num_steps`` K and not run ``--speculative-adaptive`` (its tier would follow the load). With
        an adaptive config: the server must run ``--speculative-adaptive`` and its live tier must be one of the
        config's candidates (the live tier changes with load, so it is never compared with K).
        """
        warnings = []
        for k in steps_list:
            if self.remote is None or k not in self.remote.urls:
                continue
            url = self.remote.urls[k]
            info = await self._server_info(url) or {}
            stats, adaptive = server_info_stats(info), server_info_adaptive(info)
            if adaptive is not None:
                self.remote_adaptive = adaptive
            algo, steps = stats["speculative_algorithm"], stats["speculative_num_steps"]
            if k == 0 and algo not in (None, "", "NONE"):
                warnings.append(f"{url} (num_steps 0) runs speculative decoding ({algo})")
            elif k > 0 and self.adaptive_config is not None:
                if adaptive is False:
                    warnings.append(f"{url} does not run --speculative-adaptive: it serves static speculative "
                                    f"settings (num_steps {steps}), not the adaptive config")
                elif steps is not None and int(steps) not in self.candidate_union:
                    warnings.append(f"{url} reports speculative_num_steps {steps}, not one of the config's "
                                    f"candidate steps {list(self.candidate_union)}")
            elif k > 0 and adaptive:
                warnings.append(f"{url} (num_steps {k}) runs --speculative-adaptive: its num_steps follows the "
                                f"load (now {steps}), not a static {k}")
            elif k > 0 and steps is not None and int(steps) != k:
                warnings.append(f"{url} (num_steps {k}) reports speculative_num_steps {steps}")
        return warnings

    async def switches(self) -> tuple[float, str] | None:
        """The switches counter when the server has one (:meth:`LaunchingBackend.switches`), else the
        :data:`SWITCH_LOG_LINE` lines in the log of the server spectune launched (SGLang has no such metric)."""
        found = await super().switches()
        if found is not None:
            return found
        if self.server is not None and Path(self.server.log_path).is_file():
            text = Path(self.server.log_path).read_text(encoding="utf-8", errors="replace")
            return float(text.count(SWITCH_LOG_LINE)), "sglang:server log"
        return None

    async def snapshot(self) -> SpecSnapshot | None:
        """``/server_info`` average accept length and the ``sglang:spec_accept_length`` gauge, now."""
        url = self.base_url
        if url is None:
            return None
        taken_at = time.perf_counter()
        info = await self._server_info(url) or {}
        stats = server_info_stats(info)
        raw: dict[str, JsonValue] = {"speculative_num_steps": stats["speculative_num_steps"],
                                     "speculative_adaptive": server_info_adaptive(info)}
        reply = await get(url + "/metrics", 5.0, self.headers)
        if reply.status == 200:
            try:
                gauge = gauge_values(parse_metrics(reply.text), "sglang:spec_accept_length")
            except ValueError:
                gauge = []
            raw["spec_accept_length_gauge"] = sum(gauge) / len(gauge) if gauge else None
        return SpecSnapshot(taken_at=taken_at, avg_accept_length=stats["avg_spec_accept_length"], raw=raw)

    def acceptance(
        self, before: SpecSnapshot | None, after: SpecSnapshot | None, records: Sequence[RequestRecord]
    ) -> Acceptance:
        """Per-request details (no acceptance rate on an adaptive server: :data:`ADAPTIVE_RATE_WARNING`); else 1.0
        at num_steps 0; else /server_info (scoped only on a fresh server); else the gauge; else the proxy."""
        fresh = self.next_window()
        if after is not None and after.raw.get("speculative_adaptive") is not None:
            self.remote_adaptive = bool(after.raw["speculative_adaptive"])
        per_request = per_request_acceptance(records)
        if per_request is not None:
            if self.adaptive and per_request.acceptance_rate is not None:
                per_request.acceptance_rate = None
                per_request.warning = "; ".join(w for w in (per_request.warning, ADAPTIVE_RATE_WARNING) if w)
            return per_request
        if self.steps == 0:
            return zero_steps_acceptance(records)
        if after is not None and after.avg_accept_length is not None:
            if fresh:
                source = "sglang:/server_info (server launched for this point)"
                return Acceptance(after.avg_accept_length, source=source,
                                  warning="server-lifetime average: includes this point's warm-up requests")
            return Acceptance(after.avg_accept_length, source="sglang:/server_info lifetime average",
                              warning="server-lifetime average, not scoped to the measurement window")
        gauge = after.raw.get("spec_accept_length_gauge") if after is not None else None
        if gauge is not None:
            return Acceptance(gauge, source="sglang:spec_accept_length gauge",
                              warning="gauge over the last logged batches, not scoped to the measurement window")
        return chunk_proxy_acceptance(records, warning="sglang: no spec details, /server_info or metrics; proxy used")

    def speculative_method(self) -> str | None:
        """The ``--speculative-algorithm`` launched, in lower case."""
        return self.algorithm()[0].lower()

    def describe(self) -> JsonObject:
        """Base description plus the speculative algorithm and how it was chosen."""
        d = super().describe()
        if self.remote is None:
            d["algorithm"], d["algorithm_source"] = self.algorithm()
        return d
