"""The native path's dense-copy row count chosen on the whole target forward of the built model.

:func:`~spectune.backends.local.weights.kernel_probes.dense_crossover` times one gate|up-shaped layer; near the
crossover that leaves out everything between the linears and the model's other shapes, and its answer moves between
runs. So after quantizing, before compiling, the engine times its own target forward with each kernel
(:func:`whole_step_crossover`) and takes the copy's row count from that (:func:`choose_dense_on_whole_step`, called by
:func:`spectune.backends.local.build.build_engine` for ``--native-dense-above auto``). docs/engine.md has the timings.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, TypedDict

from torch import nn

from spectune.backends.local.weights.compute_paths import PathChoice, _measured, _probe_key
from spectune.backends.local.weights.kernel_probes import _best_ms

if TYPE_CHECKING:
    from spectune.backends.local.model.config import ModelConfig

log = logging.getLogger("spectune.engine")

WHOLE_STEP_ROWS = (2, 4, 8, 16, 32)
"""Row counts at which :func:`whole_step_crossover` times the whole target forward with each kernel."""
COPY_MARGIN = 1.05
"""The copy wins at a row count only when the int4 forward takes at least this many times as long: a near tie keeps
int4, which reads a quarter of the bytes (a copy 1.7% ahead at 8 rows, within the machine's drift between runs, put
it above 4 rows, where batch 4's first draft then cost 2.5x its num_steps 0 round: docs/engine.md)."""
WHOLE_STEP_PROBE = "native:dense-whole-step"
""":func:`whole_step_crossover`'s name in its cache key (:func:`_probe_key`)."""


class WholeStepCrossover(TypedDict):
    """:func:`whole_step_crossover`'s result (kept in :func:`probe_cache_file`)."""

    dense_above_rows: int | None
    rows_ms: dict[str, dict[str, float]]


def whole_step_crossover(forward: Callable[[int], Callable[[], object]], layers: list[nn.Module], kind: str,
                         layer_answer: int | None, reps: int = 5) -> WholeStepCrossover:
    """The row count above which the native path's dense copy (``kind``) beats the int4 kernel on the whole target
    forward, timed on the model itself: ``forward(rows)`` gives a call running one target forward (with its logits)
    of one sequence over ``rows`` query tokens, and every layer of ``layers`` (the target's native linears, each holding
    a dense copy) is switched to one kernel for all rows (``dense_above`` very large, or 0) while that forward is timed
    at 1 row and each of :data:`WHOLE_STEP_ROWS` (fastest of ``reps``, eager, one thread as the caller's
    :func:`_measured` runs it; about 2 s for SmolLM2-135M). Every weight is read from memory as in decoding, with the
    model's own shapes and everything between the linears, which one layer's probe leaves out: on the machine
    docs/engine.md names, the gate|up layer streamed timed int4 and the bf16 copy alike at 16 rows (0.566 and 0.589
    ms) while batch-16 decode ran 218 tokens/s on the copy and 197 on int4 (``benchmarks/engine_speed.py``).

    The answer is the probed count below the first from which the copy wins (by :data:`COPY_MARGIN`) at every larger
    count (1 when it wins from 2 rows); when it does not win even at the largest count, the layer probe's
    ``layer_answer`` where that is larger (many rows are compute-bound, which the layer probe measures well), else the
    largest count; None when the layer probe found no crossover either. ``layers`` get their ``dense_above`` back
    afterwards.
    """
    rows_ms: dict[str, dict[str, float]] = {"int4": {}, kind: {}}
    saved = [m.dense_above for m in layers]
    try:
        for rows in (1, *WHOLE_STEP_ROWS):
            run = forward(rows)
            for name, above in (("int4", 1 << 30), (kind, 0)):
                for m in layers:
                    m.dense_above = above
                rows_ms[name][str(rows)] = round(_best_ms(run, reps), 3)
    finally:
        for m, above in zip(layers, saved):
            m.dense_above = above
    wins = [rows_ms["int4"][str(r)] > COPY_MARGIN * rows_ms[kind][str(r)] for r in WHOLE_STEP_ROWS]
    first = next((i for i in range(len(wins)) if all(wins[i:])), None)
    if first is None:
        above = None if layer_answer is None else max(layer_answer, WHOLE_STEP_ROWS[-1])
    else:
        above = WHOLE_STEP_ROWS[first - 1] if first > 0 else 1
    return {"dense_above_rows": above, "rows_ms": rows_ms}


def choose_dense_on_whole_step(choice: PathChoice, cfg: ModelConfig, lm_repeat: int, layers: list[nn.Module],
                               forward: Callable[[int], Callable[[], object]], kernels: str = "") -> None:
    """Set ``choice.dense_above`` (and every layer of ``layers``) from :func:`whole_step_crossover` on the built model,
    kept per machine like the other probes (``kernels`` names the forward's own kernels in the cache key, e.g.
    ``spectune-q4i16``: spectune's CPU kernels change what a forward costs); a layer whose copy is then never used
    drops it. Only for the native path with a measured (``auto``) row count and a dense copy; does nothing
    otherwise."""
    if choice.name != "native" or choice.dense_above is None or not layers:
        return
    kind = choice.dense_dtype or "float32"
    layer_answer = choice.dense_above
    key = _probe_key([WHOLE_STEP_PROBE, kind] + ([kernels] if kernels else []), cfg, lm_repeat)
    probe = _measured(key, lambda: whole_step_crossover(forward, layers, kind, layer_answer))
    choice.dense_above = probe["dense_above_rows"]
    choice.whole_step_ms = probe["rows_ms"]
    for m in layers:
        m.dense_above = choice.dense_above
        if choice.dense_above is None:
            m.dense = m.dense_bias = None
    if choice.dense_above is None:
        choice.dense_dtype = None
    log.info("dense copy above %s rows on the whole step (one layer's probe: above %s; target forward ms, int4 / %s: "
             "%s)", choice.dense_above, layer_answer, kind,
             ", ".join(f"{r} rows {probe['rows_ms']['int4'][r]:.1f}/{probe['rows_ms'][kind][r]:.1f}"
                       for r in probe["rows_ms"]["int4"]))
