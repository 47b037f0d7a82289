"""The ``vllm`` backend: launches ``vllm serve`` per num_steps, or uses running vLLM servers.

For K > 0 the command carries ``--speculative-config '{"method": "eagle"|"eagle3", "model": HEAD,
"num_speculative_tokens": K}'`` (one argv element of JSON, background §3); K = 0 has none. ``--max-num-seqs``
is max(highest swept concurrency, 256) (vLLM's usual default is 256), the same for every K. With
``options.adaptive_config`` (a vLLM schedule file: ``{"num_speculative_tokens": K,
"num_speculative_tokens_per_batch_size": [...]}`` or the bare list, checked when the backend is built) the K > 0
speculative config also carries ``num_speculative_tokens_per_batch_size``, and ``num_speculative_tokens`` is raised
to the schedule's maximum.

Acceptance comes from the V1 spec-decode counters on ``/metrics`` (``vllm/v1/spec_decode/metrics.py``), as
deltas over the window: acceptance length = 1 + d(accepted) / d(drafts), rate = d(accepted) / d(draft tokens),
per position = d(accepted_per_pos[i]) / d(drafts), summed over engines (:mod:`backends.prometheus`). A counter
that went down or a new process start time (server restart) is handled by
:func:`backends.base.counter_acceptance` (after-values used, with a warning); without counters: 1.0 at num_steps 0,
else the tokens-per-chunk proxy (:meth:`backends.launch.LaunchingBackend.acceptance`).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from backends.base import BackendOptions, SpecSnapshot
from backends.launch import LaunchingBackend, eagle_version
from backends.prometheus import scrape_snapshot
from loadgen.errors import UserError

VLLM_DEFAULT_MAX_NUM_SEQS = 256


def vllm_argv(
    model: str, steps: int, host: str, port: int, draft: str | None = None, method: str = "eagle",
    max_num_seqs: int = VLLM_DEFAULT_MAX_NUM_SEQS, extra: Sequence[str] = (), executable: str = "vllm",
    schedule: Sequence[Sequence[int]] | None = None, schedule_max_k: int | None = None,
) -> list[str]:
    """The ``vllm serve`` command for num_steps ``steps`` (0 = no speculation); ``extra`` goes last.

    With ``schedule`` (``[[range_start, range_end, K], ...]``) and ``steps`` > 0 the speculative config gets
    ``num_speculative_tokens_per_batch_size`` and ``num_speculative_tokens`` = max(steps, ``schedule_max_k``, the
    schedule's largest K): vLLM sizes its buffers by that maximum (background §3).

    Raises:
        UserError: ``steps`` > 0 without a draft head, or ``steps`` < 0.
    """
    if steps < 0:
        raise UserError(f"num_steps must be >= 0, got {steps}")
    argv = [executable, "serve", model, "--host", host, "--port", str(port), "--max-num-seqs", str(max_num_seqs)]
    if steps > 0:
        if not draft:
            raise UserError(f"num_steps {steps} needs a draft head: pass --draft PATH_OR_HF_ID")
        spec: dict[str, Any] = {"method": method, "model": draft, "num_speculative_tokens": steps}
        if schedule:
            top = max([steps, schedule_max_k or 0, *(int(r[2]) for r in schedule)])
            spec.update(num_speculative_tokens=top, num_speculative_tokens_per_batch_size=[list(r) for r in schedule])
        argv += ["--speculative-config", json.dumps(spec)]
    return argv + list(extra)


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

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        if self.remote is None and not options.model:
            raise UserError("the vllm backend needs --model (to launch servers) or --endpoint URLs of running ones")
        self._method: tuple[str, str] | None = None
        self._exe: str | None = None
        self.schedule = None
        if options.adaptive_config:
            from backends.adaptive import VllmSchedule, load_config_file

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

    def build_argv(self, steps: int, host: str, port: int) -> list[str]:
        """:func:`vllm_argv` from the options."""
        seqs = max(self.options.max_concurrency, VLLM_DEFAULT_MAX_NUM_SEQS)
        schedule = self.schedule.to_json() if self.schedule is not None else None
        max_k = self.schedule.max_k if self.schedule is not None else None
        return vllm_argv(self.options.model or "", steps, host, port, self.options.draft, self.method()[0], seqs,
                         self.options.server_args, self._exe or "vllm", schedule, max_k)

    async def remote_checks(self, steps_list: Sequence[int]) -> list[str]:
        """Warn when a running server used for K > 0 has no /metrics page or no spec-decode counters."""
        warnings = []
        urls = sorted({self.remote.url_for(k) for k in steps_list if k > 0}) if self.remote else []
        for url in urls:
            snap = await scrape_snapshot(url, ("vllm:",), self.headers)
            if snap is None:
                warnings.append(f"{url} exposes no /metrics: acceptance falls back to tokens per chunk")
            elif snap.num_drafts is None:
                warnings.append(f"{url} has no vllm:spec_decode counters (speculation off?): proxy acceptance")
        return warnings

    async def snapshot(self) -> SpecSnapshot | None:
        """The ``vllm:spec_decode_*`` counters now, or None without a /metrics page."""
        url = self.base_url
        return None if url is None else await scrape_snapshot(url, ("vllm:",), self.headers)

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
        """Base description plus the speculative method and how it was chosen."""
        d = super().describe()
        if self.remote is None:
            d["method"], d["method_source"] = self.method()
        return d
