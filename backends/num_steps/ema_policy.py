"""SGLang's adaptive num_steps policy (EMA strategy), restated; pure Python and cheap enough to call every step.

Source: ``python/sglang/srt/speculative/adaptive_spec_params.py`` (``AdaptiveStepSlot``,
``AdaptiveSpeculativeParams``) and ``adaptive_step_router.py`` (``AdaptiveStepRouter``). Per batch-size slot:

- Start at the server's initial num_steps if it is a candidate, else at ``candidates[len // 2]``; EMA starts at
  ``current_steps - 1``. The server's initial num_steps is ``--speculative-num-steps``, or, when that is not
  given, the middle of the sorted union of all slots' candidates (``arg_groups/speculative_hook.py``,
  ``_init_adaptive_speculative_params``; :attr:`AdaptiveConfig.server_initial_steps`).
- After each verify batch routed to the slot (an empty batch is ignored): if current steps > 0,
  ``EMA = (1 - alpha) * EMA + alpha * mean(accepted drafts per request)`` (the bonus token is not counted). The
  batch counter always advances. No decision while ``count <= warmup_batches``; then one decision whenever
  ``(count - warmup_batches) % update_interval == 0``.
- Decision at step 0: move to the next candidate up (a probe); if that is > 0 and the EMA is negative (a slot that
  started at 0), reset the EMA to ``target - 1``.
- Decision otherwise: step down to the next lower candidate p while ``EMA <= (p - 0.5) + down_hysteresis`` (base 0.5
  instead of -0.5 when p is 0), possibly several tiers. Only if it did not step down: step up from s while
  ``EMA > (s - 0.5) + up_hysteresis``. Then, if ``ceiling_coeff > 0`` and the target is above
  ``max(1, ceil(EMA * ceiling_coeff))`` but not above the old step, move down through the candidates until at or
  below that ceiling (or at the lowest candidate).
- Routing: pad the batch size up to the smallest captured CUDA-graph size >= it (unchanged when none is, or when no
  graph sizes are given), then take the largest slot lower bound <= it; a batch size below every bound goes to the
  smallest slot.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from spectune.backends.num_steps.sglang_config import AdaptiveConfig, SlotConfig, VllmSchedule
from spectune.backends.num_steps.throughput_policy import (ConfiguredSteps, CostTable, ThroughputAwareConfig,
                                                          ThroughputAwarePolicy)
from spectune.backends.num_steps.vllm_schedule import SchedulePolicy


class NumStepsPolicy(Protocol):
    """What an engine needs from a per-batch-size num_steps controller (AdaptivePolicy, SchedulePolicy)."""

    switch_count: int

    @property
    def candidate_steps(self) -> tuple[int, ...]: ...

    def steps_for_batch(self, batch_size: int) -> int: ...

    def on_verify(self, accepted_drafts_per_req: Sequence[int], batch_size: int) -> int | None: ...


@dataclass(frozen=True)
class SlotState:
    """A snapshot of one slot for introspection.

    Attributes:
        lower_bound: the slot's smallest batch size.
        current_steps: num_steps the slot selects now.
        ema: EMA of mean accepted drafts per request (bonus token excluded).
        batches: verify batches routed to the slot so far.
        switches: decisions that changed current_steps.
    """

    lower_bound: int
    current_steps: int
    ema: float
    batches: int
    switches: int


class _Slot:
    """Mutable EMA state of one slot (``AdaptiveStepSlot`` in SGLang)."""

    __slots__ = ("cfg", "steps", "idx", "ema", "batches", "switches")

    def __init__(self, cfg: SlotConfig, initial_steps: int | None) -> None:
        self.cfg = cfg
        self.steps = cfg.candidate_steps
        self.idx = self.steps.index(initial_steps) if initial_steps in self.steps else len(self.steps) // 2
        self.ema = float(self.steps[self.idx] - 1)
        self.batches = 0
        self.switches = 0

    def update(self, accepted: Sequence[int]) -> bool:
        """Fold one verify batch in; True when a decision changed the step."""
        if not accepted:
            return False
        cfg = self.cfg
        if self.steps[self.idx] > 0:
            self.ema = (1.0 - cfg.ema_alpha) * self.ema + cfg.ema_alpha * (sum(accepted) / len(accepted))
        self.batches += 1
        n = self.batches - cfg.warmup_batches
        if n <= 0 or n % cfg.update_interval:
            return False
        new = self._decide()
        if new == self.idx:
            return False
        self.idx = new
        self.switches += 1
        return True

    def _decide(self) -> int:
        steps, cfg, old = self.steps, self.cfg, self.idx
        if steps[old] == 0:  # probe upwards after a no-speculation interval
            idx = min(old + 1, len(steps) - 1)
            if steps[idx] > 0 and self.ema < 0:
                self.ema = float(steps[idx] - 1)
            return idx
        idx = old
        while idx > 0:
            lower = steps[idx - 1]
            if self.ema <= (0.5 if lower == 0 else lower - 0.5) + cfg.down_hysteresis:
                idx -= 1
            else:
                break
        if idx == old:
            while idx < len(steps) - 1 and self.ema > steps[idx] - 0.5 + cfg.up_hysteresis:
                idx += 1
        if cfg.ceiling_coeff > 0:
            ceiling = max(1, math.ceil(self.ema * cfg.ceiling_coeff))
            if ceiling < steps[idx] <= steps[old]:
                while idx > 0 and steps[idx] > ceiling:
                    idx -= 1
        return idx


class AdaptivePolicy(ConfiguredSteps):
    """SGLang's EMA policy over all slots of an :class:`AdaptiveConfig`.

    Engine use, every decode round: ``k = policy.steps_for_batch(bs)`` before drafting, run the round with k draft
    steps, then ``policy.on_verify(accepted_drafts_per_req, bs)`` with each request's accepted draft count
    (0..k, bonus token excluded). Both are O(1) dict/list work plus a sum over the batch.

    Args:
        config: validated slots.
        initial_steps: the server's configured num_steps (``--speculative-num-steps``); a slot starts there when it
            is one of its candidates, else at its middle candidate. None: what SGLang sets when the flag is not
            given, :attr:`AdaptiveConfig.server_initial_steps` (the middle of the union of every slot's candidates).
        cuda_graph_bs: captured CUDA-graph batch sizes to pad to before routing, or None (no padding).
    """

    def __init__(self, config: AdaptiveConfig, *, initial_steps: int | None = None,
                 cuda_graph_bs: Sequence[int] | None = None) -> None:
        self.config = config
        if initial_steps is None:
            initial_steps = config.server_initial_steps
        self.initial_steps = initial_steps
        self._slots = [_Slot(s, initial_steps) for s in config.slots]
        self._bounds = [s.lower_bound for s in config.slots]
        self._graph_bs = sorted(set(cuda_graph_bs)) if cuda_graph_bs else None
        self._route_cache: dict[int, _Slot] = {}

    @property
    def switch_count(self) -> int:
        """Decisions, over all slots, that changed a slot's num_steps."""
        return sum(s.switches for s in self._slots)

    def padded_batch_size(self, batch_size: int) -> int:
        """``batch_size`` padded up to the smallest CUDA-graph size >= it (unchanged without graphs or above them)."""
        if self._graph_bs is not None:
            i = bisect.bisect_left(self._graph_bs, batch_size)
            if i < len(self._graph_bs):
                return self._graph_bs[i]
        return batch_size

    def _route(self, batch_size: int) -> _Slot:
        slot = self._route_cache.get(batch_size)
        if slot is None:
            i = bisect.bisect_right(self._bounds, self.padded_batch_size(batch_size)) - 1
            slot = self._route_cache[batch_size] = self._slots[max(0, i)]
        return slot

    def slot_for_batch(self, batch_size: int) -> int:
        """Lower bound of the slot that ``batch_size`` (requests) routes to."""
        return self._route(batch_size).cfg.lower_bound

    def steps_for_batch(self, batch_size: int) -> int:
        """num_steps for a decode round of ``batch_size`` requests."""
        slot = self._route(batch_size)
        return slot.steps[slot.idx]

    def on_verify(self, accepted_drafts_per_req: Sequence[int], batch_size: int) -> int | None:
        """Feed one verify batch to the slot ``batch_size`` routes to.

        Args:
            accepted_drafts_per_req: accepted draft tokens per request (bonus token excluded), one per request;
                only their mean is used, so floats (pre-averaged values) work too.
            batch_size: requests in the verified batch (normally ``len(accepted_drafts_per_req)``).

        Returns:
            the slot's new num_steps when this batch triggered a switch, else None.
        """
        slot = self._route(batch_size)
        return slot.steps[slot.idx] if slot.update(accepted_drafts_per_req) else None

    def slot_states(self) -> list[SlotState]:
        """A snapshot of every slot, ascending by lower bound."""
        return [SlotState(s.cfg.lower_bound, s.steps[s.idx], s.ema, s.batches, s.switches) for s in self._slots]

    def slot_state(self, batch_size: int) -> SlotState:
        """Snapshot of the slot ``batch_size`` routes to."""
        s = self._route(batch_size)
        return SlotState(s.cfg.lower_bound, s.steps[s.idx], s.ema, s.batches, s.switches)


def make_policy(config: AdaptiveConfig | VllmSchedule, *, initial_steps: int | None = None,
                cuda_graph_bs: Sequence[int] | None = None, cost_table=None) -> AdaptivePolicy | SchedulePolicy:
    """The policy a config describes: :class:`AdaptivePolicy` for an SGLang config, :class:`SchedulePolicy` for a
    vLLM schedule (which ignores ``initial_steps`` and ``cuda_graph_bs``: vLLM looks up the unpadded batch size),
    :class:`~spectune.backends.num_steps.throughput_policy.ThroughputAwarePolicy` for a throughput-aware SGLang
    config (``cost_table``: its decode-round times; None: empty, so it never switches, as SGLang without CUDA
    graphs)."""
    if isinstance(config, ThroughputAwareConfig):
        return ThroughputAwarePolicy(config, cost_table or CostTable(), initial_steps=initial_steps,  # type: ignore
                                     cuda_graph_bs=cuda_graph_bs)
    if isinstance(config, VllmSchedule):
        return SchedulePolicy(config)
    return AdaptivePolicy(config, initial_steps=initial_steps, cuda_graph_bs=cuda_graph_bs)
