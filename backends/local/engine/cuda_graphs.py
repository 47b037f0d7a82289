"""Captured forwards for decode-shaped batches, as SGLang's CUDA-graph runner (``CudaGraphRunner``) captures them.

A decode round runs three kinds of forwards whose shapes depend only on (batch, tokens per sequence, visible cache
length): the target verify ([B, K+1]), draft steps ([B, 1]) and the draft extend ([B, K+1]). :class:`CapturedGraphs`
pads the batch up to a captured size and the cache length up to a power-of-two bucket, captures each shape once with
``torch.cuda.graph`` (a shared memory pool), and replays it; every candidate num_steps therefore owns its graphs and
switching num_steps between rounds is a dictionary lookup. Padded rows use free cache slots at position 0, whose
contents are rewritten when a sequence is admitted there.

With ``capture=False`` (CPU, or CUDA with graphs disabled) the same padding and bucketing run eagerly, which is
what the CPU tests exercise.
"""

from __future__ import annotations

import bisect
from typing import Callable

import torch

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, int], torch.Tensor | tuple]


class CapturedGraphs:
    """Runs ``forward(tokens [Bp, q], positions [Bp, q], features [Bp, q, F] | None, kv_len)`` on static shapes.

    Args:
        num_slots: cache slots (the padded batch never exceeds it).
        max_len: cache positions per slot (the largest kv bucket).
        capture: capture CUDA graphs (True) or run eagerly with the same padding (False).
    """

    def __init__(self, num_slots: int, max_len: int, capture: bool) -> None:
        self.sizes = [b for b in GRAPH_BATCH_SIZES if b < num_slots] + [num_slots]
        self.max_len = max_len
        self.capture = capture
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple, object]] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def padded_batch(self, batch: int) -> int:
        """The smallest captured batch size >= ``batch``."""
        return self.sizes[bisect.bisect_left(self.sizes, batch)]

    def kv_bucket(self, kv_len: int) -> int:
        """Visible cache length rounded up to a power of two (at least 256), capped at the slot length."""
        return min(self.max_len, max(256, 1 << (kv_len - 1).bit_length()))

    def run(self, name: str, forward: Forward, tokens: torch.Tensor, positions: torch.Tensor,
            features: torch.Tensor | None) -> torch.Tensor | tuple:
        """Pad to a captured shape, run (replay) and return outputs trimmed back to the real batch."""
        b, q = tokens.shape
        bp = self.padded_batch(b)
        kv = self.kv_bucket(int(positions.max()) + 1)
        if bp != b:
            pad = bp - b
            tokens = torch.cat([tokens, tokens.new_zeros(pad, q)])
            positions = torch.cat([positions, positions.new_zeros(pad, q)])
            if features is not None:
                features = torch.cat([features, features.new_zeros(pad, *features.shape[1:])])
        if not self.capture:
            out = forward(tokens, positions, features, kv)
        else:
            out = self._replay((name, bp, q, kv, None if features is None else features.shape[-1]), forward,
                               tokens, positions, features, kv)
        return tuple(o[:b] if o is not None else None for o in out) if isinstance(out, tuple) else out[:b]

    def _replay(self, key: tuple, forward: Forward, tokens: torch.Tensor, positions: torch.Tensor,
                features: torch.Tensor | None, kv: int) -> torch.Tensor | tuple:
        if key not in self.graphs:
            static = (tokens.clone(), positions.clone(), None if features is None else features.clone())
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up outside the graph (allocator, kernels' lazy init)
                forward(*static, kv)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = forward(*static, kv)
            self.graphs[key] = (graph, static, out)
        graph, static, out = self.graphs[key]
        static[0].copy_(tokens)
        static[1].copy_(positions)
        if features is not None:
            static[2].copy_(features)
        graph.replay()
        return out
