"""Admission control and slot bookkeeping for continuous batching.

Running sequences occupy cache slots 0..B-1 in order, so a batch's KV is a plain view of the cache. Waiting
requests are admitted first-come first-served while a slot is free and the iteration's prefill token budget lasts
(the first one is always admitted, so a prompt longer than the budget still runs). A finished sequence leaves at
once; the last running sequence moves into its slot.
"""

from __future__ import annotations

from collections import deque

from spectune.backends.local.engine.sequence import Sequence


class Scheduler:
    """FCFS admission into a fixed number of slots.

    Args:
        num_slots: the most sequences that run at once (the largest batch size).
        max_waiting: the most requests that may wait; :meth:`add` refuses more.
        max_prefill_tokens: prompt tokens prefilled per engine iteration before decoding resumes.
    """

    def __init__(self, num_slots: int, max_waiting: int, max_prefill_tokens: int) -> None:
        self.num_slots = num_slots
        self.max_waiting = max_waiting
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> bool:
        """Queue a request; False when the waiting queue is full (the server answers 503)."""
        if len(self.waiting) >= self.max_waiting:
            return False
        self.waiting.append(seq)
        return True

    def admit(self) -> list[Sequence]:
        """Pop the requests to prefill this iteration and assign them the next free slots."""
        admitted: list[Sequence] = []
        budget = self.max_prefill_tokens
        while self.waiting and len(self.running) < self.num_slots:
            seq = self.waiting[0]
            if admitted and len(seq.prompt_ids) > budget:
                break
            self.waiting.popleft()
            budget -= len(seq.prompt_ids)
            seq.slot = len(self.running)
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def remove_waiting(self, request_id: str) -> Sequence | None:
        """Take a request out of the waiting queue (client gone); returns it, or None if it is not waiting."""
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return seq
        return None

    def release_finished(self) -> list[tuple[int, int]]:
        """Drop finished sequences, keeping slots dense.

        Returns the slot moves (src, dst) the caller must apply to the cache, in order.
        """
        moves: list[tuple[int, int]] = []
        i = 0
        while i < len(self.running):
            if not self.running[i].finished:
                i += 1
                continue
            last = self.running.pop()  # the tail fills the hole
            if i == len(self.running) or last.finished:
                continue  # the hole was the tail, or the tail is finished too: look at slot i again
            moves.append((last.slot, i))
            last.slot = i
            self.running[i] = last
            i += 1
        return moves
