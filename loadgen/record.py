"""One streamed request's raw measurements and the per-request metrics derived from them.

All times are seconds on one monotonic clock (:func:`time.perf_counter`), taken by the streaming client. Derived
metrics follow vLLM's ``benchmarks/serve.py`` definitions, corrected for multi-token chunks (background §3-§4):

- TTFT = first output chunk - send.
- TPOT = (last output chunk - first output chunk) / (completion_tokens - 1), with completion_tokens counted by the
  server (usage) where it reports them.
- per-token ITL: each chunk's gap to the previous output chunk spread evenly over the tokens it carries, so a chunk
  of 3 tokens that arrived 30 ms after the previous one gives three ITL samples of 10 ms.
- per-chunk latency: the raw gap between consecutive output chunks (what vLLM calls ITL).
- E2E latency = end of the stream - send.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from spectune.core.json_types import JsonObject


@dataclass
class RequestRecord:
    """Measurements of one request.

    Attributes:
        request_id: unique id within a sweep point.
        prompt_id: id of the dataset record the prompt came from.
        category: dataset category of the prompt (``"writing"``, ``"coding"``...), or None.
        send_time: s, when the request was sent.
        chunk_times: s, arrival time of every streamed chunk that carried output tokens, in order.
        chunk_tokens: output tokens carried by each of those chunks (same length as ``chunk_times``).
        token_count_source: how ``chunk_tokens`` was obtained: ``"usage"`` (continuous usage deltas from the
            server), ``"tokenizer"`` (chunk text tokenized client-side) or ``"chunks"`` (one token per chunk assumed).
        end_time: s, when the stream ended (``[DONE]`` or connection close); None if it never started.
        prompt_tokens: prompt length in tokens as reported by the server, or None.
        completion_tokens: output length in tokens (server usage where given, else the sum of ``chunk_tokens``).
        output_text: the generated text.
        finish_reason: the server's finish reason (``"stop"``, ``"length"``...), or None.
        status: HTTP status of the response, or None if no response arrived.
        error: a one-line error message if the request failed (HTTP error, error event, broken stream, timeout),
            else None. A record with an error is a failed request and is never averaged into latency metrics.
        server_stats: backend-specific per-request fields returned by the server (for example spectune's
            ``spec_decode`` object or SGLang's ``meta_info`` spec counters), or None.
        dispatch_delay_s: s the client itself held the request back: from when it was due (an open-loop arrival's
            scheduled time; in a closed loop, when the request before it in its slot ended) to when the client
            posted it; None when unknown (no sending loop). Large values mean the load generator, not the server, was
            the bottleneck.
        server_request_id: the id the server gave the response (the ``id`` of its first chunk that has one), or
            None; an engine trace that records request ids (``spectune serve --trace``) joins on it.
    """

    request_id: str
    prompt_id: str
    category: str | None
    send_time: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    token_count_source: str = "usage"
    end_time: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    output_text: str = ""
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None
    server_stats: JsonObject | None = None
    dispatch_delay_s: float | None = None
    server_request_id: str | None = None

    @property
    def ok(self) -> bool:
        """True when the request finished without error and produced at least one output chunk."""
        return self.error is None and bool(self.chunk_times)

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, s (first output chunk - send); None without output."""
        return self.chunk_times[0] - self.send_time if self.chunk_times else None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, s: (t_last - t_first) / (completion_tokens - 1).

        None when fewer than 2 tokens were produced (TPOT is undefined, as in vLLM's benchmark).
        """
        n = self.completion_tokens
        if not self.chunk_times or n is None or n < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (n - 1)

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency, s (end of stream - send); None if the stream never ended."""
        return None if self.end_time is None else self.end_time - self.send_time

    @property
    def chunk_latencies_s(self) -> list[float]:
        """Gaps between consecutive output chunks, s (len = chunks - 1): vLLM's per-chunk "ITL"."""
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def itl_per_token_s(self) -> list[float]:
        """Per-token inter-token latencies, s: each chunk's gap spread evenly over the tokens it carries.

        Chunk i > 0 with gap g and n_i tokens contributes n_i samples of g / n_i. Tokens of the first chunk
        have no previous chunk and contribute none.
        """
        out: list[float] = []
        for gap, n in zip(self.chunk_latencies_s, self.chunk_tokens[1:]):
            if n > 0:
                out.extend([gap / n] * n)
        return out

    def to_json(self) -> JsonObject:
        """A JSON-serialisable dict with the raw fields plus the derived ttft/tpot/e2e in ms."""
        d = asdict(self)
        for name, val in (("ttft_ms", self.ttft_s), ("tpot_ms", self.tpot_s), ("e2e_ms", self.e2e_s)):
            d[name] = None if val is None else val * 1000.0
        return d

    @classmethod
    def from_json(cls, d: JsonObject) -> "RequestRecord":
        """Inverse of :meth:`to_json` (derived fields are ignored)."""
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in d.items() if k in names})
