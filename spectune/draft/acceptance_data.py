"""Data for acceptance-prediction heads: the frozen EAGLE head's draft chain on self-distilled sequences, labelled
with the target's greedy tokens (SpecDec++ section 4.4, greedy case).

For a prompt + response sequence x_0..x_{L-1} whose response is the target's own greedy output, the head drafts at
every row t as the engine does (:mod:`spectune.backends.local.engine.speculative`): step 0 from the target's feature
f_t and token x_{t+1}, steps 1..n_max-1 from the head's own previous output feature
(:func:`spectune.draft.train.unroll`).
Step j drafts x_{t+j+2}; the draft is accepted when it equals that token, the target's greedy choice after the
context x_0..x_{t+j+1}. The head's step-j inputs (x_{t+j+1}) equal its own earlier drafts exactly when those were
accepted, so only steps whose earlier drafts all matched are kept: the labels estimate the conditional acceptance
probability SpecDec++ trains, and a step after the first mismatch (which the engine's verify would discard) is
left out. Rows start at the last prompt token: after prefill the target emits the first response token x_n and the
head's entry (x_n, f_{n-1}) drafts x_{n+1}, so labels cover the response from its second token on.

A sample is (the head's output feature at the step [H], the draft's confidence ``DraftHead.draft_with_prob``,
label, step, sequence index); :func:`build_samples` writes them to ``samples.pt`` in a data folder that also holds
the stored target features (:mod:`spectune.draft.features`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from spectune.draft.data import chat_records, heldout_sharegpt

if TYPE_CHECKING:
    from spectune.backends.local.engine.tokenizer import Tokenizer
    from spectune.backends.local.model.eagle import DraftHead
    from spectune.backends.local.model.target import TargetModel
    from spectune.draft.features import FeatureStore

SAMPLES_FILE = "samples.pt"


def conditional_labels(matches: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and kept steps of draft chains.

    Args:
        matches: [T, n] bool, step j's draft at row t equals the target's token.
        valid: [T, n] bool, step j at row t has a label (its position lies in the response).

    Returns:
        labels [T, n] bool (== ``matches``) and keep [T, n] bool: valid and every earlier step of the row matched.
    """
    before = torch.ones_like(matches)
    before[:, 1:] = torch.cumprod(matches.int(), dim=1)[:, :-1].bool()
    return matches.clone(), before & valid


@torch.inference_mode()
def chain_samples(head: DraftHead, embed: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor, prompt_len: int,
                  n_max: int, rope: torch.Tensor) -> dict[str, torch.Tensor]:
    """The head's draft chain over one sequence, kept steps only.

    Args:
        head: the frozen EAGLE-3 :class:`~spectune.backends.local.model.eagle.DraftHead` (``prepare``d).
        embed: the target's embedding matrix [V, H].
        tokens: [L] long; feats: [L, 3H] the target's features of the sequence; prompt_len: prompt tokens.
        n_max: draft steps per round.
        rope: [>= L + n_max, 2, head_dim] RoPE rows in the head's dtype.

    Returns:
        ``feature`` [N, H] (head dtype), ``prob`` [N] float32, ``label`` [N] bool, ``step`` [N] int8, ``pos`` [N]
        int32 (the row t), for the N kept steps, ordered by step then row.
    """
    from spectune.draft.train import unroll

    L = len(tokens)
    first = max(prompt_len - 1, 0)  # step 0 at row n-1 drafts x_{n+1}: the engine's first draft after prefill
    rows = torch.arange(first, max(L - 2, first))
    dt = head.fc.weight.dtype
    if len(rows) == 0:
        return _empty(head.cfg.hidden_size, dt)
    h0 = head.fc(feats[None, :-1].to(dt))
    emb = F.embedding(tokens[None], embed.to(dt))
    outs, probs, matches, valid = [], [], [], []
    for j, h in enumerate(unroll(head, emb, h0, rope, n_max)):
        label_pos = rows + j + 2
        ok = label_pos < L
        out = h[0, rows]  # [T, H]
        draft, prob = head.draft_with_prob(out)
        matches.append((draft == tokens[label_pos.clamp_max(L - 1)]) & ok)
        valid.append(ok)
        outs.append(out)
        probs.append(prob)
    labels, keep = conditional_labels(torch.stack(matches, 1), torch.stack(valid, 1))  # [T, n]
    sel = keep.T  # [n, T]: step-major
    return {"feature": torch.stack(outs)[sel], "prob": torch.stack(probs)[sel].float(), "label": labels.T[sel],
            "step": torch.arange(n_max).view(-1, 1).expand_as(sel)[sel].to(torch.int8),
            "pos": rows.view(1, -1).expand_as(sel)[sel].to(torch.int32)}


def _empty(hidden: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {"feature": torch.zeros(0, hidden, dtype=dtype), "prob": torch.zeros(0), "label": torch.zeros(0, dtype=bool),
            "step": torch.zeros(0, dtype=torch.int8), "pos": torch.zeros(0, dtype=torch.int32)}


def build_samples(head: DraftHead, target: TargetModel, store: FeatureStore, n_max: int, out: Path,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, torch.Tensor]:
    """Chain samples of every stored sequence (:class:`~spectune.draft.features.FeatureStore`), written to ``out``
    (``torch.save`` of the dict of :func:`chain_samples` plus ``seq`` [N] int32, the sequence index); returns it."""
    from spectune.backends.local.model.rope import rope_table

    c = head.cfg
    longest = max((s[1] for s in store.seqs), default=0)
    rope = rope_table(c.head_dim, c.rope_theta, c.rope_scaling, longest + n_max + 2, head.fc.weight.dtype)
    embed = target.embed_tokens.weight.detach()
    parts = []
    for i in range(len(store)):
        toks, feats, prompt_len = store[i]
        part = chain_samples(head, embed, toks, feats, prompt_len, n_max, rope)
        part["seq"] = torch.full((len(part["prob"]),), i, dtype=torch.int32)
        parts.append(part)
        if progress is not None and ((i + 1) % 50 == 0 or i + 1 == len(store)):
            progress(i + 1, len(store))
    samples = {k: torch.cat([p[k] for p in parts]) for k in parts[0]} if parts else \
        {**_empty(c.hidden_size, head.fc.weight.dtype), "seq": torch.zeros(0, dtype=torch.int32)}
    tmp = out.with_suffix(".tmp")
    torch.save(samples, tmp)
    tmp.replace(out)
    return samples


def acceptance_prompts(tokenizer: Tokenizer, head_dir: Path, limit: int, max_prompt_tokens: int, exclude: set[str],
                       seed: int) -> list[dict]:
    """ShareGPT first turns the EAGLE head in ``head_dir`` was not trained on (:func:`spectune.draft.data.
    heldout_sharegpt`), evaluation prompts (``exclude``, normalised) and repeats removed, at most
    ``max_prompt_tokens`` with the chat template: ``limit`` ``{"id", "prompt_ids"}`` records, seeded.

    Why held out: on its own training sequences the EAGLE head drafts better than it does in service, so labels
    from them would teach an over-confident acceptance head.

    Raises:
        UserError: the head folder lists no training prompts (from :func:`heldout_sharegpt`).
    """
    return chat_records(heldout_sharegpt(head_dir, 10**7, seed), tokenizer, max_prompt_tokens, exclude, limit)


def evaluation_prompts(tokenizer: Tokenizer, dataset: str, limit: int, max_prompt_tokens: int, seed: int) -> list[dict]:
    """``limit`` prompts of ``dataset`` (a :func:`spectune.loadgen.datasets.load_dataset` spec, e.g.
    ``spec-bench:PATH``), seeded, distinct, each at most ``max_prompt_tokens`` with the chat template, as
    ``{"id", "category", "prompt_ids"}`` records."""
    from spectune.loadgen.datasets import load_dataset

    records = load_dataset(dataset, 10**5, seed=0)
    unique = list({p.id: p for p in records}.values())
    random.Random(seed).shuffle(unique)
    out = []
    for p in unique:
        ids = tokenizer.encode_chat(p.messages)
        if len(ids) <= max_prompt_tokens:
            out.append({"id": p.id, "category": p.category, "prompt_ids": ids})
            if len(out) >= limit:
                break
    return out
