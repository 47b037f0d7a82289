"""SGLang's EMA policy replayed on the per-request acceptance a sweep measured: how far the EMA swings at a batch
size (:meth:`AcceptancePool.ema_spread`, which sizes the ladders' hysteresis) and how often a ladder switches
(:meth:`AcceptancePool.switches_per_minute`).

Per-request acceptance comes from the sweep's requests.jsonl: each request's ``server_stats.spec_decode``
(``verify_steps`` and ``accepted_per_position``: how many of its verify steps accepted draft i, i = 1..num_steps;
docs/results-format.md) gives that request's distribution of accepted drafts per verify,
P(accepted >= i) = accepted_per_position[i-1] / verify_steps. The replay keeps ``batch_size`` requests in flight:
each stays for as many verify steps as it took in the sweep, then a new one (drawn with the seeded generator) takes
its place, so the EMA sees the same between-request swings the engine does (a request of low acceptance holds a
batch-1 slot for its whole length). A request is kept by prompt across num_steps: after a switch to num_steps s it
draws from the same prompt's distribution at s when the sweep measured it there, else from another request at s.

The policy is :class:`spectune.backends.num_steps.ema_policy.AdaptivePolicy` (SGLang's
``python/sglang/srt/speculative/adaptive_spec_params.py``, restated).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from spectune.backends.num_steps.sglang_config import parse_sglang_adaptive_config
from spectune.backends.num_steps.ema_policy import AdaptivePolicy
from spectune.core.json_types import JsonValue
from spectune.results.request_acceptance import RequestAcceptance, request_acceptances
from spectune.tune.ladders import SGLANG_GLOBALS, Replay, SlotJson

if TYPE_CHECKING:
    from spectune.tune.recommend import Recommendation, Slot


@dataclass
class _InFlight:
    """A request in flight in :meth:`AcceptancePool.replay`: its prompt id, the verify steps it has left and, per
    num_steps it has run at, its distribution P(accepted >= i)."""

    prompt: str
    left: int
    dists: dict[int, list[float]] = field(default_factory=dict)


class AcceptancePool:
    """Per-request accepted-draft distributions, by num_steps, from a sweep's requests.

    Args:
        requests: the requests' accepted drafts (:func:`spectune.results.request_acceptance.request_acceptances`
            of requests.jsonl: failed ones, num_steps 0 and those without ``spec_decode`` counts are not there).
        concurrencies: keep only requests measured at these concurrencies (None: all).
    """

    def __init__(self, requests: Iterable[RequestAcceptance], concurrencies: Iterable[int] | None = None) -> None:
        keep = set(concurrencies) if concurrencies is not None else None
        #: num_steps -> [(prompt id, verify steps, P(accepted >= i) for i = 1..num_steps)]
        self.by_steps: dict[int, list[tuple[str, int, list[float]]]] = {}
        for r in requests:
            if keep is None or r.concurrency in keep:
                self.by_steps.setdefault(r.steps, []).append((r.prompt_id, r.verify_steps, r.accepted_at_least))
        self._by_prompt: dict[int, dict[str, list[int]]] = {}  # num_steps -> prompt id -> indices in by_steps[k]
        for k, reqs in self.by_steps.items():
            for i, (pid, _, _) in enumerate(reqs):
                self._by_prompt.setdefault(k, {}).setdefault(pid, []).append(i)

    @classmethod
    def from_requests(cls, records: Iterable[Mapping[str, JsonValue]] | None,
                      concurrencies: Iterable[int] | None = None) -> AcceptancePool:
        """The pool of requests.jsonl objects (``steps``, ``concurrency``, ``prompt_id``, ``server_stats``)."""
        return cls(request_acceptances(records), concurrencies)

    def covers(self, steps: Iterable[int]) -> bool:
        """True when every positive num_steps in ``steps`` has at least 8 measured requests."""
        return all(len(self.by_steps.get(k, {})) >= 8 for k in steps if k > 0)

    def mean_accepted(self, k: int) -> float:
        """Mean accepted drafts per verify at num_steps ``k`` over the pool's verify steps (NaN when none)."""
        reqs = self.by_steps.get(k) or []
        total = sum(n for _, n, _ in reqs)
        return sum(n * sum(p) for _, n, p in reqs) / total if total else math.nan

    def replay(self, slot: SlotJson, batch_size: int, initial_steps: int, batches: int,
               seed: int = 0) -> tuple[list[int], list[float]]:
        """Run SGLang's policy for one slot config (``candidate_steps``, hysteresis, ``ceiling_coeff``) over
        ``batches`` verify batches of ``batch_size`` requests. Returns (num_steps of each batch, the slot's EMA
        after each batch). Raises ValueError for an invalid slot, KeyError when a candidate > 0 has no requests."""
        cfg = parse_sglang_adaptive_config({**SGLANG_GLOBALS, "1": dict(slot)}, source="slot", strict=True)
        policy = AdaptivePolicy(cfg, initial_steps=initial_steps)
        rng = random.Random(seed)
        top = max(slot["candidate_steps"])

        def fresh() -> _InFlight:
            """A new request in flight."""
            if top == 0:
                return _InFlight("", 64)
            pid, n, _ = rng.choice(self.by_steps[top])
            return _InFlight(pid, n)

        def dist(st: _InFlight, k: int) -> list[float]:
            if k not in st.dists:
                same = self._by_prompt[k].get(st.prompt) if k in self._by_prompt else None
                i = rng.choice(same) if same else rng.randrange(len(self.by_steps[k]))
                st.dists[k] = self.by_steps[k][i][2]
            return st.dists[k]

        streams = [fresh() for _ in range(batch_size)]
        steps_trace, ema_trace = [], []
        for _ in range(batches):
            k = policy.steps_for_batch(batch_size)
            steps_trace.append(k)
            accepted = []
            for i, st in enumerate(streams):
                if k == 0:
                    accepted.append(0)
                else:
                    u = rng.random()
                    accepted.append(sum(u < p for p in dist(st, k)))
                st.left -= 1
                if st.left <= 0:
                    streams[i] = fresh()
            policy.on_verify(accepted, batch_size)
            ema_trace.append(policy.slot_state(batch_size).ema)
        return steps_trace, ema_trace

    def ema_spread(self, k: int, batch_size: int, batches: int = 2000, seed: int = 0) -> float:
        """Standard deviation (accepted drafts) of SGLang's EMA while a slot sits at num_steps ``k`` (> 0) with
        batches of ``batch_size`` requests: the policy replayed on ladder [k] (it never moves), after its warm-up.
        NaN when the pool has no requests at ``k``."""
        if k <= 0 or not self.by_steps.get(k):
            return math.nan
        slot = {"candidate_steps": [k], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0.0}
        _, ema = self.replay(slot, batch_size, k, batches, seed)
        tail = ema[SGLANG_GLOBALS["warmup_batches"] + 50:]
        mean = sum(tail) / len(tail)
        return math.sqrt(sum((e - mean) ** 2 for e in tail) / max(1, len(tail) - 1))

    def switches_per_minute(self, slot: SlotJson, batch_size: int, initial_steps: int,
                            batches_per_s: float, batches: int = 3000, seed: int = 0) -> float:
        """Expected num_steps switches per minute of a slot config at ``batch_size``: switches over a replay of
        ``batches`` verify batches (:meth:`replay`), at ``batches_per_s`` verify batches per second (from the
        sweep: output tok/s / (batch size x acceptance length)). 0.0 for a one-candidate ladder."""
        if len(slot["candidate_steps"]) < 2:
            return 0.0
        trace, _ = self.replay(slot, batch_size, initial_steps, batches, seed)
        switches = sum(a != b for a, b in zip(trace, trace[1:]))
        return switches / (batches / batches_per_s) * 60.0


def ladder_noise(pool: AcceptancePool, candidates: Iterable[int],
                 batch_size: int) -> tuple[Callable[[int], float] | None, Replay | None]:
    """(EMA spread, replay) for designing a slot's ladder at ``batch_size`` from the sweep's requests
    (:func:`spectune.tune.ladders.design_slot`): num_steps -> :meth:`AcceptancePool.ema_spread` (cached), and
    (slot, batch size, start, batches, seed) -> num_steps per batch (:meth:`AcceptancePool.replay`). (None, None)
    when the pool lacks requests at some positive candidate (the chain model and the default margin apply)."""
    cand = [c for c in candidates if c > 0]
    if not cand or not pool.covers(cand):
        return None, None
    cache: dict[int, float] = {}

    def spread(c: int) -> float:
        if c not in cache:
            cache[c] = pool.ema_spread(c, batch_size)
        return cache[c]

    def replay(slot: SlotJson, b: int, start: int, batches: int, seed: int) -> list[int]:
        return pool.replay(slot, b, start, batches, seed)[0]

    return spread, replay


def slot_switch_rate(rec: Recommendation, slot: Slot, slot_config: SlotJson) -> float | None:
    """Expected num_steps switches per minute of one emitted SGLang slot config (``candidate_steps``...) over the
    batch-size slot ``slot`` (:class:`spectune.tune.recommend.Slot`) of recommendation ``rec``: the policy replayed
    on the sweep's requests at the slot's smallest measured concurrency (its measured batch size when known),
    at the verify-batch rate of its chosen cell (output tok/s / (batch size x acceptance length)). 0.0 for one
    candidate; None when the sweep's requests or that cell's numbers are missing."""
    if len(slot_config["candidate_steps"]) < 2:
        return 0.0
    conc = slot.concurrencies[0]
    cell = rec.cell(slot.steps, conc)
    if cell is None or cell.status != "ok":
        return None
    bs = (rec.batch_sizes or {}).get(conc, conc)
    tput, al = cell.metric("output_throughput_tok_s"), cell.metric("acceptance_length")
    pool = AcceptancePool.from_requests(rec.requests, slot.concurrencies)
    if not (math.isfinite(tput) and math.isfinite(al) and al > 0) or not pool.covers(slot_config["candidate_steps"]):
        return None
    b = max(1, round(bs))
    return pool.switches_per_minute(slot_config, b, slot.steps, tput / (b * al))
