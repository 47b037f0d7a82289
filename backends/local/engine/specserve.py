"""SpecServe's draft length: the engine side of the ``specserve`` strategy.

Source: Huang et al., "SpecServe: Efficient and SLO-Aware Large Language Model Serving with Adaptive Speculative
Decoding" (../shared/docs/papers/specserve.txt), sections 4-5. Three parts, all evaluated on the engine's device
(no host read per draft step on CUDA):

- **Efficiency estimate** (section 4, Alg. 3): throughput = NAT / T_sd. NAT = sum over rows of sum_{j=0}^{SL}
  AR_{i,j} (Eq. 7), AR_{i,j} = prod_{k<=j} c_{i,k} the cumulative acceptance estimate from the draft confidences
  (Eq. 8; AR_{i,0} = 1, the bonus token); T_sd from the step-time model of this machine
  (:class:`~spectune.backends.num_steps.step_time.StepTimeModel`, Eq. 1-6, fitted at start-up:
  :mod:`spectune.backends.local.engine.step_time_probe`).
- **Adaptive drafter** (section 5.1, Alg. 1, "predict-execute-correct"): after each draft step j the batch predicts
  the next step's confidence as the batch's mean confidence at step j, so one more step adds
  ``sum_i AR_{i,j} * mean_i c_{i,j}`` expected tokens; drafting continues while that raises the estimated
  throughput (NAT / T_sd of a round of j + 1 drafts against j), at most ``n_max`` steps. The decision is per batch:
  every row drafts the same steps, as in the paper (step-level control).
- **Confidence-prior verifier** (section 5.2, Alg. 2): before verification, drop the draft token with the lowest
  cumulative estimate AR while that raises the estimated throughput (the first drop that does not ends it). AR falls
  along a row, so the lowest token is always a row's tail, and rows end up verifying different lengths. The draft
  steps already run are sunk time in every candidate's T_sd. What a drop saves depends on how the target verifies
  (``SpeculativeDecoder.verify_layout``): ``packed`` runs each row's own tokens (the paper's cost: batch tokens are
  the rows' tokens), so one token goes per drop; ``padded`` runs every row to the longest row's width, where only a
  narrower width saves time, so one drop removes the last column, the tail (its lowest-estimate token) of every row
  at full width.
- **SLO check** (section 5.3, Alg. 3): a round whose predicted T_sd exceeds ``slo_tpot_ms`` scores below every round
  within it (the paper's -1; here minus its predicted time, so that when no candidate meets the SLO the shortest
  wins), so the drafter takes no step and the verifier keeps no width whose round breaks the SLO. The check is on
  the round time itself, as the paper has it: a row that gets only its bonus token has a TPOT of the whole round.
"""

from __future__ import annotations

import torch

from spectune.backends.num_steps.step_time import StepTimeModel, verify_tokens


class SpecServeRule:
    """SpecServe's drafter and verifier for one engine, with :class:`~spectune.backends.local.engine.draft_length.
    DraftRule`'s interface (see the module docstring for what it computes).

    Args:
        model: the step-time model of this machine (ms).
        n_max: the most draft tokens per row and round (>= 1).
        slo_tpot_ms: the TPOT SLO in ms no predicted round may exceed, or None.
        source: where ``model`` came from, for :meth:`to_json` (e.g. ``{"measured_s": 1.2, "samples": [...]}``).

    Use per round: :meth:`begin` with the rows' cached tokens, :meth:`observe` once per draft step (:attr:`active`
    [B] bool says whether the batch drafts on, :attr:`lengths` [B] long the drafted length per row), then
    :meth:`verify_lengths` for each row's length to verify.

    Every time the decisions read comes from :meth:`uniform_ms` (the drafter) and :meth:`candidates_ms` (the
    verifier): ``spectune simulate``'s replay (:mod:`spectune.tune.specserve_replay`) overrides the two to take its
    round times from the replay's step-time model, and runs the same drafter, verifier and SLO check.
    """

    strategy = "specserve"
    acceptance = None  # SpecServe reads the draft confidence itself (Eq. 8)

    def __init__(self, model: StepTimeModel, n_max: int, slo_tpot_ms: float | None = None,
                 source: dict[str, object] | None = None) -> None:
        if n_max < 1:
            raise ValueError(f"n_max must be >= 1, got {n_max}")
        self.model, self.n_max, self.slo_ms, self.source = model, int(n_max), slo_tpot_ms, source or {}
        self.active = self.lengths = self.survive = self.context = self.nat = torch.zeros(0)
        self.ars: list[torch.Tensor] = []
        self.batch = 0

    def describe(self) -> str:
        """One line, e.g. ``specserve, n_max 4, TPOT SLO 50 ms``."""
        slo = f", TPOT SLO {self.slo_ms:g} ms" if self.slo_ms is not None else ""
        return f"specserve, n_max {self.n_max}{slo}"

    def to_json(self) -> dict[str, object]:
        """``/server_info`` ``draft_length``: the strategy, n_max, the SLO and the step-time model's coefficients."""
        return {"strategy": self.strategy, "n_max": self.n_max, "slo_tpot_ms": self.slo_ms,
                "step_time_model": self.model.to_json(), **self.source}

    def score(self, nat: torch.Tensor, ms: torch.Tensor) -> torch.Tensor:
        """Estimated throughput NAT / T_sd (tokens per ms), or -T_sd for a round over the SLO (Alg. 3)."""
        rate = nat / ms.clamp(min=1e-9)
        return rate if self.slo_ms is None else torch.where(ms <= self.slo_ms, rate, -ms)

    def begin(self, batch: int, device: torch.device, context: torch.Tensor | None = None) -> None:
        """Start a round for ``batch`` rows whose cached tokens are ``context`` [B] (None: 0 each): all drafting,
        lengths 0, NAT = ``batch`` (the bonus tokens)."""
        self.batch = batch
        self.active = torch.ones(batch, dtype=torch.bool, device=device)  # [B]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # [B]
        self.survive = torch.ones(batch, dtype=torch.float32, device=device)  # [B]: AR_{i,j} so far
        self.context = (torch.zeros(batch, device=device) if context is None
                        else context[:batch].to(torch.float32))  # [B]
        self.nat = torch.tensor(float(batch), device=device)
        self.ars = []

    def observe(self, feature: torch.Tensor, prob: torch.Tensor) -> None:
        """Account draft step j (``prob`` [B]: the drafted tokens' confidences; ``feature`` unused) and decide
        whether the batch drafts step j + 1 (:attr:`active`)."""
        live = self.active
        prob = prob.float()
        self.survive = self.survive * prob
        ar = torch.where(live, self.survive, torch.zeros_like(self.survive))  # AR_{i,j} of the tokens drafted
        self.ars.append(ar)
        self.lengths = self.lengths + live
        self.nat = self.nat + ar.sum()
        j = len(self.ars)
        if j >= self.n_max:
            return
        gain = ar.sum() * prob.mean()  # predicted: AR_{i,j+1} = AR_{i,j} * (the batch's mean confidence at j)
        now = self.score(self.nat, self.uniform_ms(j))
        nxt = self.score(self.nat + gain, self.uniform_ms(j + 1))
        self.active = live & (nxt > now)

    def uniform_ms(self, drafts: int) -> torch.Tensor:
        """Predicted T_sd (ms, a 0-d tensor) of this round's batch when every row drafts and verifies ``drafts``
        tokens (:meth:`StepTimeModel.round_ms`): what the drafter compares step by step."""
        return torch.as_tensor(self.model.round_ms(self.context.sum(), self.batch, drafts))

    def candidates_ms(self, steps: int, cand: torch.Tensor, layout: str) -> torch.Tensor:
        """Predicted T_sd (ms) [R+1] of each verifier candidate ``cand`` [R+1, B] (per-row lengths to verify)
        after ``steps`` draft steps ran (sunk in every candidate), for the target's ``layout``: ``packed`` costs
        each row's own tokens, ``padded`` every row at the longest candidate row's width."""
        ctx, b = self.context, self.batch
        sunk = self.model.draft_ms(ctx.sum(), b, steps)  # the draft steps run: the same in every candidate
        if layout == "packed":
            n_c = ((cand + 1) * ctx + cand * (cand + 1) / 2).sum(dim=1)  # [R+1]: each row's own tokens
            n_b = (cand + 1).sum(dim=1)
        else:
            width = cand.max(dim=1).values + 1  # [R+1]
            n_c, n_b = verify_tokens(ctx.sum(), b, width)
        return sunk + self.model.verify_ms(n_c, n_b)

    def verify_lengths(self, layout: str = "padded") -> torch.Tensor:
        """Each row's length to verify [B] long, after the confidence-prior verifier's drops for the target's
        ``layout`` (``"padded"`` or ``"packed"``; see the module docstring)."""
        if not self.ars:
            return self.lengths.clone()
        ar = torch.stack(self.ars, dim=1)  # [B, S]: 0 past a row's length
        drop = self._drop_tokens if layout == "packed" else self._drop_columns
        cand, nat = drop(ar, self.lengths)
        score = self.score(nat, self.candidates_ms(len(self.ars), cand, layout))  # [R+1]
        rises = score[1:] > score[:-1]  # [R]
        drops = rises.long().cumprod(dim=0).sum()  # Alg. 2: drop while the throughput rises
        return cand[drops].clone()

    def _drop_tokens(self, ar: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidates after 0..R single drops in order of rising AR, ties to the later position (a row's tail):
        lengths [R+1, B] long and NAT [R+1]. R = B*S; past the last drafted token a "drop" removes nothing, so
        those candidates equal the last real one and never raise the throughput."""
        b, s = ar.shape
        drafted = torch.arange(s, device=ar.device).unsqueeze(0) < lengths.unsqueeze(1)  # [B, S]
        key = torch.where(drafted, ar, torch.full_like(ar, float("inf"))).flip(1).reshape(-1)  # later position first
        order = torch.sort(key, stable=True).indices  # [R]
        real = drafted.flip(1).reshape(-1)[order]  # [R]: a drafted token
        removed = ((order // s).unsqueeze(1) == torch.arange(b, device=ar.device)) & real.unsqueeze(1)  # [R, B]
        dropped = removed.long().cumsum(dim=0)  # [R, B]: tokens dropped per row after r + 1 drops
        cand = lengths.unsqueeze(0) - torch.cat([dropped.new_zeros(1, b), dropped])  # [R+1, B]
        lost = torch.where(real, key[order], torch.zeros_like(key[order])).cumsum(dim=0)  # [R]
        return cand, self.nat - torch.cat([lost.new_zeros(1), lost])

    def _drop_columns(self, ar: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidates after narrowing the padded width by 0..S columns: lengths [S+1, B] long and NAT [S+1] (past
        the last drafted column the candidates repeat the all-zero one)."""
        s = ar.shape[1]
        cap = (lengths.max() - torch.arange(s + 1, device=ar.device)).clamp(min=0)  # [S+1]: the longest row left
        cand = torch.minimum(lengths.unsqueeze(0), cap.unsqueeze(1))  # [S+1, B]
        kept = torch.arange(s, device=ar.device).view(1, 1, s) < cand.unsqueeze(2)  # [S+1, B, S]
        return cand, self.batch + (ar.unsqueeze(0) * kept).sum(dim=(1, 2))
