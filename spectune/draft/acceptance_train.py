"""Train an acceptance-prediction head (SpecDec++, section 4.4) on chain samples
(:mod:`spectune.draft.acceptance_data`).

Loss: SpecDec++'s weighted binary cross-entropy, -[y log p + w_rej (1 - y) log(1 - p)] per kept draft step,
normalised by the summed weights, on the head's logit without its output offset
(:meth:`~spectune.backends.local.model.acceptance.AcceptanceHead.logit`). Sequences, not steps, are split into
training and validation, so validation never sees a row whose neighbours were trained on; the state with the lowest
validation loss is returned.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from spectune.backends.local.model.acceptance import AcceptanceHead, new_acceptance_head
from spectune.core.json_types import JsonObject
from spectune.draft.schedule import warmup_cosine


@dataclass
class AcceptanceTrainConfig:
    """Hyper-parameters (defaults are what shipped the bundled head).

    Attributes:
        n_max: draft steps per round unrolled for the data.
        width, num_layers: the head's residual width and depth (SpecDec++'s D).
        w_rej: loss weight of rejected drafts (accepted ones weigh 1).
        epochs, lr, batch_size, weight_decay: AdamW, 5% linear warm-up then cosine decay to 0.
        val_fraction: sequences held out for validation and model selection.
        seed: split, initialisation and batch order.
    """

    n_max: int = 4
    width: int = 256
    num_layers: int = 3
    w_rej: float = 3.0
    epochs: int = 10
    lr: float = 1e-3
    batch_size: int = 256
    weight_decay: float = 0.01
    val_fraction: float = 0.1
    seed: int = 0


def weighted_bce(logit: torch.Tensor, label: torch.Tensor, w_rej: float) -> torch.Tensor:
    """SpecDec++'s weighted BCE: logit [N], label [N] bool -> scalar, sum_i w_i BCE_i / sum_i w_i with w_i = 1 for an
    accepted draft and ``w_rej`` for a rejected one."""
    y = label.float()
    w = torch.where(label, 1.0, w_rej)
    return (w * F.binary_cross_entropy_with_logits(logit, y, reduction="none")).sum() / w.sum()


def split_sequences(seq: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample indices [N] into (train, validation) by sequence: a seeded ``fraction`` of the sequence ids (at least
    one when there are two or more) goes to validation with all its samples."""
    ids = sorted(set(seq.tolist()))
    random.Random(seed).shuffle(ids)
    n_val = max(1, int(len(ids) * fraction)) if len(ids) > 1 else 0
    val = torch.isin(seq, torch.tensor(ids[:n_val], dtype=seq.dtype))
    return torch.nonzero(~val)[:, 0], torch.nonzero(val)[:, 0]


@torch.no_grad()
def _val_loss(head: AcceptanceHead, samples: dict[str, torch.Tensor], idx: torch.Tensor, w_rej: float,
              batch: int = 4096) -> float:
    total, weight = 0.0, 0.0
    for i in range(0, len(idx), batch):
        b = idx[i : i + batch]
        label = samples["label"][b]
        w = torch.where(label, 1.0, w_rej)
        logit = head.logit(samples["feature"][b].float(), samples["prob"][b])
        total += float((w * F.binary_cross_entropy_with_logits(logit, label.float(), reduction="none")).sum())
        weight += float(w.sum())
    return total / weight if weight else float("nan")


def train_acceptance(samples: dict[str, torch.Tensor], cfg: AcceptanceTrainConfig,
                     log: Callable[[JsonObject], None] = lambda _: None) -> AcceptanceHead:
    """Train a float32 head on ``samples`` (``feature`` [N, H], ``prob``, ``label``, ``seq`` [N]); returns the
    epoch's state with the lowest validation loss (the last epoch when no sequence is held out).

    ``log`` receives per epoch ``{"epoch", "train_loss", "val_loss", "lr"}``.
    """
    train_idx, val_idx = split_sequences(samples["seq"], cfg.val_fraction, cfg.seed)
    head = new_acceptance_head(samples["feature"].shape[1], cfg.width, cfg.num_layers, cfg.w_rej, cfg.n_max, cfg.seed)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    per_epoch = math.ceil(len(train_idx) / cfg.batch_size)
    total = per_epoch * cfg.epochs
    warmup = max(1, total // 20)
    gen = torch.Generator().manual_seed(cfg.seed)
    best, best_loss, step = None, float("inf"), 0
    for epoch in range(cfg.epochs):
        head.train()
        order = train_idx[torch.randperm(len(train_idx), generator=gen)]
        running, seen = 0.0, 0
        for i in range(0, len(order), cfg.batch_size):
            b = order[i : i + cfg.batch_size]
            lr = warmup_cosine(step, total, cfg.lr, warmup)
            for g in opt.param_groups:
                g["lr"] = lr
            loss = weighted_bce(head.logit(samples["feature"][b].float(), samples["prob"][b]), samples["label"][b],
                                cfg.w_rej)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            running += loss.item() * len(b)
            seen += len(b)
        head.eval()
        val = _val_loss(head, samples, val_idx, cfg.w_rej) if len(val_idx) else float("nan")
        log({"epoch": epoch, "train_loss": running / max(seen, 1), "val_loss": val, "lr": lr})
        if not len(val_idx) or val < best_loss:
            best_loss = val
            best = {k: v.clone() for k, v in head.state_dict().items()}
    if best is not None:
        head.load_state_dict(best)
    return head.eval().requires_grad_(False)


@torch.no_grad()
def predict(head: AcceptanceHead, feature: torch.Tensor, prob: torch.Tensor, batch: int = 8192) -> torch.Tensor:
    """p_hat for stored samples: feature [N, H], prob [N] -> [N] float32, in batches."""
    dt = head.proj.weight.dtype
    return torch.cat([head(feature[i : i + batch].to(dt), prob[i : i + batch]) for i in range(0, len(prob), batch)]) \
        if len(prob) else torch.zeros(0)
