"""What ``spectune sweep`` and ``spectune validate`` both ask of their requests, written once: the prompts and request
settings both plans carry (:class:`LoadSpec`, the base of both plans), the load generator's time limits
(:class:`ClientTimeouts`) and the checks of the request settings both plans carry (:func:`steps_check`,
:func:`request_checks`, :func:`failure_rate_check`: each an ``(ok, message)`` pair, the message the ``UserError``
a plan raises for the first one that fails)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Sequence

from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject

__all__ = ["LoadSpec", "ClientTimeouts", "steps_check", "request_checks", "failure_rate_check"]


@dataclass(frozen=True, kw_only=True)
class LoadSpec:
    """The prompts and the request settings of a plan, declared once for ``spectune sweep``
    (:class:`spectune.sweep.plan.SweepPlan`) and ``spectune validate`` (:class:`spectune.validate.plan.ValidatePlan`),
    which both extend it (keyword-only fields: a plan's own positional fields come first).

    Attributes:
        dataset, num_prompts, seed: the prompt sample (:func:`spectune.loadgen.load_dataset`; ``num_prompts`` >= 1).
        max_tokens: output tokens per request (>= 1). temperature: sampling temperature (>= 0). ignore_eos: ask for
            ``max_tokens`` every time. api: ``chat`` or ``completions``.
        slo_ttft_ms, slo_tpot_ms: SLOs in ms (> 0) for slo_attainment/goodput, or None.
        warmup_requests: unrecorded requests before each point or run (>= 0); None = the plan's default.
    """

    dataset: str = "mt-bench"
    num_prompts: int = 80
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    ignore_eos: bool = False
    api: str = "chat"
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    warmup_requests: int | None = None

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The load fields' names, in the order a plan's JSON object writes them (after the plan's leading keys)."""
        return tuple(f.name for f in fields(LoadSpec))

    def load_checks(self) -> list[tuple[bool, str]]:
        """:func:`request_checks` of these settings: ``(ok, message)`` pairs, in the order a plan checks them."""
        return request_checks(num_prompts=self.num_prompts, max_tokens=self.max_tokens, temperature=self.temperature,
                              api=self.api, slo_ttft_ms=self.slo_ttft_ms, slo_tpot_ms=self.slo_tpot_ms,
                              warmup_requests=self.warmup_requests)

    def plan_json(self, head: Sequence[str], values: JsonObject) -> JsonObject:
        """A plan's JSON object in file order: the keys ``head`` (the plan's own leading fields), then the load fields
        (:meth:`keys`), then every other key of ``values`` in its order. ``values``: the plan's fields as JSON values
        (e.g. :func:`dataclasses.asdict` with lists for tuples).

        Raises:
            KeyError: ``values`` lacks a key of ``head`` or a load field.
        """
        load = self.keys()
        out = {k: values[k] for k in head}
        out.update((k, values[k]) for k in load)
        out.update((k, v) for k, v in values.items() if k not in out)
        return out


@dataclass(frozen=True)
class ClientTimeouts:
    """Time limits of the load generator (``--request-timeout``, ``--warmup-timeout``), shared by ``spectune sweep``
    and ``spectune validate``. Not part of the sweep plan (they bound how long a broken server is waited for, not
    what is measured), so changing them does not stop ``--resume``; sweep.json records them as ``client``.

    Attributes:
        request_timeout_s: s; one request (connect + whole stream) fails after this long.
        warmup_timeout_s: s; the warm-up before a point (or run) must finish within this long, else the point fails
            at once (a server that answers /health but never streams costs this much per point, not the whole
            request budget).
    """

    request_timeout_s: float = 600.0
    warmup_timeout_s: float = 300.0

    def validate(self) -> None:
        """Raises UserError when a limit is not a positive number of seconds."""
        for flag, value in (("--request-timeout", self.request_timeout_s), ("--warmup-timeout", self.warmup_timeout_s)):
            if not (value > 0 and math.isfinite(value)):
                raise UserError(f"{flag} must be a positive number of seconds, got {value}")

    def to_json(self) -> dict[str, float]:
        """``{"request_timeout_s", "warmup_timeout_s"}``."""
        return asdict(self)



def steps_check(steps: Sequence[int]) -> tuple[bool, str]:
    """num_steps values are given and none is negative."""
    return bool(steps) and min(steps) >= 0, "--steps needs num_steps values >= 0, e.g. 0,1,2,3,5"


def request_checks(*, num_prompts: int, max_tokens: int, temperature: float, api: str, slo_ttft_ms: float | None,
                   slo_tpot_ms: float | None, warmup_requests: int | None) -> list[tuple[bool, str]]:
    """The prompt sample, the requests' settings, the SLOs and the warm-up, in the order a plan checks them."""
    return [
        (num_prompts >= 1, f"--num-prompts must be >= 1, got {num_prompts}"),
        (max_tokens >= 1, f"--max-tokens must be >= 1, got {max_tokens}"),
        (temperature >= 0, f"--temperature must be >= 0, got {temperature}"),
        (api in ("chat", "completions"), f"--api must be chat or completions, got {api!r}"),
        (slo_ttft_ms is None or slo_ttft_ms > 0, f"--slo-ttft-ms must be > 0, got {slo_ttft_ms}"),
        (slo_tpot_ms is None or slo_tpot_ms > 0, f"--slo-tpot-ms must be > 0, got {slo_tpot_ms}"),
        (warmup_requests is None or warmup_requests >= 0, f"--warmup must be >= 0, got {warmup_requests}"),
    ]


def failure_rate_check(max_failure_rate: float) -> tuple[bool, str]:
    """The failure rate that stops a point or run early is a fraction."""
    return 0.0 <= max_failure_rate <= 1.0, f"--max-failure-rate must be in 0..1, got {max_failure_rate}"
