"""The engine loop: admit and prefill new requests, run one speculative round for the running batch, emit tokens.

It runs in its own thread (:meth:`Engine.start`) so the HTTP server's event loop stays responsive (torch releases
the GIL inside kernels), or synchronously through :meth:`Engine.generate` for tests, benchmarks and data
generation. num_steps per round comes from a static value, an SGLang-style adaptive policy or a vLLM per-batch-size
schedule (:mod:`spectune.backends.num_steps`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from spectune.backends.local.engine.draft_length import DraftRule
from spectune.backends.local.engine.sampling import SamplingTensors
from spectune.backends.local.engine.scheduler import Scheduler
from spectune.backends.local.engine.sequence import RequestOutput, SamplingParams, Sequence, SpecStats
from spectune.backends.local.engine.speculative import SpeculativeDecoder
from spectune.backends.local.engine.step_model import RoundGuard, StepModel
from spectune.backends.local.engine.tokenizer import IncrementalText, Tokenizer

if TYPE_CHECKING:
    from spectune.backends.local.weights.compute_paths import PathChoice
    from spectune.backends.num_steps import NumStepsPolicy, TraceWriter


log = logging.getLogger("spectune.engine")


class EngineFull(RuntimeError):
    """The waiting queue is full (the server answers 503)."""


class InvalidRequest(ValueError):
    """A request the engine cannot run as given (the server answers 400).

    Attributes:
        param: the request field at fault (OpenAI error ``param``), e.g. ``"top_k"``, ``"prompt"``.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class EngineStats:
    """Cumulative counters (read by /metrics and /server_info; vLLM's spec-decode counter semantics).

    Attributes:
        spec: spec-decode counters summed over requests (:class:`SpecStats`: verify_steps is vLLM's num_drafts).
        num_rounds, num_prefills, prompt_tokens, generation_tokens: work done (num_prefills counts requests).
        num_prefill_forwards: packed prefill forwards (each prefills every request admitted in one iteration).
        num_steps_switches: changes of the active num_steps between rounds.
        active_num_steps: num_steps of the last round.
        decode_seconds, prefill_seconds: wall time of the decode rounds and the prefill forwards, s (each ends with
            a host read of its tokens, so on a GPU the time includes its kernels).
        batch_total: the rounds' batch sizes summed (/ num_rounds: the mean running batch).
    """

    spec: SpecStats = field(default_factory=SpecStats)
    num_rounds: int = 0
    num_prefills: int = 0
    num_prefill_forwards: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_steps_switches: int = 0
    active_num_steps: int = 0
    decode_seconds: float = 0.0
    prefill_seconds: float = 0.0
    batch_total: int = 0

    @property
    def avg_accept_length(self) -> float:
        """Lifetime mean tokens per verify step (1 + accepted / drafts), as SGLang's avg_spec_accept_length."""
        return self.spec.acceptance_length or 1.0

    def copy(self) -> EngineStats:
        """The counters as they are now (what :func:`interval_line` compares a later reading with)."""
        spec = dataclasses.replace(self.spec, accepted_per_pos=list(self.spec.accepted_per_pos))
        return dataclasses.replace(self, spec=spec)


def interval_line(before: EngineStats, after: EngineStats, seconds: float) -> str | None:
    """One log line on the engine's work between two readings ``seconds`` s apart, or None when it did none: decode
    rounds (count, mean ms, mean batch, num_steps of the last), prefill forwards (count, mean ms, prompts and their
    tokens), and the share of the interval each took (the rest: waiting, admission, emitting tokens)."""
    rounds, forwards = after.num_rounds - before.num_rounds, after.num_prefill_forwards - before.num_prefill_forwards
    if not rounds and not forwards:
        return None
    decode_s, prefill_s = after.decode_seconds - before.decode_seconds, after.prefill_seconds - before.prefill_seconds
    parts = [f"engine, last {seconds:.1f} s:"]
    if rounds:
        parts.append(f"{rounds} decode rounds of {decode_s / rounds * 1e3:.2f} ms, batch "
                     f"{(after.batch_total - before.batch_total) / rounds:.1f} on average, num_steps "
                     f"{after.active_num_steps} last ({decode_s / seconds:.0%} of the time);")
    if forwards:
        parts.append(f"{forwards} prefill forwards of {prefill_s / forwards * 1e3:.2f} ms, "
                     f"{after.num_prefills - before.num_prefills} prompts, "
                     f"{after.prompt_tokens - before.prompt_tokens} tokens ({prefill_s / seconds:.0%} of the time)")
    return " ".join(parts).rstrip(";")


@dataclass
class EngineConfig:
    """Engine settings.

    Attributes:
        num_steps: static num_steps K when no policy is given (0 = plain decoding).
        max_num_seqs: cache slots (largest batch size).
        max_len: tokens per slot (prompt + output + K + 1 must fit).
        max_waiting: queued requests beyond which new ones are refused.
        max_prefill_tokens: prompt tokens prefilled per iteration.
        policy: an object with ``steps_for_batch(bs)`` and ``on_verify(accepted, bs)`` (backends.num_steps), or None.
        trace: a :class:`~spectune.backends.num_steps.trace.TraceWriter` (per round: accepted and drafted tokens per
            row, each position's draft confidence and acceptance estimate, context tokens, draft and verify ms, the
            rows' request ids), or None.
        steps_capacity: the largest num_steps the cache was sized for (``max_len`` keeps K+1 spare positions).
        stats_log_interval_s: the serving loop logs :func:`interval_line` this often (logger ``spectune.engine``).
    """

    num_steps: int = 0
    max_num_seqs: int = 64
    max_len: int = 2048
    max_waiting: int = 1024
    max_prefill_tokens: int = 1024
    policy: NumStepsPolicy | None = None
    trace: TraceWriter | None = None
    steps_capacity: int = 0
    stats_log_interval_s: float = 10.0


class Engine:
    """Continuous-batching EAGLE engine over a :class:`SpeculativeDecoder`.

    Args:
        decoder: the speculative decoder (target, head, KV caches). tokenizer: the target's tokenizer. cfg: limits and
            policy.
        model_name: the name the server answers to (``/v1/models``) unless the command line names another.
        path: the compute path the weights run on
            (:class:`spectune.backends.local.weights.compute_paths.PathChoice`: native int4, bfloat16 or float32, and
            why), reported in ``/server_info``; None when unknown (tests' tiny engines).
        step_model: the engine's model of a decode round
            (:class:`spectune.backends.local.engine.step_model.StepModel`): every round is counted per (batch,
            num_steps) in :attr:`guard`, which warns once for a shape whose rounds run over 1.5x the model; None
            (CUDA, tests' tiny engines): rounds are counted but never judged.
    """

    def __init__(self, decoder: SpeculativeDecoder, tokenizer: Tokenizer, cfg: EngineConfig,
                 model_name: str = "spectune-engine", path: PathChoice | None = None,
                 step_model: StepModel | None = None) -> None:
        self.decoder, self.tokenizer, self.cfg, self.model_name, self.path = decoder, tokenizer, cfg, model_name, path
        self.guard = RoundGuard(step_model)
        self.scheduler = Scheduler(cfg.max_num_seqs, cfg.max_waiting, cfg.max_prefill_tokens)
        self.stats = EngineStats(active_num_steps=cfg.num_steps)
        self.max_steps = max(getattr(cfg.policy, "max_steps", 0) or 0, cfg.num_steps)  # the largest K in use
        self.capacity = max(self.max_steps, cfg.steps_capacity)  # the largest K the cache leaves room for
        if self.max_steps > 0 and decoder.head is None:
            raise ValueError("num_steps > 0 needs a draft head")
        self._lock = threading.Condition()
        self._incoming: list[Sequence] = []
        self._aborts: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.error: BaseException | None = None
        self.vocab_size = int(decoder.target.cfg.vocab_size)
        self.num_request_errors = 0  # requests failed by an exception inside a step (the engine kept serving)
        self.last_request_error: str | None = None
        self._last_exc: Exception | None = None

    # ---- called from other threads -------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    on_output: Callable[[RequestOutput], None]) -> None:
        """Queue a request.

        Raises:
            EngineFull: the waiting queue is full.
            InvalidRequest: the prompt and max_tokens do not fit the context, a token id (prompt or
                ``stop_token_ids``) is outside the vocabulary, ``top_k`` exceeds it, or max_tokens < 1.
        """
        self.check_request(prompt_ids, params)
        seq = Sequence(request_id, list(prompt_ids), params, on_output)
        seq.detok = IncrementalText(self.tokenizer, params.stop)
        if params.seed is not None:
            seq.generator = seeded_generator(params.seed % 2**64, self.decoder.device)
        with self._lock:
            if len(self.scheduler.waiting) + len(self._incoming) >= self.cfg.max_waiting:
                raise EngineFull("the request queue is full")
            self._incoming.append(seq)
            self._lock.notify()

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise :class:`InvalidRequest` when the request cannot run here (see :meth:`add_request`)."""
        v = self.vocab_size
        if params.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {params.max_tokens}", "max_tokens")
        if not prompt_ids or len(prompt_ids) + params.max_tokens > self.context_len:
            raise InvalidRequest(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                                 f"the context of {self.context_len} tokens", "max_tokens")
        bad = next((t for t in prompt_ids if not (isinstance(t, int) and 0 <= t < v)), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside the vocabulary (0..{v - 1})", "prompt")
        bad = next((t for t in params.stop_token_ids if not (isinstance(t, int) and 0 <= t < v)), None)
        if bad is not None:
            raise InvalidRequest(f"stop token id {bad} is outside the vocabulary (0..{v - 1})", "stop_token_ids")
        if not -1 <= params.top_k <= v:
            raise InvalidRequest(f"top_k {params.top_k} must be -1 (off), 0 (off) or 1..{v} (the vocabulary)", "top_k")
        if not 0.0 <= params.temperature <= 2.0:
            raise InvalidRequest(f"temperature {params.temperature} must be in 0..2", "temperature")
        if not 0.0 < params.top_p <= 1.0:
            raise InvalidRequest(f"top_p {params.top_p} must be in (0, 1]", "top_p")

    def abort(self, request_id: str) -> None:
        """Stop a request (client disconnected, stop string seen by a caller); its slot is freed next iteration."""
        with self._lock:
            self._aborts.add(request_id)
            self._lock.notify()

    def set_num_steps(self, k: int, p_min: float | None = None) -> None:
        """Change the static num_steps and, unless ``p_min`` is None, the draft-confidence cutoff (``--draft-p-min``:
        > 0 each row stops drafting at the first draft token whose confidence is under it, at most ``k`` tokens; 0
        every row drafts ``k``); only while idle.

        Raises:
            RuntimeError: a request is in flight.
            InvalidRequest: (``param`` ``num_steps``) ``k`` > 0 without a draft head or above the cache's capacity;
                (``param`` ``draft_p_min``) ``p_min`` outside 0..1, or given while the server runs a config file's
                per-row rule (``specdec``, ``specserve``).
        """
        with self._lock:
            if self.scheduler.running or self.scheduler.waiting or self._incoming:
                raise RuntimeError("num_steps can only change while no request is in flight")
            if k > 0 and self.decoder.head is None:
                raise InvalidRequest("num_steps > 0 needs a draft head", "num_steps")
            if k > self.capacity:
                raise InvalidRequest(f"num_steps {k} exceeds the {self.capacity} this server was sized for",
                                     "num_steps")
            rule = self.decoder.rule
            if p_min is not None:
                if not 0.0 <= p_min <= 1.0:
                    raise InvalidRequest(f"draft_p_min {p_min} is outside 0..1: give a probability (0 = off)",
                                         "draft_p_min")
                if rule is not None and rule.strategy != "p_min":
                    raise InvalidRequest(f"draft_p_min cannot replace this server's {rule.describe()} rule from its "
                                         "config file: restart it without the config", "draft_p_min")
                self.decoder.rule = DraftRule("p_min", p_min, max(k, 1)) if p_min > 0 else None
            elif isinstance(rule, DraftRule) and rule.strategy == "p_min":
                rule.n_max = max(k, 1)
            self.cfg.num_steps = k
            self.max_steps = max(getattr(self.cfg.policy, "max_steps", 0) or 0, k)
            self.stats.active_num_steps = k

    @property
    def context_len(self) -> int:
        """Tokens a request may use (prompt + output); the cache keeps K+1 more per slot for verification."""
        return self.cfg.max_len - self.capacity - 1

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self._incoming)

    # ---- the loop ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Run :meth:`step` in a background thread until :meth:`shutdown`."""
        self._thread = threading.Thread(target=self.run, name="spectune-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def run(self) -> None:
        """Run the engine loop on the calling thread until :meth:`shutdown`.

        A step that raises fails the requests it was working on (:meth:`step`) and the loop goes on; only an
        exception outside a step (or a BaseException such as KeyboardInterrupt) ends it, and is surfaced by
        ``error`` (the server's /health then answers 503). Every ``cfg.stats_log_interval_s`` s in which it worked it
        logs :func:`interval_line` (logger ``spectune.engine``; the server prints it on stderr).
        """
        logged, since = self.stats.copy(), time.perf_counter()
        try:
            while True:
                with self._lock:
                    while not self._stop and not self._incoming and not self._aborts and not self.scheduler.running \
                            and not self.scheduler.waiting:
                        self._lock.wait(self.cfg.stats_log_interval_s)
                        if time.perf_counter() - since >= self.cfg.stats_log_interval_s:
                            break
                    if self._stop:
                        return
                if self.scheduler.running or self.scheduler.waiting or self._incoming or self._aborts:
                    self.step()
                now = time.perf_counter()
                if now - since >= self.cfg.stats_log_interval_s:
                    line = interval_line(logged, self.stats, now - since)
                    if line is not None:
                        log.info(line)
                    logged, since = self.stats.copy(), now
        except BaseException as err:  # surfaced by the server's /health
            self.error = err
            raise

    def step(self) -> None:
        """One iteration: take new requests and aborts, prefill admitted ones, run one decode round.

        The admitted requests are prefilled together (:meth:`_prefill`); an exception while prefilling a request
        fails that request alone; one in the decode round fails the requests of that batch (the round's state is
        unknown). Failed requests finish with ``finish_reason`` ``"error"`` and free their slots; requests that are
        waiting are untouched and the engine keeps serving.
        """
        with self._lock:
            for seq in self._incoming:
                self.scheduler.add(seq)
            self._incoming.clear()
            aborts, self._aborts = self._aborts, set()
        for rid in aborts:
            self._abort(rid)
        drafting = self.max_steps > 0
        admitted = self.scheduler.admit()
        if admitted:
            self._prefill(admitted, drafting)
        self._release()
        running = list(self.scheduler.running)
        if running:
            try:
                self._decode(running, drafting)
            except Exception as err:  # noqa: BLE001 - the batch's requests fail, the engine keeps serving
                self._fail([s for s in running if not s.finished], err)
            self._release()

    def _prefill(self, seqs: list[Sequence], drafting: bool) -> None:
        """Prefill the admitted requests in one packed forward and emit their first tokens.

        When that forward raises, each request is prefilled again on its own, so only the request at fault fails.
        """
        start = time.perf_counter()
        try:
            firsts = self.decoder.prefill([s.slot for s in seqs], [s.prompt_ids for s in seqs], self._sampling(seqs),
                                          drafting)
        except Exception as err:  # noqa: BLE001 - a request fails, the others go on
            if len(seqs) == 1:
                self._fail(seqs, err)
            else:
                for seq in seqs:
                    self._prefill([seq], drafting)
            return
        self.stats.num_prefill_forwards += 1
        self.stats.prefill_seconds += time.perf_counter() - start
        for seq, first in zip(seqs, firsts):
            self.stats.num_prefills += 1
            self.stats.prompt_tokens += len(seq.prompt_ids)
            try:
                self._emit(seq, [first])
            except Exception as err:  # noqa: BLE001 - this request fails, the others go on
                self._fail([seq], err)

    def _decode(self, running: list[Sequence], drafting: bool) -> None:
        batch = len(running)
        policy = self.cfg.policy
        k = policy.steps_for_batch(batch) if policy is not None else self.cfg.num_steps
        if k != self.stats.active_num_steps:
            self.stats.num_steps_switches += 1
            self.stats.active_num_steps = k
        contexts = self.decoder.lengths[:batch]  # per row: cached tokens the round attends over (host copy)
        context = sum(contexts)
        start = time.perf_counter()
        accepted, tokens = self.decoder.decode_round(batch, k, self._sampling(running), keep_draft=drafting)
        seconds = time.perf_counter() - start
        self.stats.decode_seconds += seconds
        info = self.decoder.last_round  # per row: the draft tokens verified (a draft-length rule sets each row's)
        self.guard.record(batch, info.draft_steps, seconds, context)  # a per-row rule's round: the positions it ran
        self.stats.num_rounds += 1
        self.stats.batch_total += batch
        for seq, a, toks, drafted in zip(running, accepted, tokens, info.drafted):
            self._count(seq, drafted, a)
            self._emit(seq, toks)
        if policy is not None:
            policy.on_verify(accepted, batch)
        if self.cfg.trace is not None:
            self.cfg.trace.record(batch, accepted, k, drafted=info.drafted, draft_probs=info.draft_probs,
                                  accept_probs=info.accept_probs, context_tokens=contexts, draft_ms=info.draft_ms,
                                  verify_ms=info.verify_ms, request_ids=[seq.request_id for seq in running])

    def _fail(self, seqs: list[Sequence], err: Exception) -> None:
        """Finish ``seqs`` with ``finish_reason`` ``"error"`` (their slots are freed by the next release)."""
        message = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        self.num_request_errors += len(seqs)
        self.last_request_error = message
        self._last_exc = err
        for seq in seqs:
            seq.finished, seq.finish_reason = True, "error"
            try:
                seq.on_output(RequestOutput(seq.request_id, [], "", True, "error", len(seq.prompt_ids),
                                            len(seq.output_ids), seq.spec, message))
            except Exception:  # noqa: BLE001 - the caller is gone (closed event loop): nothing to tell
                pass

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Run prompts to completion in this thread (no background loop); returns output token ids per prompt.

        Raises:
            InvalidRequest: see :meth:`add_request`.
            Exception: the first exception a step raised for one of these requests (re-raised here, unlike the
                serving loop, which fails only that request).
        """
        outputs: dict[str, list[int]] = {}
        self._last_exc = None
        for i, prompt in enumerate(prompts):
            outputs[str(i)] = []
            self.add_request(str(i), prompt, params, lambda out: outputs[out.request_id].extend(out.new_token_ids))
        while self._incoming or self.scheduler.waiting or self.scheduler.running:
            self.step()
            if self._last_exc is not None:
                raise self._last_exc
        return [outputs[str(i)] for i in range(len(prompts))]

    # ---- helpers -------------------------------------------------------------------------------------------
    def _sampling(self, seqs: list[Sequence]) -> SamplingTensors:
        p = [s.params for s in seqs]
        return SamplingTensors.build([x.temperature for x in p], [max(x.top_k, 0) for x in p],
                                     [x.top_p for x in p], self.decoder.device, [s.generator for s in seqs])

    def _count(self, seq: Sequence, k: int, accepted: int) -> None:
        seq.spec.record(k, accepted)
        self.stats.spec.record(k, accepted)

    def _emit(self, seq: Sequence, tokens: list[int]) -> None:
        p, eos = seq.params, self.tokenizer.eos_token_ids
        new: list[int] = []
        for t in tokens:
            seq.output_ids.append(t)
            new.append(t)
            if (not p.ignore_eos and t in eos) or t in p.stop_token_ids:
                seq.finished, seq.finish_reason = True, "stop"
                break
            seq.detok.push(t)
            if seq.detok.stopped:
                seq.finished, seq.finish_reason = True, "stop"
                break
            if len(seq.output_ids) >= p.max_tokens:
                seq.finished, seq.finish_reason = True, "length"
                break
        self.stats.generation_tokens += len(new)
        seq.on_output(RequestOutput(seq.request_id, new, seq.detok.release(seq.finished), seq.finished,
                                    seq.finish_reason, len(seq.prompt_ids), len(seq.output_ids), seq.spec))

    def _abort(self, request_id: str) -> None:
        seq = self.scheduler.remove_waiting(request_id)
        if seq is None:
            seq = next((s for s in self.scheduler.running if s.request_id == request_id), None)
        if seq is not None and not seq.finished:
            seq.finished, seq.finish_reason = True, "abort"
            seq.on_output(RequestOutput(seq.request_id, [], "", True, "abort", len(seq.prompt_ids),
                                        len(seq.output_ids), seq.spec))
        self._release()

    def _release(self) -> None:
        for src, dst in self.scheduler.release_finished():
            self.decoder.move_slot(src, dst)


def seeded_generator(seed: int, device: torch.device) -> torch.Generator:
    """A torch Generator on ``device`` seeded with ``seed``."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
