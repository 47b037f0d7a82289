"""Draft length per request from the drafter's confidence: the ``p_min``, ``specdec`` and ``specserve`` strategies.

A config JSON with a top-level ``"strategy"`` of ``"p_min"``, ``"specdec"`` or ``"specserve"`` asks the bundled engine
to let every row of a round stop drafting on its own, at most ``n_max`` draft tokens (the engine's rules:
:mod:`spectune.backends.local.engine.draft_length`, :mod:`spectune.backends.local.engine.specserve`):

- ``{"strategy": "p_min", "p_min": 0.6, "n_max": 4}``: llama.cpp's rule (``--spec-draft-p-min``, read in
  ``common/speculative.cpp``, ``common_speculative_impl_draft_eagle3``, release 11434): a row stops at the first draft
  token whose confidence is under ``p_min``; that token is not drafted. ``p_min`` 0 drafts ``n_max`` tokens always
  (llama.cpp's default 0.00).
- ``{"strategy": "specdec", "threshold": 0.5, "n_max": 4, "acceptance_head": "bundled"}``: SpecDec++ (Huang et al.,
  2024, section 4: stop when the predicted probability that at least one draft token of the round is rejected,
  ``1 - prod_i p_i``, exceeds ``threshold``; the token that crossed it is kept). ``p_i`` comes from an
  acceptance-prediction head (``"bundled"``: the one shipped beside the default pair's EAGLE-3 head, or a folder
  path), or, with ``"acceptance_head": null`` or the key absent, from the raw draft confidence.
- ``{"strategy": "specserve", "n_max": 4, "slo_tpot_ms": 50}``: SpecServe (Huang et al., "SpecServe: Efficient and
  SLO-Aware Large Language Model Serving with Adaptive Speculative Decoding", sections 4-5): the round's draft length
  from a step-time model of this machine and the draft confidences (adaptive drafter), the lowest-estimate draft
  tokens dropped before verification (confidence-prior verifier), and, with ``slo_tpot_ms`` (optional, ms > 0), no
  draft step or verify width whose predicted round time exceeds it (SLO-aware efficiency estimator).

The confidence is the draft token's probability as llama.cpp's EAGLE-3 drafter reads it (softmax over the 10 largest
draft logits: ``DraftHead.draft_with_prob``). Pure Python: no torch. Unknown keys are rejected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STRATEGIES = ("p_min", "specdec", "specserve")
"""The ``strategy`` values this module parses."""

_KEYS = {"p_min": {"strategy", "p_min", "n_max"}, "specdec": {"strategy", "threshold", "n_max", "acceptance_head"},
         "specserve": {"strategy", "n_max", "slo_tpot_ms"}}


@dataclass(frozen=True)
class ConfidenceConfig:
    """A validated per-request draft-length config.

    Attributes:
        strategy: ``"p_min"``, ``"specdec"`` or ``"specserve"``.
        threshold: ``p_min`` (p_min: stop below it) or ``h`` (specdec: stop once 1 - prod p > h), in [0, 1]; 0 for
            specserve (no threshold: its step-time model decides).
        n_max: the most draft tokens a row drafts in one round (>= 1).
        acceptance_head: specdec only: ``"bundled"``, a folder path, or None (raw draft confidence).
        slo_tpot_ms: specserve only: the TPOT SLO in ms no predicted round may exceed, or None (no SLO).
    """

    strategy: str
    threshold: float
    n_max: int
    acceptance_head: str | None = None
    slo_tpot_ms: float | None = None

    @property
    def max_steps(self) -> int:
        """Draft steps the engine must be able to run in one round (== n_max)."""
        return self.n_max

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """Every per-row draft length the rule can pick, 0..n_max."""
        return tuple(range(self.n_max + 1))

    def describe(self) -> str:
        """One line for logs and reports, e.g. ``p_min 0.6, n_max 4``."""
        if self.strategy == "specserve":
            slo = f", TPOT SLO {self.slo_tpot_ms:g} ms" if self.slo_tpot_ms is not None else ""
            return f"specserve, n_max {self.n_max}{slo}"
        if self.strategy == "p_min":
            return f"p_min {self.threshold:g}, n_max {self.n_max}"
        head = self.acceptance_head or "raw draft confidence"
        return f"specdec threshold {self.threshold:g}, n_max {self.n_max}, p from {head}"

    def to_json(self) -> dict[str, object]:
        """The config object this record parses from."""
        if self.strategy == "specserve":
            out: dict[str, object] = {"strategy": "specserve", "n_max": self.n_max}
            if self.slo_tpot_ms is not None:
                out["slo_tpot_ms"] = self.slo_tpot_ms
            return out
        if self.strategy == "p_min":
            return {"strategy": "p_min", "p_min": self.threshold, "n_max": self.n_max}
        return {"strategy": "specdec", "threshold": self.threshold, "n_max": self.n_max,
                "acceptance_head": self.acceptance_head}


def is_confidence_config(obj: object) -> bool:
    """Whether a decoded config JSON names one of :data:`STRATEGIES`."""
    return isinstance(obj, dict) and obj.get("strategy") in STRATEGIES


def _unit(value: object, key: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise ValueError(f"{source}: {key!r} must be a number in [0, 1], got {value!r}")
    return float(value)


def parse_confidence_config(obj: dict, *, source: str = "config") -> ConfidenceConfig:
    """Validate a ``p_min``, ``specdec`` or ``specserve`` config object.

    Raises:
        ValueError: unknown or missing keys, a threshold outside [0, 1], ``n_max`` not an integer >= 1, an
            ``acceptance_head`` that is not a string, or a ``slo_tpot_ms`` that is not a number > 0 (one line naming
            ``source`` and the key).
    """
    strategy = obj.get("strategy")
    if strategy not in STRATEGIES:
        raise ValueError(f"{source}: 'strategy' must be one of {', '.join(STRATEGIES)} here, got {strategy!r}")
    unknown = sorted(set(obj) - _KEYS[strategy])
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {', '.join(map(repr, unknown))} for strategy {strategy!r}; "
                         f"allowed: {', '.join(sorted(_KEYS[strategy]))}")
    if strategy == "specserve":
        return _parse_specserve(obj, source)
    key = "p_min" if strategy == "p_min" else "threshold"
    if key not in obj or "n_max" not in obj:
        raise ValueError(f"{source}: strategy {strategy!r} needs {key!r} and 'n_max', e.g. "
                         f"{{\"strategy\": \"{strategy}\", \"{key}\": 0.5, \"n_max\": 4}}")
    n_max = _n_max(obj["n_max"], source)
    head = obj.get("acceptance_head")
    if head is not None and (not isinstance(head, str) or not head):
        raise ValueError(f"{source}: 'acceptance_head' must be \"bundled\", a folder path or null, got {head!r}")
    return ConfidenceConfig(strategy, _unit(obj[key], key, source), n_max, head)


def _n_max(value: object, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{source}: 'n_max' must be an integer >= 1, got {value!r}")
    return value


def _parse_specserve(obj: dict, source: str) -> ConfidenceConfig:
    """A ``specserve`` object: ``n_max`` required, ``slo_tpot_ms`` optional (a number > 0, or null for none)."""
    if "n_max" not in obj:
        raise ValueError(f"{source}: strategy 'specserve' needs 'n_max', e.g. "
                         "{\"strategy\": \"specserve\", \"n_max\": 4, \"slo_tpot_ms\": 50}")
    slo = obj.get("slo_tpot_ms")
    if slo is not None and (isinstance(slo, bool) or not isinstance(slo, (int, float)) or not math.isfinite(slo)
                            or slo <= 0):
        raise ValueError(f"{source}: 'slo_tpot_ms' must be a number of ms > 0 (or null: no SLO), got {slo!r}")
    return ConfidenceConfig("specserve", 0.0, _n_max(obj["n_max"], source),
                            slo_tpot_ms=None if slo is None else float(slo))
