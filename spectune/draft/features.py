"""Target features for draft training, computed once and stored as memory-mapped arrays.

For every (prompt + response) sequence the target runs one prefill in the serving dtype and keeps the feature the
head consumes at each position: the outputs of the captured layers, concatenated (EAGLE-3, [3H]), or the final
normed hidden state (EAGLE-1, [H]). Files in the data folder:

- ``tokens.bin`` int32 [N]: all sequences' tokens back to back;
- ``features.bin`` bf16 bits (uint16) [N, F];
- ``index.json``: ``{"feature_dim", "sequences": [[offset, length, prompt_len], ...]}``, rewritten per chunk so an
  interrupted run resumes after the last complete chunk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from spectune.backends.local.model.attention import AttnMeta
from spectune.backends.local.model.kv_cache import KVCache
from spectune.core.json_types import JsonObject

if TYPE_CHECKING:
    from spectune.backends.local.model.target import TargetModel


def _index(folder: Path) -> JsonObject:
    path = folder / "index.json"
    return json.loads(path.read_text()) if path.is_file() else {"feature_dim": None, "sequences": []}


@torch.inference_mode()
def extract_features(target: TargetModel, rows: list[dict], folder: Path, max_len: int, chunk: int = 64,
                     progress: Callable[[int, int], None] | None = None) -> JsonObject:
    """Append features for ``rows`` (``prompt_ids`` + ``output_ids``) not yet stored; returns the index.

    Sequences are cut at ``max_len`` tokens. ``target.capture_layers`` decides EAGLE-3 (captured layers) vs EAGLE-1
    (final hidden) features.
    """
    index = _index(folder)
    done = len(index["sequences"])
    c = target.cfg
    dtype = target.embed_tokens.weight.dtype
    cache = KVCache(c.num_layers, 1, max_len, c.num_kv_heads, c.head_dim, dtype)
    for name in ("tokens.bin", "features.bin"):
        (folder / name).touch()
    offset = sum(s[1] for s in index["sequences"])
    with open(folder / "tokens.bin", "r+b") as ftok, open(folder / "features.bin", "r+b") as ffeat:
        ftok.truncate(offset * 4)  # drop a torn chunk from an interrupted run
        ftok.seek(offset * 4)
        ffeat.truncate(offset * 2 * (index["feature_dim"] or 0))
        ffeat.seek(offset * 2 * (index["feature_dim"] or 0))
        for i in range(done, len(rows)):
            row = rows[i]
            ids = (row["prompt_ids"] + row["output_ids"])[:max_len]
            tokens = torch.tensor([ids], dtype=torch.long)
            hidden, aux = target(tokens, AttnMeta.for_prefill(cache, target.rope, 0, len(ids)))
            feats = (aux if aux is not None else hidden)[0].to(torch.bfloat16)  # [n, F]
            index["feature_dim"] = feats.shape[-1]
            ffeat.write(feats.view(torch.int16).numpy().tobytes())
            ftok.write(np.asarray(ids, dtype=np.int32).tobytes())
            index["sequences"].append([offset, len(ids), min(len(row["prompt_ids"]), len(ids))])
            offset += len(ids)
            if (i + 1) % chunk == 0 or i + 1 == len(rows):
                ftok.flush()
                ffeat.flush()
                (folder / "index.json.tmp").write_text(json.dumps(index))
                (folder / "index.json.tmp").replace(folder / "index.json")
                if progress is not None:
                    progress(i + 1, len(rows))
    return index


class FeatureStore:
    """Read-only view of stored features: ``store[i]`` -> (tokens [n] long, features [n, F] bf16, prompt_len)."""

    def __init__(self, folder: Path) -> None:
        self.index = _index(folder)
        self.dim = int(self.index["feature_dim"])
        self.seqs = self.index["sequences"]
        n = sum(s[1] for s in self.seqs)
        self.tokens = np.memmap(folder / "tokens.bin", dtype=np.int32, mode="r", shape=(n,))
        self.features = np.memmap(folder / "features.bin", dtype=np.int16, mode="r", shape=(n, self.dim))

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        off, n, p = self.seqs[i]
        toks = torch.from_numpy(np.array(self.tokens[off : off + n], dtype=np.int64))
        feats = torch.from_numpy(np.array(self.features[off : off + n])).view(torch.bfloat16)
        return toks, feats, p
