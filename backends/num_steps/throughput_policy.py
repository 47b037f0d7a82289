"""SGLang's throughput-aware adaptive num_steps strategy (``"strategy": "throughput_aware"``), restated; pure Python.

Source (SGLang main, PR #28045; not in the 0.5.23 release): ``python/sglang/srt/speculative/adaptive_spec_params.py``
(``resolve_adaptive_strategy``: a top-level ``"strategy"`` of ``"ema"``, the default, or ``"throughput_aware"``),
``throughput_aware_controller.py`` (``ThroughputAwareAdaptiveController``, config parsing, profile grid) and
``throughput_aware_spec_params.py`` (``PositionAcceptanceTracker``, ``BatchSizeCostTable``, ``score_candidates``,
``pick_best_step``). What it does:

- Config: integer-string keys are batch-size slots (lower bounds, routed like the EMA strategy: pad to a captured
  CUDA-graph size, then the largest key <= it); each needs ``candidate_steps``, a non-empty list of POSITIVE ints
  (0 is rejected here, unlike the EMA strategy). Globals: ``window_size`` 20, ``update_interval`` 10,
  ``profile_run_batch_sizes`` (None: every CUDA-graph size), ``max_profile_run_batch_size``,
  ``profile_run_n_warmup`` 5, ``profile_run_n_measure`` 10, ``profile_run_seq_len``. EMA keys are ignored.
- One num_steps for the whole server (not one per slot), starting at the server's num_steps when it is in the union
  of candidates, else the first slot's middle candidate. SGLang sets the server's num_steps to the middle of the
  union when ``--speculative-num-steps`` is not given.
- Cost table: at start-up SGLang times a decode round (ms) for each captured CUDA-graph batch size b and each
  num_steps s that b's slot lists (``_build_profile_grid``); no CUDA graphs means an empty table and no switching.
  A lookup takes the smallest profiled batch size >= b (the largest when b is above all) and that size's entry
  for s, if any.
- Per-position acceptance: after each verify batch at s steps, position k < s gets the share of requests with more
  than k accepted drafts, in a window of the last ``window_size`` batches; E[tokens | s] = 1 + sum of the positions'
  window means, positions without data extrapolated geometrically from the known ones.
- Decision, before a round at batch size b, when the verify-batch count is a positive multiple of
  ``update_interval``, every position below the current s has a full window and the cost table is not empty:
  score = E[tokens | s] / cost(b, s) for each candidate s of b's slot; the highest score wins (the first on ties;
  the current s when nothing scores); moving down clears the windows of positions >= the new s.

Here the cost table is given (:class:`CostTable`: from a profile, or from a sweep's rounds,
:func:`spectune.tune.strategy.cost_table_from_cells`), since spectune replays traces instead of running a GPU.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from spectune.core.json_types import JsonObject

THROUGHPUT_DEFAULTS: JsonObject = {
    "window_size": 20, "update_interval": 10, "profile_run_batch_sizes": None, "max_profile_run_batch_size": None,
    "profile_run_n_warmup": 5, "profile_run_n_measure": 10, "profile_run_seq_len": None,
}
"""SGLang's throughput-aware globals and their defaults (``ThroughputAwareAdaptiveController.__init__``)."""


@dataclass(frozen=True)
class ThroughputAwareConfig:
    """A validated throughput-aware config.

    Attributes:
        slots: {lower bound (batch size): candidate num_steps, ascending, positive}.
        window_size: verify batches per position window.
        update_interval: verify batches between decisions.
        profile_batch_sizes: batch sizes to profile (None: every CUDA-graph size).
        max_profile_batch_size: profile only batch sizes <= this (None: no limit).
        warnings: keys SGLang ignores under this strategy (EMA parameters, unknown keys).
    """

    slots: dict[int, tuple[int, ...]]
    window_size: int = 20
    update_interval: int = 10
    profile_batch_sizes: tuple[int, ...] | None = None
    max_profile_batch_size: int | None = None
    warnings: tuple[str, ...] = ()

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """Union of every slot's candidates, ascending (``resolve_throughput_aware_candidate_steps``)."""
        return tuple(sorted({s for steps in self.slots.values() for s in steps}))

    @property
    def server_initial_steps(self) -> int:
        """The server's num_steps without ``--speculative-num-steps``: the middle of :attr:`candidate_steps`."""
        union = self.candidate_steps
        return union[len(union) // 2]

    def slot_for_batch(self, batch_size: int) -> int:
        """Lower bound of the slot ``batch_size`` (already padded) routes to (the smallest slot below all)."""
        keys = sorted(self.slots)
        return keys[max(0, bisect.bisect_right(keys, batch_size) - 1)]

    def to_json(self) -> JsonObject:
        """The config as SGLang reads it, with ``"strategy": "throughput_aware"``."""
        out: JsonObject = {"strategy": "throughput_aware", "window_size": self.window_size,
                               "update_interval": self.update_interval}
        if self.profile_batch_sizes is not None:
            out["profile_run_batch_sizes"] = list(self.profile_batch_sizes)
        if self.max_profile_batch_size is not None:
            out["max_profile_run_batch_size"] = self.max_profile_batch_size
        out.update({str(b): {"candidate_steps": list(s)} for b, s in sorted(self.slots.items())})
        return out


def _positive_int(where: str, v: object, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{where} must be an integer >= {minimum}, got {v!r}")
    return v


def parse_throughput_aware_config(obj: object, *, source: str = "config") -> ThroughputAwareConfig:
    """Validate a decoded config with ``"strategy": "throughput_aware"`` (rules in the module docstring).

    Raises:
        ValueError: one line naming the key and the fix.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"{source}: an SGLang adaptive config must be a JSON object, got {type(obj).__name__}")
    slots: dict[int, tuple[int, ...]] = {}
    warnings = []
    for key, entry in obj.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            if key not in THROUGHPUT_DEFAULTS and key != "strategy":
                warnings.append(f"{source}: key {key!r} is ignored by the throughput_aware strategy")
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or not all(
                isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in steps):
            raise ValueError(f"{source}: slot {key!r}: throughput_aware 'candidate_steps' must be a non-empty list "
                             f"of positive integers (0 is not allowed under this strategy), got {steps!r}")
        if int(key) in slots:
            raise ValueError(f"{source}: slot {key!r} names the same batch size as another slot; keep one")
        slots[int(key)] = tuple(sorted(set(steps)))
        extra = sorted(set(entry) - {"candidate_steps"})
        if extra:
            warnings.append(f"{source}: slot {key!r}: {', '.join(extra)} ignored by the throughput_aware strategy")
    if not slots:
        raise ValueError(f'{source}: no batch-size slot: add at least one integer-string key, e.g. '
                         f'{{"1": {{"candidate_steps": [1, 3, 7]}}}}')
    prof = obj.get("profile_run_batch_sizes")
    if prof is not None and (not isinstance(prof, list) or not all(isinstance(b, int) and b >= 1 for b in prof)):
        raise ValueError(f"{source}: 'profile_run_batch_sizes' must be null or a list of batch sizes >= 1")
    top = obj.get("max_profile_run_batch_size")
    return ThroughputAwareConfig(
        slots=dict(sorted(slots.items())),
        window_size=_positive_int(f"{source}: 'window_size'", obj.get("window_size", 20)),
        update_interval=_positive_int(f"{source}: 'update_interval'", obj.get("update_interval", 10)),
        profile_batch_sizes=tuple(prof) if prof is not None else None,
        max_profile_batch_size=None if top is None else _positive_int(f"{source}: 'max_profile_run_batch_size'", top),
        warnings=tuple(warnings))


@dataclass
class CostTable:
    """Decode-round time (ms) per (batch size, num_steps): SGLang's ``BatchSizeCostTable``.

    ``lookup`` takes the smallest batch size in the table >= the asked one (the largest when above all) and
    returns that size's entry for num_steps, or None.
    """

    entries: dict[tuple[int, int], float] = field(default_factory=dict)

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({b for b, _ in self.entries})

    def lookup(self, batch_size: int, num_steps: int) -> float | None:
        sizes = self.batch_sizes
        if not sizes:
            return None
        i = min(bisect.bisect_left(sizes, batch_size), len(sizes) - 1)
        return self.entries.get((sizes[i], num_steps))

    @classmethod
    def from_json(cls, obj: Mapping[str, Mapping[str, float]]) -> "CostTable":
        """From ``{"batch size": {"num_steps": ms}}``. Raises ValueError on non-positive or non-numeric values."""
        entries = {}
        for b, row in obj.items():
            for s, ms in row.items():
                if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not ms > 0 or not math.isfinite(ms):
                    raise ValueError(f"cost table entry batch size {b}, num_steps {s}: must be a positive number of "
                                     f"ms, got {ms!r}")
                entries[(int(b), int(s))] = float(ms)
        return cls(entries)

    def to_json(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (b, s), ms in sorted(self.entries.items()):
            out.setdefault(str(b), {})[str(s)] = ms
        return out


def profiled_table(config: ThroughputAwareConfig, measured: CostTable,
                   cuda_graph_bs: Sequence[int] | None) -> CostTable:
    """The part of ``measured`` SGLang's start-up profile would hold (``_build_profile_grid``): CUDA-graph batch
    sizes (filtered by ``profile_run_batch_sizes`` and ``max_profile_run_batch_size``), each with the num_steps its
    slot lists. Without CUDA-graph sizes SGLang profiles nothing: the measured table's own batch sizes stand in."""
    pool = sorted(set(cuda_graph_bs)) if cuda_graph_bs else measured.batch_sizes
    if config.profile_batch_sizes is not None:
        pool = sorted(set(pool) & set(config.profile_batch_sizes))
    if config.max_profile_batch_size is not None:
        pool = [b for b in pool if b <= config.max_profile_batch_size]
    keep = {(b, s) for b in pool for s in config.slots[config.slot_for_batch(b)]}
    return CostTable({k: v for k, v in measured.entries.items() if k in keep})


class PositionTracker:
    """SGLang's ``PositionAcceptanceTracker``: per draft position, a window of per-batch acceptance shares."""

    def __init__(self, max_steps: int, window_size: int) -> None:
        self.max_steps = max_steps
        self.window_size = window_size
        self.windows: list[deque[float]] = [deque(maxlen=window_size) for _ in range(max_steps)]

    def update(self, accepted: Sequence[int], steps: int) -> None:
        n, s = len(accepted), min(steps, self.max_steps)
        if n == 0 or s <= 0:
            return
        counts = [0] * (s + 1)
        for a in accepted:
            counts[a if a < s else s] += 1
        cum = 0
        for k in range(s):
            cum += counts[k]
            self.windows[k].append((n - cum) / n)

    def clear_above(self, steps: int) -> None:
        for k in range(steps, self.max_steps):
            self.windows[k].clear()

    def warmed(self, steps: int) -> bool:
        return all(len(self.windows[k]) >= self.window_size for k in range(min(steps, self.max_steps)))

    def expected_tokens(self, steps: int) -> float | None:
        """1 + sum of per-position rates (geometric extrapolation where a position has no data); None cold."""
        if steps <= 0:
            return None
        rates: list[float] = []
        for k in range(steps):
            w = self.windows[k] if k < self.max_steps else ()
            if w:
                rate = sum(w) / len(w)
            elif not rates:
                return None
            elif len(rates) == 1:
                rate = rates[0]
            elif rates[0] <= 0:
                rate = 0.0
            else:
                alpha = (rates[-1] / rates[0]) ** (1.0 / (len(rates) - 1))
                rate = max(0.0, min(rates[-1], rates[-1] * alpha))
            rates.append(rate)
        return 1.0 + sum(rates)


class CandidateSteps(Protocol):
    """A policy's config as :class:`ConfiguredSteps` reads it: the num_steps it offers, ascending."""

    @property
    def candidate_steps(self) -> tuple[int, ...]: ...


class ConfiguredSteps:
    """The num_steps a policy's ``config`` offers (its ``candidate_steps``, ascending): a base of
    :class:`ThroughputAwarePolicy` and :class:`spectune.backends.num_steps.ema_policy.AdaptivePolicy`."""

    config: CandidateSteps

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """Union of every slot's candidates, ascending (the tiers an engine must be able to run)."""
        return self.config.candidate_steps

    @property
    def max_steps(self) -> int:
        """The largest candidate num_steps (buffer sizing)."""
        return self.config.candidate_steps[-1]


class ThroughputAwarePolicy(ConfiguredSteps):
    """The throughput-aware controller's decisions with :class:`AdaptivePolicy`'s interface.

    Engine use, every round: ``k = policy.steps_for_batch(bs)`` (the decision point, SGLang's
    ``activate_step_by_batch``; call it once per round), then ``policy.on_verify(accepted_drafts_per_req, bs)``.

    Args:
        config: the validated config.
        cost_table: measured decode-round times (ms); reduced to what SGLang would profile (:func:`profiled_table`).
        initial_steps: the server's num_steps; None: :attr:`ThroughputAwareConfig.server_initial_steps`.
        cuda_graph_bs: captured CUDA-graph batch sizes (routing pads to them; the profile uses them).
    """

    def __init__(self, config: ThroughputAwareConfig, cost_table: CostTable, *, initial_steps: int | None = None,
                 cuda_graph_bs: Sequence[int] | None = None) -> None:
        self.config = config
        self._graph_bs = sorted(set(cuda_graph_bs)) if cuda_graph_bs else None
        self.cost_table = profiled_table(config, cost_table, self._graph_bs)
        union = config.candidate_steps
        if initial_steps is None:
            initial_steps = config.server_initial_steps
        first = config.slots[min(config.slots)]
        self.current_steps = initial_steps if initial_steps in union else first[len(first) // 2]
        self.tracker = PositionTracker(max(union), config.window_size)
        self.batches = 0
        self.switch_count = 0
        self.last_scores: list[JsonObject] = []

    def slot_for_batch(self, batch_size: int) -> int:
        """Lower bound of the slot ``batch_size`` routes to (after CUDA-graph padding)."""
        b = batch_size
        if self._graph_bs is not None:
            i = bisect.bisect_left(self._graph_bs, b)
            if i < len(self._graph_bs):
                b = self._graph_bs[i]
        return self.config.slot_for_batch(b)

    def steps_for_batch(self, batch_size: int) -> int:
        """Decide (when due) and return num_steps for a round of ``batch_size`` requests."""
        if (self.batches > 0 and self.batches % self.config.update_interval == 0
                and self.tracker.warmed(self.current_steps) and self.cost_table.entries):
            rows = []
            for s in self.config.slots[self.slot_for_batch(batch_size)]:
                expected, cost = self.tracker.expected_tokens(s), self.cost_table.lookup(batch_size, s)
                score = expected / cost if expected is not None and cost is not None and cost > 0 else None
                rows.append({"steps": s, "expected": expected, "cost_ms": cost, "score": score})
            self.last_scores = rows
            best, best_score = self.current_steps, -math.inf
            for r in rows:
                if r["score"] is not None and r["score"] > best_score:
                    best, best_score = r["steps"], r["score"]
            if best != self.current_steps:
                if best < self.current_steps:
                    self.tracker.clear_above(best)
                self.current_steps = best
                self.switch_count += 1
        return self.current_steps

    def on_verify(self, accepted_drafts_per_req: Sequence[int], batch_size: int) -> int | None:
        """Record one verify batch (accepted drafts per request, bonus excluded); never switches (returns None)."""
        if accepted_drafts_per_req:
            self.tracker.update(list(accepted_drafts_per_req), self.current_steps)
            self.batches += 1
        return None
