"""Train an EAGLE-3 head with training-time test (Li et al., "EAGLE-3", 2025, §3.2), on CPU or CUDA.

Why EAGLE-3 for spectune's bundled head: (1) the head's own lm_head over a reduced draft vocabulary (d2t) keeps a
draft step at a few percent of a target step (SmolLM2's 49152x576 lm_head alone is a fifth of the target's
weights); (2) features from three target layers carry more than the last hidden state; (3) training-time test
trains later draft steps on the head's own features, as inference feeds them, which keeps acceptance rising with
num_steps. SGLang and vLLM load this layout (``midlayer.*``, ``d2t``, ``draft_vocab_size``).

Training-time test, restated: step 0 sees (token x_{t+1}, target feature f_t) at position t and predicts x_{t+2};
step j sees (x_{t+j+1}, the head's step j-1 output at row t) at position t+j and predicts x_{t+j+2}. Step j's query
at row t attends to step 0's keys at rows <= t (real entries) and to the keys of steps 1..j at row t itself (the
chain's own drafts) -- the causal-plus-diagonal pattern of EAGLE-3's training code. Inputs are ground-truth tokens,
because a draft step only matters when all earlier drafts were accepted. The loss is cross-entropy on response
tokens (labels inside the draft vocabulary), weighted 0.8^j over steps.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import torch
import torch.nn.functional as F

from spectune.backends.local.model.eagle import DraftConfig, DraftHead
from spectune.backends.local.model.rope import rope_table
from spectune.core.json_types import JsonObject
from spectune.draft.schedule import warmup_cosine

if TYPE_CHECKING:
    from spectune.backends.local.model.target import TargetModel
    from spectune.draft.features import FeatureStore


@dataclass
class TrainConfig:
    """Hyper-parameters (defaults are what shipped the bundled SmolLM2 head).

    Attributes:
        draft_vocab_size: rows of the head's lm_head: the most frequent response tokens.
        ttt_steps: unrolled draft steps per position (training-time test depth).
        step_decay: loss weight of step j is step_decay**j.
        epochs, lr, warmup_steps, weight_decay, grad_clip: optimisation (AdamW, linear warmup, cosine decay).
        batch_tokens: padded tokens per batch (sequences of similar length are grouped).
        max_len: tokens per sequence at most.
        val_fraction: sequences held out for validation accuracy.
        seed: shuffling and initialisation.
    """

    draft_vocab_size: int = 8192
    ttt_steps: int = 3
    step_decay: float = 0.8
    epochs: int = 3
    lr: float = 5e-4
    warmup_steps: int = 100
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    batch_tokens: int = 4096
    max_len: int = 640
    val_fraction: float = 0.02
    seed: int = 0


def draft_vocab(store: FeatureStore, size: int, vocab: int) -> torch.Tensor:
    """The ``size`` most frequent response tokens, sorted by id (EAGLE-3's d2t order): [size] long."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for i in range(len(store)):
        toks, _, p = store[i]
        counts += torch.bincount(toks[p:], minlength=vocab)
    return counts.topk(size).indices.sort().values


def new_head(target: TargetModel, vocab_ids: torch.Tensor, aux_layers: tuple[int, ...], seed: int) -> DraftHead:
    """A fresh fp32 EAGLE-3 head shaped like one target layer; lm_head and norm start from the target's rows."""
    c = target.cfg
    cfg = DraftConfig(kind="eagle3", hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                      vocab_size=c.vocab_size, draft_vocab_size=len(vocab_ids), target_hidden_size=c.hidden_size,
                      rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
                      aux_layers=aux_layers)
    torch.manual_seed(seed)
    head = DraftHead(cfg, target.embed_tokens, target.lm_head).float()
    for name, p in head.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight[vocab_ids].float())
        head.norm.copy_(target.norm.float())
        head.d2t.copy_(vocab_ids - torch.arange(len(vocab_ids)))
    return head


def unroll(head: DraftHead, emb: torch.Tensor, h: torch.Tensor, rope: torch.Tensor, steps: int
           ) -> Iterator[torch.Tensor]:
    """The head's chain of ``steps`` draft steps at every row of a padded batch, as the engine drafts it.

    Step 0 at row t reads (x_{t+1}, ``h``[t]); step j reads (x_{t+j+1}, step j-1's output at row t) at position t+j.
    Step j's query at row t attends to step 0's keys at rows <= t and to the keys of steps 1..j at row t itself
    (the causal-plus-diagonal pattern of EAGLE-3's training code), which is what the engine's KV cache holds when
    the chain's earlier drafts were x_{t+2}..x_{t+j+1} (:mod:`spectune.backends.local.engine.speculative`).

    Args:
        emb: [B, L, H] embeddings of the tokens x_0..x_{L-1}.
        h: [B, T, H] step 0's input feature per row t = 0..T-1 (T = L - 1): ``head.fc`` of the target feature f_t.
        rope: [>= T + steps, 2, head_dim] RoPE rows.

    Yields:
        per step j, the head's output feature [B, T, H] (pre-norm: ``head.logits`` turns it into the draft of
        x_{t+j+2}; zero token embeddings past the end of the batch's rows).
    """
    c = head.cfg
    b, t = h.shape[:2]
    hd, nh, nkv = c.head_dim, c.num_heads, c.num_kv_heads
    layer = head.layers[0]
    rows = torch.arange(t)
    keys, values = [], []
    causal = rows.view(1, t) <= rows.view(t, 1)  # [T, T] key s visible to query t
    for j in range(steps):
        emb_j = F.pad(emb[:, 1 + j :], (0, 0, 0, j))[:, :t]  # x_{t+j+1}, zero past the end
        residual, y = layer.inputs(h, emb_j)  # the engine's own layer code (backends/local/model/eagle.py)
        q, k, v = layer.qkv_rope(y, rope[rows + j].unsqueeze(0))  # [B, T, nh|nkv, hd]
        q = q.transpose(1, 2)  # [B, nh, T, hd]
        keys.append(k.repeat_interleave(nh // nkv, dim=2).transpose(1, 2))
        values.append(v.repeat_interleave(nh // nkv, dim=2).transpose(1, 2))
        scale = hd**-0.5
        main = (q @ keys[0].transpose(-1, -2)) * scale  # [B, nh, T, T]
        main = main.masked_fill(~causal, float("-inf"))
        diag = [((q * keys[i]).sum(-1) * scale).unsqueeze(-1) for i in range(1, j + 1)]  # [B, nh, T, 1] each
        probs = torch.cat([main, *diag], dim=-1).float().softmax(-1).to(q.dtype)
        out = probs[..., :t] @ values[0]
        for i in range(1, j + 1):
            out = out + probs[..., t + i - 1 : t + i] * values[i]
        h = layer.output(residual, out.transpose(1, 2).reshape(b, t, nh * hd))  # pre-norm: the next step's feature
        yield h


def ttt_loss(head: DraftHead, embed: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor, lengths: torch.Tensor,
             prompt_lens: torch.Tensor, t2d: torch.Tensor, rope: torch.Tensor, steps: int, decay: float
             ) -> tuple[torch.Tensor, list[float], list[int]]:
    """Training-time-test loss of one padded batch (the chain of :func:`unroll`).

    Args:
        embed: the target's embedding matrix [V, H] (frozen).
        tokens: [B, L] token ids; feats: [B, L, 3H] target features; lengths, prompt_lens: [B].
        t2d: [V] target id -> draft id, -1 outside the draft vocabulary.
        rope: [>= L + steps, 2, head_dim] RoPE rows.

    Returns:
        the weighted loss, top-1 accuracy per step, and labelled tokens per step.
    """
    c = head.cfg
    b, L = tokens.shape
    t = L - 1  # rows t = 0..L-2 (step 0 needs x_{t+1})
    rows = torch.arange(t)
    total, accs, counts = feats.new_zeros(()), [], []
    for j, h in enumerate(unroll(head, F.embedding(tokens, embed), head.fc(feats[:, :-1]), rope, steps)):
        label_pos = rows + j + 2  # [T]
        target_ids = tokens.gather(1, label_pos.clamp_max(L - 1).expand(b, t))
        labels = t2d[target_ids]
        mask = (label_pos.view(1, t) < lengths.view(b, 1)) & (label_pos.view(1, t) >= prompt_lens.view(b, 1)) & \
               (labels >= 0)
        n = int(mask.sum())
        counts.append(n)
        if n == 0:
            accs.append(0.0)
            continue
        logits = head.lm_head(F.rms_norm(h[mask], (c.hidden_size,), head.norm, c.rms_norm_eps)).float()
        total = total + decay**j * F.cross_entropy(logits, labels[mask])
        accs.append(float((logits.argmax(-1) == labels[mask]).float().mean()))
    return total, accs, counts


def batches(store: FeatureStore, ids: list[int], batch_tokens: int, max_len: int,
            rng: random.Random) -> list[list[int]]:
    """Group sequences of similar length so each padded batch holds about ``batch_tokens`` tokens; shuffled."""
    order = sorted(ids, key=lambda i: min(store.seqs[i][1], max_len))
    out, cur = [], []
    for i in order:
        n = min(store.seqs[i][1], max_len)
        if cur and n * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(store: FeatureStore, ids: list[int], max_len: int) -> tuple[torch.Tensor, ...]:
    """Pad a batch: tokens [B, L], feats [B, L, F] (float32), lengths [B], prompt_lens [B]."""
    items = [store[i] for i in ids]
    L = max(min(len(t), max_len) for t, _, _ in items)
    tokens = torch.zeros(len(items), L, dtype=torch.long)
    feats = torch.zeros(len(items), L, store.dim)
    lengths, prompts = [], []
    for r, (t, f, p) in enumerate(items):
        n = min(len(t), max_len)
        tokens[r, :n], feats[r, :n] = t[:n], f[:n].float()
        lengths.append(n)
        prompts.append(min(p, n))
    return tokens, feats, torch.tensor(lengths), torch.tensor(prompts)


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warmup then cosine decay to 10% of ``cfg.lr`` (:func:`spectune.draft.schedule.warmup_cosine`)."""
    return warmup_cosine(step, total, cfg.lr, cfg.warmup_steps, floor=0.1)


def train(target: TargetModel, store: FeatureStore, cfg: TrainConfig, ckpt: Path,
          log: Callable[[JsonObject], None] = lambda _: None) -> DraftHead:
    """Train (resuming from ``ckpt`` if it exists) and return the head; checkpoints after every 50 steps."""
    rng = random.Random(cfg.seed)
    ids = list(range(len(store)))
    rng.shuffle(ids)
    n_val = max(1, int(len(ids) * cfg.val_fraction))
    val_ids, train_ids = ids[:n_val], ids[n_val:]
    state = torch.load(ckpt, weights_only=False) if ckpt.is_file() else None
    vocab_ids = state["vocab_ids"] if state else draft_vocab(store, cfg.draft_vocab_size, target.cfg.vocab_size)
    head = new_head(target, vocab_ids, target.capture_layers, cfg.seed)
    t2d = torch.full((target.cfg.vocab_size,), -1, dtype=torch.long)
    t2d[vocab_ids] = torch.arange(len(vocab_ids))
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    step, epoch0, done_in_epoch = 0, 0, 0
    if state:
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        step, epoch0, done_in_epoch = state["step"], state["epoch"], state["done_in_epoch"]
    embed = target.embed_tokens.weight.detach().float()
    rope = rope_table(
        head.cfg.head_dim, head.cfg.rope_theta, head.cfg.rope_scaling, cfg.max_len + cfg.ttt_steps + 2, torch.float32)
    per_epoch = [batches(store, train_ids, cfg.batch_tokens, cfg.max_len, random.Random(cfg.seed + e))
                 for e in range(cfg.epochs)]
    total_steps = sum(len(b) for b in per_epoch)
    for epoch in range(epoch0, cfg.epochs):
        for bi, batch in enumerate(per_epoch[epoch]):
            if epoch == epoch0 and bi < done_in_epoch:
                continue
            tokens, feats, lengths, prompts = collate(store, batch, cfg.max_len)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total_steps, cfg)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=tokens.device.type == "cpu"):
                loss, accs, counts = ttt_loss(head, embed, tokens, feats, lengths, prompts, t2d, rope,
                                              cfg.ttt_steps, cfg.step_decay)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            step += 1
            log({"epoch": epoch, "step": step, "total_steps": total_steps, "loss": loss.item(), "acc": accs,
                 "tokens": counts[0], "lr": opt.param_groups[0]["lr"]})
            if step % 50 == 0 or bi + 1 == len(per_epoch[epoch]):
                _save(ckpt, head, opt, vocab_ids, step, epoch if bi + 1 < len(per_epoch[epoch]) else epoch + 1,
                      0 if bi + 1 == len(per_epoch[epoch]) else bi + 1, cfg)
        log({"epoch": epoch, "val_acc": evaluate(head, store, val_ids, embed, t2d, rope, cfg)})
    return head


@torch.no_grad()
def evaluate(head: DraftHead, store: FeatureStore, ids: list[int], embed: torch.Tensor, t2d: torch.Tensor,
             rope: torch.Tensor, cfg: TrainConfig) -> list[float]:
    """Token-weighted top-1 accuracy per draft step on held-out sequences."""
    hits, total = [0.0] * cfg.ttt_steps, [0] * cfg.ttt_steps
    for batch in batches(store, ids, cfg.batch_tokens, cfg.max_len, random.Random(0)):
        tokens, feats, lengths, prompts = collate(store, batch, cfg.max_len)
        _, accs, counts = ttt_loss(head, embed, tokens, feats, lengths, prompts, t2d, rope, cfg.ttt_steps,
                                   cfg.step_decay)
        for j in range(cfg.ttt_steps):
            hits[j] += accs[j] * counts[j]
            total[j] += counts[j]
    return [h / n if n else 0.0 for h, n in zip(hits, total)]


def _save(path: Path, head: DraftHead, opt: torch.optim.Optimizer, vocab_ids: torch.Tensor, step: int, epoch: int,
          done: int, cfg: TrainConfig) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "vocab_ids": vocab_ids, "step": step,
                "epoch": epoch, "done_in_epoch": done, "config": asdict(cfg)}, tmp)
    tmp.replace(path)
