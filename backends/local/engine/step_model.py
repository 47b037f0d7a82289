"""The engine's own model of a decode round, and the guard that compares measured rounds with it.

A round at batch b and num_steps K (:meth:`~spectune.backends.local.engine.speculative.SpeculativeDecoder.
decode_round`) runs the target once over b(K+1) rows (verify) and, with K > 0, the head's lm_head K times over b rows
(one per draft token), its layer K-1 times over b rows and once over b(K+1) rows (the draft extend). On CPU every one
of those forwards reads all of its weights, so its time is its cost at one row plus what its linear kernels add for
the extra rows:

    T_target(r) = M_target + W_target * (t_target(r) - t_target(1)) + c_row * (r - 1)
    T_head(r)   = M_head   + W_head   * (t_head(r)   - t_head(1))
    round(b, K) = T_target(b(K+1)) + [K > 0] * (K * T_lm(b) + (K-1) * T_body(b) + T_body(b(K+1)))
                  + R_round + [K > 0] * R_draft + c_ctx * (K+1) * L

where ``M`` is a forward at one row measured at start-up (the whole forward: every layer, attention, lm_head, the
compiled graph's own overhead), ``W`` the forward's linear weights (int4 codes count once per pass they are read:
a Q8_0 lm_head run as two int4 halves counts twice) and ``t(r)`` the probe's time per weight of the kernel that runs r
rows (:func:`spectune.backends.local.weights.compute_paths.dense_crossover`'s ``rows_ms``, weights streamed from DRAM
up to 16 rows; the native path's int4 kernel up to ``dense_above`` rows and its dense copy above; the head's dense
bf16 or float32 linears). ``c_row`` is what a row costs outside the linears (attention, norms, RoPE, the logits'
softmax-free argmax): fitted at start-up from one measured decode forward of ``min(slots, 16)`` sequences, the rest of
that forward once the linears' part is taken out (without it the model ran 1.3-1.5x under the measured rounds at
batch 8-16 on 2 AVX-512 cores, where the guard must not fire; ``benchmarks/round_table.py``, docs/engine.md). The
head's lm_head and its body (fc and decoder layer) are split by their weights:
``T_lm(r) = M_head * W_lm / W_head + W_lm * (t_head(r) - t_head(1))`` and ``T_body`` the rest. Between probed row
counts ``t`` is interpolated linearly, above the largest it grows with the rows. ``R_round`` and ``R_draft`` are a
round's own fixed work outside the forwards (verification, stacking the drafts, the index updates and host reads;
with drafting, more of it), fitted from real decode rounds of one sequence at num_steps 0 and 1 at start-up: shapes
of one and two rows, which no kernel switch reaches, so a cliff at more rows is not absorbed into them. ``L`` is the
round's context, the batch's cached tokens summed, and ``c_ctx`` what attention costs per query row per cached token
(SpecServe's step-time model has the same term, alpha x context tokens: ../shared/docs/papers/specserve.txt), fitted
from two decode forwards of ``min(slots, 16)`` sequences at about position 512 and at position 5: without it a round
of 16 MT-Bench requests (about 200 cached tokens each) ran 1.7x the model.

The guard (:class:`RoundGuard`): a shape whose mean round over at least :data:`MIN_ROUNDS` rounds is more than
:data:`SLOW_RATIO` times its prediction is an engine artifact (a kernel choice that costs more on the whole step than
the probe said, a recompile, a machine under other load), not speculation's trade-off; the engine logs one warning per
shape and the sweep records it with the point (``engine_warnings``), so a user sees it before tuning on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping

from spectune.backends.local.weights.kernel_probes import _best_ms

if TYPE_CHECKING:
    from torch import nn

    from spectune.backends.local.engine.speculative import SpeculativeDecoder
    from spectune.backends.local.weights.compute_paths import PathChoice

log = logging.getLogger("spectune.engine")

SLOW_RATIO = 1.5
"""A shape's mean round above this many times its prediction is flagged (issue #71: a cliff doubles the round)."""
ROW_FIT_BATCH = 16
"""Sequences of the decode forward that fits ``c_row`` at start-up (fewer when the server has fewer slots; none below
4)."""
CTX_FIT_POSITION = 512
"""The position of the deep decode forward that fits ``c_ctx`` (lower when the cache is shorter; none below 64)."""
MIN_ROUNDS = 20
"""Rounds of a shape before the guard judges it (one slow round is noise: a scheduler slice, a page fault)."""


def _interp(curve: Mapping[int, float], rows: int) -> float:
    """``curve`` (rows -> ms per weight) at ``rows``: linear between probed counts, proportional beyond the largest,
    the smallest's value below it."""
    xs = sorted(curve)
    if rows <= xs[0]:
        return curve[xs[0]]
    if rows >= xs[-1]:
        return curve[xs[-1]] * rows / xs[-1]
    hi = next(x for x in xs if x >= rows)
    lo = max(x for x in xs if x <= rows)
    if hi == lo:
        return curve[lo]
    return curve[lo] + (curve[hi] - curve[lo]) * (rows - lo) / (hi - lo)


def linear_weights(module: nn.Module, name_filter: Callable[[str], bool] = lambda _: True) -> int:
    """Weights a forward of ``module`` reads through its linear layers (every leaf with ``in_features`` and
    ``out_features``: ``nn.Linear``, the packed and native layers), times the passes over the input a native layer
    makes (``repeat``: 2 for a Q8_0 matrix run as two int4 halves); ``name_filter`` picks layers by qualified name."""
    total = 0
    for name, m in module.named_modules():
        if hasattr(m, "in_features") and hasattr(m, "out_features") and not list(m.children()) and name_filter(name):
            total += int(m.in_features) * int(m.out_features) * int(getattr(m, "repeat", 1) or 1)
    return total


@dataclass
class StepModel:
    """Predicted decode round (ms) per (batch, num_steps) for one engine (see the module docstring for the formula).

    Attributes:
        target_ms: M_target, one target forward over one row with its logits, ms (measured at start-up).
        head_ms: M_head, one head forward over one row with its draft logits, ms (0 without a head).
        target_weights, head_weights, head_lm_weights: W_target, W_head and the head's lm_head share W_lm.
        target_curve: rows -> ms per weight of the kernel the target's linears run at that many rows.
        head_curve: rows -> ms per weight of the head's linears.
        row_ms: c_row, ms per row beyond the first outside the linears (fitted at start-up; 0 when not fitted).
        round_ms, draft_round_ms: R_round and R_draft, ms (fitted at start-up; 0 when not fitted).
        ctx_ms: c_ctx, ms per query row per cached token (fitted at start-up; 0 when not fitted).
        path: the compute path's description for messages (``native, int4 up to 16 rows, bfloat16 dense above``).
        checks: start-up checks, ``{"rows": r, "measured_ms": m, "predicted_ms": p}`` per checked target forward of
            one sequence, and the ``c_row`` fit's forward (``"sequences"``: its batch; its prediction before the fit).
    """

    target_ms: float
    head_ms: float
    target_weights: int
    head_weights: int
    head_lm_weights: int
    target_curve: dict[int, float]
    head_curve: dict[int, float]
    path: str
    row_ms: float = 0.0
    round_ms: float = 0.0
    draft_round_ms: float = 0.0
    ctx_ms: float = 0.0
    checks: list[dict[str, float]] = field(default_factory=list)

    def target_fwd_ms(self, rows: int) -> float:
        """T_target(rows), ms."""
        linears = self.target_weights * (_interp(self.target_curve, rows) - _interp(self.target_curve, 1))
        return self.target_ms + linears + self.row_ms * (rows - 1)

    def _head_part_ms(self, rows: int, weights: int) -> float:
        if not self.head_weights:
            return 0.0
        share = weights / self.head_weights
        return self.head_ms * share + weights * (_interp(self.head_curve, rows) - _interp(self.head_curve, 1))

    def predict_ms(self, batch: int, num_steps: int, context: float = 0.0) -> float:
        """Predicted round at ``batch`` sequences and ``num_steps`` drafts each, with ``context`` cached tokens over
        the batch (summed), ms."""
        b, k = batch, num_steps
        ms = self.target_fwd_ms(b * (k + 1)) + self.round_ms + self.ctx_ms * (k + 1) * context
        if k > 0:
            body = self.head_weights - self.head_lm_weights
            ms += (k * self._head_part_ms(b, self.head_lm_weights) + (k - 1) * self._head_part_ms(b, body)
                   + self._head_part_ms(b * (k + 1), body) + self.draft_round_ms)
        return ms

    def to_json(self) -> dict[str, object]:
        """JSON-ready description (``/server_info`` ``step_model``)."""
        return {"target_ms": round(self.target_ms, 3), "head_ms": round(self.head_ms, 3),
                "row_ms": round(self.row_ms, 4), "round_ms": round(self.round_ms, 3),
                "draft_round_ms": round(self.draft_round_ms, 3), "ctx_ms": round(self.ctx_ms, 6), "path": self.path,
                "target_weights": self.target_weights, "head_weights": self.head_weights,
                "checks": self.checks, "slow_ratio": SLOW_RATIO, "min_rounds": MIN_ROUNDS}


def target_forward(decoder: SpeculativeDecoder, rows: int, batch: int = 1, start: int = 5) -> Callable[[], object]:
    """A call running one target forward with its logits for ``batch`` sequences (cache slots 0..batch-1) of ``rows``
    query tokens at positions ``start``.. (empty at start-up: what these forwards write, a later prefill overwrites);
    the start-up probes time it."""
    import torch

    tokens = torch.zeros(batch, rows, dtype=torch.long, device=decoder.device)
    pos = start + torch.arange(rows, device=decoder.device).repeat(batch, 1)  # [batch, rows]

    def run() -> object:
        hidden, _ = decoder._target_fwd(tokens, pos)
        return decoder.target.logits(hidden)
    return run


def _kernel_curve(rows_ms: Mapping[str, Mapping[str, float]], kernel_at: Callable[[int], str],
                  probe_weights: int) -> dict[int, float]:
    """rows -> ms per weight from the crossover probe's ``rows_ms`` (one layer of ``probe_weights`` weights), taking
    at each probed row count the kernel ``kernel_at(rows)`` names; non-decreasing in the rows."""
    curve: dict[int, float] = {}
    for r in sorted(int(r) for r in rows_ms["int4"]):
        if str(r) in rows_ms.get(kernel_at(r), {}):
            # more rows never take less time: a noisy probe's dip is read as the count below's time
            curve[r] = max(rows_ms[kernel_at(r)][str(r)] / probe_weights, max(curve.values(), default=0.0))
    return curve


def build_step_model(decoder: SpeculativeDecoder, choice: PathChoice, rows_ms: Mapping[str, Mapping[str, float]],
                     probe_weights: int, check_rows: tuple[int, ...] = (), drafting: bool = False) -> StepModel | None:
    """Measure M_target (and M_head) on ``decoder``'s own forwards at one row (cache slot 0, positions 5..: empty at
    start-up) and build the :class:`StepModel` of ``choice``'s kernels from the crossover probe's ``rows_ms``
    (``probe_weights``: the probe layer's weights). ``check_rows``: target forwards of these row counts (one sequence,
    query length r) are timed too and kept in ``checks`` beside their prediction; a check over :data:`SLOW_RATIO`
    times its prediction logs a warning. ``drafting``: the engine drafts (num_steps capacity > 0), so its rounds keep
    the head current and the drafting fixed cost is fitted too. None on CUDA or without the probe's timings.
    """
    import torch

    if decoder.device.type != "cpu" or not rows_ms.get("int4"):
        return None
    dense = choice.dense_dtype or "float32"
    if choice.name == "native":
        def target_kernel(r: int) -> str:
            return dense if choice.dense_above is not None and r > choice.dense_above else "int4"
    else:
        def target_kernel(r: int) -> str:
            return choice.name if choice.name in rows_ms else "float32"
    head_kind = "bfloat16" if choice.bf16_packed and "bfloat16" in rows_ms else "float32"
    target_curve = _kernel_curve(rows_ms, target_kernel, probe_weights)
    head_curve = _kernel_curve(rows_ms, lambda _: head_kind, probe_weights)
    target, head = decoder.target, decoder.head
    dev = decoder.device

    def target_fwd(rows: int, batch: int = 1, start: int = 5) -> Callable[[], object]:
        return target_forward(decoder, rows, batch, start)

    with torch.inference_mode():
        target_ms = _best_ms(target_fwd(1), 5)
        head_ms, head_w, head_lm_w = 0.0, 0, 0
        if head is not None:
            feat = decoder.draft_feature[:1].unsqueeze(1).clone()  # [1, 1, H]: a draft step's own feature
            tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
            pos1 = torch.full((1, 1), 5, dtype=torch.long, device=dev)

            def head_fwd() -> object:
                out = decoder._draft_fwd(tok, pos1, feat)
                return head.draft_tokens(out[:, 0])
            head_ms = _best_ms(head_fwd, 5)
            head_w = linear_weights(head)
            head_lm_w = linear_weights(head, lambda n: "lm_head" in n)
        model = StepModel(target_ms, head_ms, linear_weights(target), head_w, head_lm_w, target_curve, head_curve,
                          describe_kernels(choice))
        fit = min(decoder.target_cache.num_slots, ROW_FIT_BATCH)
        if fit >= 4:  # c_row from a decode forward of `fit` sequences: what the linears do not explain
            measured, linears_only = _best_ms(target_fwd(1, fit), 3), model.target_fwd_ms(fit)
            model.row_ms = max(0.0, (measured - linears_only) / (fit - 1))
            model.checks.append({"rows": fit, "sequences": fit, "measured_ms": round(measured, 3),
                                 "predicted_ms": round(linears_only, 3)})
            far = min(CTX_FIT_POSITION, decoder.target_cache.max_len - 1)
            if far > 64:  # c_ctx: the same forward attending over `far` cached positions instead of 6
                deep = _best_ms(target_fwd(1, fit, far), 3)
                model.ctx_ms = max(0.0, (deep - measured) / (fit * (far - 5)))
        _fit_round_costs(decoder, model, drafting)
        for rows in check_rows:
            measured = _best_ms(target_fwd(rows), 3)
            predicted = model.target_fwd_ms(rows)
            model.checks.append({"rows": rows, "measured_ms": round(measured, 3), "predicted_ms": round(predicted, 3)})
            if measured > SLOW_RATIO * predicted:
                log.warning("step model check: a target forward over %d rows took %.2f ms, %.1fx the %.2f ms the "
                            "probe predicts (%s)", rows, measured, measured / predicted, predicted, model.path)
    log.info("step model: target forward %.2f ms, head %.2f ms at one row, %.3f ms a row besides the linears; "
             "checks %s", target_ms, head_ms, model.row_ms,
             ", ".join(f"{c['rows']:.0f} rows {c['measured_ms']:.2f} ms (predicted {c['predicted_ms']:.2f})"
                       for c in model.checks) or "none")
    return model


def _fit_round_costs(decoder: SpeculativeDecoder, model: StepModel, drafting: bool, rounds: int = 5) -> None:
    """Fit ``model.round_ms`` (and, with a head, ``draft_round_ms``) from real decode rounds of one sequence at
    num_steps 0 and 1: a short prompt prefilled into cache slot 0, ``rounds`` rounds timed after one untimed, the
    fastest kept; what the forwards' model does not explain is the round's own work (never below 0). The slot is left
    empty again (its next prefill overwrites what these rounds wrote)."""
    import torch

    from spectune.backends.local.engine.sampling import SamplingTensors

    st = SamplingTensors.build([0.0], [0], [1.0], decoder.device)
    draft = decoder.head is not None and drafting
    decoder.prefill([0], [[1, 2, 3, 4, 5, 6, 7, 8]], st, draft)
    try:
        def best(k: int) -> float:
            return _best_ms(lambda: decoder.decode_round(1, k, st, keep_draft=draft), rounds)

        with torch.inference_mode():
            model.round_ms = max(0.0, best(0) - model.predict_ms(1, 0))
            if draft:
                model.draft_round_ms = max(0.0, best(1) - model.predict_ms(1, 1))
    finally:
        decoder.lengths[0] = decoder.draft_len[0] = 0
        decoder.seq_len[0] = 0


def describe_kernels(choice: PathChoice) -> str:
    """``choice``'s kernels in words, e.g. ``native: int4 up to 8 rows, bfloat16 dense above``."""
    if choice.name != "native":
        return choice.name
    if choice.dense_above is None:
        return "native: int4 at every row count"
    return f"native: int4 up to {choice.dense_above} rows, {choice.dense_dtype or 'float32'} dense above"


@dataclass
class RoundGuard:
    """Per-shape round statistics of a serving engine against its :class:`StepModel`.

    Attributes:
        model: the step model (None: nothing is judged, e.g. on CUDA).
        shapes: (batch, num_steps) -> [rounds, seconds, cached tokens summed over the rounds' batches] since start.
        warnings: one message per flagged shape, in the order they were flagged (``/server_info``).
    """

    model: StepModel | None
    shapes: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    _flagged: set[tuple[int, int]] = field(default_factory=set)

    def record(self, batch: int, num_steps: int, seconds: float, context: int = 0) -> str | None:
        """Count one round of ``seconds`` over a batch holding ``context`` cached tokens (summed); returns the warning
        when this round makes the shape flagged (once per shape)."""
        entry = self.shapes.setdefault((batch, num_steps), [0, 0.0, 0])
        entry[0] += 1
        entry[1] += seconds
        entry[2] += context
        if self.model is None or (batch, num_steps) in self._flagged or entry[0] < MIN_ROUNDS:
            return None
        if entry[0] != MIN_ROUNDS and entry[0] % (10 * MIN_ROUNDS):
            return None  # judged at MIN_ROUNDS rounds, then every 200: the mean of a long-running shape
        return self.judge(batch, num_steps)

    def judge(self, batch: int, num_steps: int) -> str | None:
        """The warning for ``(batch, num_steps)`` if its mean round is over :data:`SLOW_RATIO` times the model's (and
        not flagged before), else None."""
        rounds, seconds, context = self.shapes.get((batch, num_steps), (0, 0.0, 0))
        if self.model is None or not rounds or (batch, num_steps) in self._flagged:
            return None
        mean = seconds / rounds * 1e3
        predicted = self.model.predict_ms(batch, num_steps, context / rounds)
        if mean <= SLOW_RATIO * predicted:
            return None
        self._flagged.add((batch, num_steps))
        message = (f"decode rounds at batch {batch} x num_steps {num_steps}: {mean:.1f} ms over {rounds:.0f} rounds, "
                   f"{mean / predicted:.1f}x the {predicted:.1f} ms its step model predicts ({self.model.path}); "
                   "an engine artifact, not speculation's trade-off")
        self.warnings.append(message)
        log.warning("%s", message)
        return message

    def to_json(self) -> dict[str, object]:
        """``/server_info`` ``step_model``: the model, its predictions and the measured means per shape seen, and the
        warnings."""
        out: dict[str, object] = dict(self.model.to_json()) if self.model is not None else {}
        out["shapes"] = [{"batch": b, "num_steps": k, "rounds": int(n), "mean_ms": round(s / n * 1e3, 3),
                          "mean_context": round(c / n, 1),
                          "predicted_ms": round(self.model.predict_ms(b, k, c / n), 3) if self.model else None}
                         for (b, k), (n, s, c) in sorted(dict(self.shapes).items()) if n]  # a copy: the engine adds
        out["warnings"] = list(self.warnings)
        return out
