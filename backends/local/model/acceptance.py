"""Acceptance-prediction head (SpecDec++: Huang et al., "SpecDec++: Boosting Speculative Decoding via Adaptive
Candidate Lengths", 2024, section 4): the probability that a draft token is accepted, given that every earlier
draft of the round was, read from the EAGLE head's output feature at that draft step.

A draft-length policy stops a row's round when the predicted probability of at least one rejection,
``1 - prod_i p_hat_i``, exceeds a threshold (SpecDec++'s threshold rule). Architecture as SpecDec++'s released
code (``specdec_pp/wrap_model.py``: residual blocks ``x + SiLU(Linear(x))``, then a linear layer to the logit),
with an input projection from the feature (layer-normed, no affine) and the draft confidence to the blocks' width.

Trained by ``spectune draft accept-train`` (:mod:`spectune.draft.acceptance_train`) with SpecDec++'s weighted
binary cross-entropy (rejections weighted ``w_rej``, acceptances 1). Weighting shifts the minimiser from the
acceptance probability q to q / (q + w_rej (1 - q)), i.e. its logit by -log(w_rej) (the prior-shift correction
of Elkan, "The Foundations of Cost-Sensitive Learning", 2001); :class:`AcceptanceHead` adds ``logit_offset`` =
log(w_rej) back, so its output is a probability of acceptance on the raw confidence's scale and a threshold means
the same for both.

A head folder holds ``config.json`` (:class:`AcceptanceConfig` fields) and ``model.safetensors``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from spectune.core.errors import UserError

BUNDLED_ACCEPTANCE_HEAD = Path(__file__).resolve().parent.parent / "heads" / "smollm2-135m-eagle3" / "acceptance"
"""The acceptance head shipped for the bundled SmolLM2-135M EAGLE-3 head (its card: ``README.md`` there)."""

ARCHITECTURE = "SpecDecAcceptanceHead"


@dataclass
class AcceptanceConfig:
    """Shape and output correction of an acceptance head.

    Attributes:
        feature_size: H, the width of the EAGLE head's output feature.
        width: width of the residual blocks.
        num_layers: residual blocks (SpecDec++'s depth D; 0 = input projection then linear).
        draft_prob_input: the draft confidence (as p and log p) is an input beside the feature.
        logit_offset: added to the logit before the sigmoid: log(w_rej) undoes the weighted loss's prior shift.
        w_rej: the rejection weight the head was trained with (record).
        n_max: draft steps per round the training data unrolled (record).
    """

    feature_size: int
    width: int = 256
    num_layers: int = 3
    draft_prob_input: bool = True
    logit_offset: float = 0.0
    w_rej: float = 1.0
    n_max: int = 4


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)): [..., width] -> [..., width] (SpecDec++'s ``ResBlock``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., width] -> [..., width]."""
        return x + F.silu(self.linear(x))


class AcceptanceHead(nn.Module):
    """Predicted conditional acceptance probability of a draft token.

    Args:
        cfg: shape (:class:`AcceptanceConfig`).
    """

    def __init__(self, cfg: AcceptanceConfig) -> None:
        super().__init__()
        self.cfg = cfg
        extra = 2 if cfg.draft_prob_input else 0
        self.proj = nn.Linear(cfg.feature_size + extra, cfg.width)
        self.blocks = nn.ModuleList(ResBlock(cfg.width) for _ in range(cfg.num_layers))
        self.out = nn.Linear(cfg.width, 1)

    def logit(self, feature: torch.Tensor, draft_prob: torch.Tensor) -> torch.Tensor:
        """The trained logit, without ``logit_offset``: feature [..., H], draft_prob [...] -> [...] float32.

        This is what the weighted loss is applied to during training.
        """
        w = self.proj.weight
        x = F.layer_norm(feature.to(w.dtype), (feature.shape[-1],))
        if self.cfg.draft_prob_input:
            p = draft_prob.to(torch.float32).clamp(1e-6, 1.0)
            x = torch.cat([x, torch.stack([p, p.log()], dim=-1).to(w.dtype)], dim=-1)
        x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)[..., 0].float()

    def forward(self, feature: torch.Tensor, draft_prob: torch.Tensor) -> torch.Tensor:
        """p_hat: feature [..., H] (``DraftHead.forward``'s output at the draft step), draft_prob [...] (the
        confidence of ``DraftHead.draft_with_prob``) -> [...] float32 in (0, 1), the probability that the draft
        token is accepted (greedy: it equals the target's token) given that the earlier drafts of the round were."""
        return torch.sigmoid(self.logit(feature, draft_prob) + self.cfg.logit_offset)


def new_acceptance_head(feature_size: int, width: int, num_layers: int, w_rej: float, n_max: int, seed: int,
                        draft_prob_input: bool = True) -> AcceptanceHead:
    """A fresh float32 head (seeded init) whose output undoes the ``w_rej`` weighting (``logit_offset`` log(w_rej))."""
    torch.manual_seed(seed)
    return AcceptanceHead(AcceptanceConfig(feature_size=feature_size, width=width, num_layers=num_layers,
                                           draft_prob_input=draft_prob_input, logit_offset=math.log(w_rej),
                                           w_rej=w_rej, n_max=n_max))


def save_acceptance_head(head: AcceptanceHead, folder: Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` (float32) into ``folder`` (created)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [ARCHITECTURE], **asdict(head.cfg)},
                                                   indent=2) + "\n")
    save_file({k: v.detach().float().contiguous() for k, v in head.state_dict().items()},
              str(folder / "model.safetensors"))


def load_acceptance_head(path: str | Path, device: torch.device, dtype: torch.dtype) -> AcceptanceHead:
    """Load a head folder written by :func:`save_acceptance_head`, in eval mode without gradients.

    Raises:
        UserError: the folder, its config.json or model.safetensors is missing or unreadable, the config is not an
            acceptance head's, or a tensor is missing or misshaped (one line naming the problem).
    """
    folder = Path(path).expanduser()
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise UserError(f"acceptance head {folder} needs config.json and model.safetensors: give a folder written by "
                        "`spectune draft accept-train`")
    try:
        raw = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"acceptance head {cfg_path} is not readable JSON ({exc}); rewrite it with "
                        "`spectune draft accept-train`") from None
    if not isinstance(raw, dict) or ARCHITECTURE not in raw.get("architectures", []):
        raise UserError(f"{cfg_path} is not an acceptance head's config (architectures lacks {ARCHITECTURE!r}); "
                        "give a folder written by `spectune draft accept-train`")
    names = {f.name for f in fields(AcceptanceConfig)}
    try:
        cfg = AcceptanceConfig(**{k: v for k, v in raw.items() if k in names})
    except TypeError as exc:
        raise UserError(f"{cfg_path} lacks a field of an acceptance head ({exc})") from None
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(weights))
    except (OSError, SafetensorError) as exc:
        raise UserError(f"acceptance head weights {weights} are unreadable ({exc})") from None
    head = AcceptanceHead(cfg)
    expected = head.state_dict()
    for name, ref in expected.items():
        if name not in state:
            raise UserError(f"acceptance head {weights} lacks tensor {name!r}")
        if tuple(state[name].shape) != tuple(ref.shape):
            raise UserError(f"acceptance head tensor {name!r} has shape {tuple(state[name].shape)}, expected "
                            f"{tuple(ref.shape)} for {cfg_path}")
    head.load_state_dict(state, strict=False)
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)
