"""Fit SpecServe's step-time model (:class:`~spectune.backends.num_steps.step_time.StepTimeModel`) on this machine.

A start-up pass over the engine's own forwards, the way a round runs them (:meth:`~spectune.backends.local.engine.
speculative.SpeculativeDecoder.decode_round`: through captured graphs on CUDA): the target verify (tokens [b, r] at
positions s..s+r-1, with its logits) and the draft head (a draft step at r = 1 on the head's own feature, the draft
extend at r = n_max + 1 on target-sized features; each with the lm_head over the b rows' last position), at
b in {1, min(slots, 8)}, r in {1, n_max + 1}, s in {5, about 256}: 8 forwards of each, the fastest of
:data:`REPS` timed calls after one untimed (another process on the machine only adds time). N_b = b * r and
N_c = b * (r * s + r(r-1)/2) (:func:`~spectune.backends.num_steps.step_time.verify_tokens`); each model's
(alpha, gamma, delta) is the least-squares fit over its 8 (:meth:`~spectune.backends.num_steps.step_time.
ForwardCost.fit`). The forwards write into empty cache slots at start-up (a later prefill overwrites them).

The engine's :class:`~spectune.backends.local.engine.step_model.StepModel` cannot serve instead: it exists on CPU
only and models a kernel's time per row count, not Eq. 2's linear terms, and it times the head at one row only.

The fit is kept per machine in ``$SPECTUNE_CACHE_DIR/engine-paths.json`` beside the compute-path probes
(:func:`~spectune.backends.local.weights.compute_paths.probe_cache_file`; delete it to measure again), under a key of
the CPU (or GPU), torch, the target's and head's shapes, dtype, threads and the plan of forwards.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

import torch

from spectune.backends.num_steps.step_time import ForwardCost, StepTimeModel, verify_tokens

if TYPE_CHECKING:
    from spectune.backends.local.engine.speculative import SpeculativeDecoder

log = logging.getLogger("spectune.engine")

PROBE = "specserve:step-time:v1"
"""The calibration's name in its cache key: a new name when what it measures changes."""
REPS = 3
"""Timed calls per forward shape (the fastest kept)."""
DEEP_POSITION = 256
"""The far start position of the forwards that separate alpha from gamma (lower when the cache is shorter)."""


def _best_ms(fn: Callable[[], object], device: torch.device, reps: int = REPS) -> float:
    """Fastest of ``reps`` timed calls of ``fn`` after one untimed, ms (synchronised on CUDA)."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def plan(decoder: SpeculativeDecoder, n_max: int) -> list[tuple[int, int, int]]:
    """The (batch, rows per sequence, start position) of each timed forward (see the module docstring)."""
    batches = sorted({1, min(decoder.target_cache.num_slots, 8)})
    deep = max(6, min(DEEP_POSITION, decoder.target_cache.max_len - n_max - 2))
    return [(b, r, s) for b in batches for r in sorted({1, n_max + 1}) for s in (5, deep)]


def measure(decoder: SpeculativeDecoder, n_max: int) -> dict[str, list[list[float]]]:
    """Time the plan's target and head forwards: ``{"target": [[N_c, N_b, ms], ...], "draft": [...]}``."""
    dev, head = decoder.device, decoder.head
    out: dict[str, list[list[float]]] = {"target": [], "draft": []}
    with torch.inference_mode():
        for b, r, s in plan(decoder, n_max):
            tokens = torch.zeros(b, r, dtype=torch.long, device=dev)
            pos = s + torch.arange(r, device=dev).repeat(b, 1)  # [b, r]
            n_c, n_b = verify_tokens(b * s, b, r)

            def target() -> object:
                hidden, _ = decoder._run("target", decoder._target_fwd, tokens, pos)
                return decoder.target.logits(hidden)
            out["target"].append([float(n_c), float(n_b), _best_ms(target, dev)])
            if head is None:
                continue
            dim = head.cfg.hidden_size if r == 1 else head.feature_dim  # a draft step's own feature, or the extend's
            feats = torch.zeros(b, r, dim, dtype=decoder.draft_feature.dtype, device=dev)

            def draft() -> object:
                feat = decoder._run("draft" if r == 1 else "extend", decoder._draft_fwd, tokens, pos, feats)
                return head.draft_with_prob(feat[:, -1])
            out["draft"].append([float(n_c), float(n_b), _best_ms(draft, dev)])
    return out


def cache_key(decoder: SpeculativeDecoder, n_max: int) -> str:
    """What the fit depends on (see the module docstring)."""
    from spectune.backends.local.weights.compute_paths import _probe_key

    head = decoder.head
    parts = [PROBE, str(decoder.target_cache.k.dtype), f"threads={torch.get_num_threads()}",
             f"plan={plan(decoder, n_max)}", f"graphs={decoder.graphs is not None}",
             torch.cuda.get_device_name(decoder.device) if decoder.device.type == "cuda" else "cpu",
             "head=none" if head is None else f"head={head.cfg.kind},{head.cfg.hidden_size},{head.feature_dim},"
                                              f"{head.cfg.num_layers},{head.cfg.draft_vocab_size}"]
    return _probe_key(parts, decoder.target.cfg, 1)


def step_time_model(decoder: SpeculativeDecoder, n_max: int) -> tuple[StepTimeModel, dict[str, object]]:
    """This machine's :class:`StepTimeModel` for ``decoder`` (kept per machine; measured now when absent) and a
    record of where it came from for ``/server_info`` (``{"calibration": "kept" | "measured", "measured_s": ...,
    "samples": {...}}``).

    Raises:
        ValueError: the decoder has no draft head (SpecServe drafts).
    """
    from spectune.backends.local.weights.compute_paths import _cached_estimates, _store_estimates

    if decoder.head is None:
        raise ValueError("the specserve strategy needs a draft head")
    key = cache_key(decoder, n_max)
    kept = _cached_estimates(key)
    if isinstance(kept, dict):
        try:
            samples = {"target": kept["target"], "draft": kept["draft"]}
            model = StepTimeModel(ForwardCost.fit(samples["draft"]), ForwardCost.fit(samples["target"]))
            return model, {"calibration": "kept", "samples": samples}
        except (KeyError, TypeError, ValueError):
            pass  # an unreadable entry: measure again
    start = time.perf_counter()
    samples = measure(decoder, n_max)
    seconds = time.perf_counter() - start
    model = StepTimeModel(ForwardCost.fit(samples["draft"]), ForwardCost.fit(samples["target"]))
    _store_estimates(key, {**samples, "model": model.to_json()})
    log.info("specserve step-time model (%.1f s): draft %s, target %s", seconds, model.draft.to_json(),
             model.target.to_json())
    return model, {"calibration": "measured", "measured_s": round(seconds, 3), "samples": samples}
