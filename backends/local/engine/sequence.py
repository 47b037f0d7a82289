"""A request inside the engine: its prompt, sampling parameters, output so far and speculative-decoding counters."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from spectune.core.json_types import JsonObject

if TYPE_CHECKING:
    import torch

    from spectune.backends.local.engine.tokenizer import IncrementalText


@dataclass
class SamplingParams:
    """How to generate.

    Attributes:
        max_tokens: output tokens at most (>= 1).
        temperature: 0 is greedy; > 0 samples (lossless speculative sampling).
        top_p: nucleus mass in (0, 1]; 1 disables.
        top_k: keep the k most likely tokens; 0 (or -1) disables.
        stop: strings that end the output (not included in it).
        stop_token_ids: extra token ids that end the output.
        ignore_eos: keep generating past EOS (benchmarks use it to fix output lengths).
        seed: per-request sampling seed (the request draws from its own generator, so the same seed, prompt and
            num_steps schedule give the same output whatever else runs), or None for the engine's shared one.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None


@dataclass
class SpecStats:
    """Speculative-decoding counters of one request (vLLM's per-draft semantics).

    Attributes:
        verify_steps: target forwards that verified this request's drafts (one per decode round with K > 0).
        draft_tokens: draft tokens proposed.
        accepted_tokens: draft tokens accepted (the bonus token excluded).
        accepted_per_pos: accepted_per_pos[i] = verify steps whose first i+1 drafts were all accepted.
    """

    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, num_drafts: int, accepted: int) -> None:
        """Count one verify step that proposed ``num_drafts`` and accepted ``accepted`` of them."""
        if num_drafts <= 0:
            return
        self.verify_steps += 1
        self.draft_tokens += num_drafts
        self.accepted_tokens += accepted
        if len(self.accepted_per_pos) < num_drafts:
            self.accepted_per_pos.extend([0] * (num_drafts - len(self.accepted_per_pos)))
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted / verify steps (tokens per verify step, bonus included); None without verify steps."""
        return None if self.verify_steps == 0 else 1.0 + self.accepted_tokens / self.verify_steps

    def to_json(self) -> JsonObject:
        """The ``spec_decode`` object the server returns per request (documented in docs/engine.md)."""
        return {
            "verify_steps": self.verify_steps,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_position": list(self.accepted_per_pos),
            "acceptance_length": self.acceptance_length,
        }


@dataclass
class RequestOutput:
    """What the engine reports after a step for one request.

    Attributes:
        request_id: the request.
        new_token_ids: tokens emitted by this step (may be empty when only text was held back).
        text_delta: newly released text.
        finished: whether generation ended; then ``finish_reason`` is ``stop`` or ``length`` (or ``abort``, or
            ``error`` when the engine failed on this request: ``error`` then says why).
        num_prompt_tokens, num_output_tokens: totals so far.
        spec: the request's counters (final values once finished).
        error: one line about the engine failure that ended the request, else None.
    """

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    spec: SpecStats
    error: str | None = None


@dataclass
class Sequence:
    """A request's state in the engine. ``on_output`` is called from the engine thread after each step."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    on_output: Callable[[RequestOutput], None]
    arrival_time: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    slot: int = -1
    finished: bool = False
    finish_reason: str | None = None
    spec: SpecStats = field(default_factory=SpecStats)
    detok: IncrementalText | None = None  # set by the engine
    generator: torch.Generator | None = None  # of a seeded request, set by the engine

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt_ids) + len(self.output_ids)
