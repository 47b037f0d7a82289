"""Offline replay of a verify-step trace through a num_steps policy (``spectune simulate``).

Each recorded verify step (batch size, accepted drafts per request, recorded num_steps) is routed to the policy:
the simulated tier k is ``policy.steps_for_batch(batch_size)``, the accepted drafts fed back are the recorded ones
clipped to k (``min(a, k)``), then ``policy.on_verify`` may switch tiers.

Approximation: acceptance is taken from the recorded run. Clipping is exact for greedy chain drafting when the
simulated tier is at or below the recorded one (the first k drafts are the same). When the simulated tier is above
the recorded num_steps, the recorded count is used as is: a lower bound, since the drafts past the recorded ones
were never verified. :attr:`SimulationResult.steps_above_recorded` counts such steps.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from spectune.backends.num_steps.sglang_config import AdaptiveConfig, VllmSchedule
from spectune.backends.num_steps.ema_policy import AdaptivePolicy, make_policy
from spectune.backends.num_steps.throughput_policy import CostTable, ThroughputAwareConfig
from spectune.backends.num_steps.trace import TraceStep
from spectune.core.errors import UserError


@dataclass(frozen=True)
class Segment:
    """A run of consecutive verify steps with the same slot and num_steps.

    Attributes:
        start: first verify step (0-based index into the trace).
        end: last verify step, inclusive.
        slot: SGLang slot lower bound ("8") or vLLM range ("9-32") the steps routed to.
        num_steps: the simulated tier.
        ema: the slot's EMA of accepted drafts when the segment started (after the switching decision); None for
            vLLM schedules.
        cause: why it started: "start", "switch" (the policy changed the tier) or "batch size" (another slot/range).
    """

    start: int
    end: int
    slot: str
    num_steps: int
    ema: float | None
    cause: str


@dataclass(frozen=True)
class Switch:
    """One tier change decided by the policy at verify step ``step`` (effective from the slot's next step)."""

    step: int
    slot: str
    from_steps: int
    to_steps: int
    ema: float | None


@dataclass
class SimulationResult:
    """What a replay produced.

    Attributes:
        kind: "sglang" (EMA policy), "sglang-throughput" (throughput-aware strategy) or "vllm" (static schedule).
        num_verify_steps: trace length.
        segments: the tier timeline.
        switches: every tier change the policy decided.
        switch_count: ``len(switches)``.
        steps_per_tier: num_steps -> verify steps simulated at it.
        steps_clipped: verify steps whose recorded accepted drafts exceeded the simulated tier.
        steps_above_recorded: verify steps simulated above the recorded num_steps (acceptance is a lower bound).
        acceptance_length: simulated mean acceptance length per request per verify step (accepted drafts + 1).
        recorded_acceptance_length: the same from the trace as recorded.
        final_slots: the policy's slots at the end (lower_bound, current_steps, ema, batches, switches).
    """

    kind: str
    num_verify_steps: int
    segments: list[Segment] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)
    steps_per_tier: dict[int, int] = field(default_factory=dict)
    steps_clipped: int = 0
    steps_above_recorded: int = 0
    acceptance_length: float = 0.0
    recorded_acceptance_length: float = 0.0
    final_slots: list[dict] = field(default_factory=list)

    @property
    def switch_count(self) -> int:
        return len(self.switches)

    def to_json(self) -> dict:
        """A JSON-ready dict (``--json`` output)."""
        out = asdict(self)
        out["switch_count"] = self.switch_count
        out["steps_per_tier"] = {str(k): v for k, v in sorted(self.steps_per_tier.items())}
        return out


def simulate(config: AdaptiveConfig | VllmSchedule | ThroughputAwareConfig, trace: Sequence[TraceStep], *,
             initial_steps: int | None = None, cuda_graph_bs: Sequence[int] | None = None,
             cost_table: CostTable | None = None) -> SimulationResult:
    """Replay ``trace`` through the policy ``config`` describes (see the module docstring for the approximation).

    Args:
        config: an SGLang adaptive config (EMA policy) or a vLLM schedule (static per batch size).
        trace: recorded verify steps, in order.
        initial_steps: SGLang only: the server's ``--speculative-num-steps``. None: as SGLang without the flag, the
            middle of the union of all slots' candidates (:attr:`AdaptiveConfig.server_initial_steps`); a slot
            starts there when it is one of its candidates, else at its own middle candidate.
        cuda_graph_bs: SGLang only: captured CUDA-graph batch sizes to pad to before routing.
        cost_table: SGLang throughput-aware only: decode-round times (ms) per (batch size, num_steps), standing in
            for SGLang's start-up profile (:mod:`spectune.backends.num_steps.throughput_policy`).
    """
    policy = make_policy(config, initial_steps=initial_steps, cuda_graph_bs=cuda_graph_bs, cost_table=cost_table)
    if isinstance(config, ThroughputAwareConfig):
        kind = "sglang-throughput"

        def slot_of(bs: int) -> tuple[str, float | None]:
            return str(policy.slot_for_batch(bs)), None  # type: ignore[union-attr]
    elif isinstance(config, VllmSchedule):
        kind = "vllm"

        def slot_of(bs: int) -> tuple[str, float | None]:
            r = config.ranges[config.range_index(bs)]
            return f"{r.start}-{r.end}", None
    else:
        kind = "sglang"

        def slot_of(bs: int) -> tuple[str, float | None]:
            st = policy.slot_state(bs)  # type: ignore[union-attr]
            return str(st.lower_bound), st.ema

    res = SimulationResult(kind=kind, num_verify_steps=len(trace))
    tiers: Counter[int] = Counter()
    sim_sum = rec_sum = n_req = 0
    cur: dict | None = None
    for i, step in enumerate(trace):
        before, prev = policy.switch_count, getattr(policy, "current_steps", None)
        k = policy.steps_for_batch(step.batch_size)
        slot, ema = slot_of(step.batch_size)
        if policy.switch_count > before:  # the throughput-aware strategy decides before the round
            res.switches.append(Switch(i, slot, prev, k, None))  # type: ignore[arg-type]
        if cur is None or (cur["slot"], cur["num_steps"]) != (slot, k):
            if cur is not None:
                res.segments.append(Segment(**cur))
            cause = "start" if cur is None else ("switch" if cur["slot"] == slot else "batch size")
            cur = {"start": i, "end": i, "slot": slot, "num_steps": k, "ema": ema, "cause": cause}
        cur["end"] = i
        accepted = [min(a, k) for a in step.accepted_drafts]
        tiers[k] += 1
        res.steps_clipped += accepted != list(step.accepted_drafts)
        res.steps_above_recorded += k > step.num_steps
        sim_sum += sum(accepted)
        rec_sum += sum(step.accepted_drafts)
        n_req += len(accepted)
        new = policy.on_verify(accepted, step.batch_size)
        if new is not None:
            res.switches.append(Switch(i, slot, k, new, slot_of(step.batch_size)[1]))
    if cur is not None:
        res.segments.append(Segment(**cur))
    res.steps_per_tier = dict(tiers)
    res.acceptance_length = 1 + sim_sum / n_req if n_req else 0.0
    res.recorded_acceptance_length = 1 + rec_sum / n_req if n_req else 0.0
    if isinstance(policy, AdaptivePolicy):
        res.final_slots = [asdict(s) for s in policy.slot_states()]
    return res


def write_result_json(result: SimulationResult, path: str | Path) -> None:
    """Write ``result.to_json()`` to ``path``. Raises UserError when it cannot be written."""
    try:
        Path(path).write_text(json.dumps(result.to_json(), indent=2) + "\n")
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror or err}; check the folder exists") from None
