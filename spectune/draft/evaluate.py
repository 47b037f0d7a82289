"""Offline acceptance evaluation of a draft head: acceptance length per num_steps, per position and per category.

Acceptance length = (accepted drafts + verify steps) / verify steps: tokens per verify step including the bonus
token, greedy (temperature 0), counted by the engine per request. Prompts run through the engine in batches;
greedy acceptance does not depend on the batch.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from spectune.backends.local.engine.sequence import SamplingParams
from spectune.core.json_types import JsonObject
from spectune.loadgen.datasets import Prompt

if TYPE_CHECKING:
    from spectune.backends.local.engine.loop import Engine


@dataclass
class AcceptanceResult:
    """Acceptance of one num_steps over a prompt set.

    Attributes:
        num_steps: K.
        acceptance_length: 1 + accepted / verify steps over all requests.
        per_position: share of verify steps whose first i+1 drafts were accepted, i = 0..K-1.
        per_category: category -> acceptance length.
        verify_steps, accepted_tokens, output_tokens: totals.
        wall_s: seconds the batch took (load-dependent; not a speed benchmark).
    """

    num_steps: int
    acceptance_length: float
    per_position: list[float]
    per_category: dict[str, float] = field(default_factory=dict)
    verify_steps: int = 0
    accepted_tokens: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0


def measure_acceptance(engine: Engine, prompts: list[Prompt], num_steps: int, max_tokens: int,
                       progress: Callable[[int], None] | None = None) -> AcceptanceResult:
    """Run ``prompts`` greedily at ``num_steps`` on ``engine`` (a built Engine with a head) and count acceptance."""
    engine.set_num_steps(num_steps)
    stats: JsonObject = {}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        ids = engine.tokenizer.encode_chat(p.messages)
        engine.add_request(str(i), ids, params, lambda out: stats.__setitem__(out.request_id, out) if out.finished else None)
    while engine.num_waiting or engine.num_running:
        engine.step()
        if progress is not None:
            progress(len(stats))
    steps = sum(o.spec.verify_steps for o in stats.values())
    acc = sum(o.spec.accepted_tokens for o in stats.values())
    per_pos = [0] * num_steps
    by_cat: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for i, p in enumerate(prompts):
        o = stats[str(i)]
        for i, n in enumerate(o.spec.accepted_per_pos[:num_steps]):
            per_pos[i] += n
        by_cat[p.category or "none"][0] += o.spec.verify_steps
        by_cat[p.category or "none"][1] += o.spec.accepted_tokens
    return AcceptanceResult(
        num_steps=num_steps,
        acceptance_length=1.0 + acc / steps if steps else 1.0,
        per_position=[n / steps if steps else 0.0 for n in per_pos],
        per_category={c: 1.0 + a / s if s else 1.0 for c, (s, a) in sorted(by_cat.items())},
        verify_steps=steps,
        accepted_tokens=acc,
        output_tokens=sum(o.num_output_tokens for o in stats.values()),
        wall_s=time.perf_counter() - t0,
    )
