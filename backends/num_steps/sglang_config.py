"""Per-batch-size num_steps configs: SGLang's ``--speculative-adaptive-config`` and vLLM's dynamic schedule.

SGLang (source: ``python/sglang/srt/speculative/adaptive_spec_params.py``, ``_load_adaptive_config``): a JSON
object. Keys made of decimal digits are batch-size slots, each the LOWER bound of its range (``"1"`` and ``"8"``:
BS 1-7 use slot 1, BS 8+ use slot 8). At least one slot is required. Each slot needs ``candidate_steps``: a
non-empty list of non-negative ints (0 = no drafting). Every other top-level key is merged into every slot
(``{**top, **slot}``), so a slot overrides a global. Parameters and SGLang's defaults: see :data:`DEFAULTS`.
A top-level ``strategy`` must be ``"ema"`` or ``"throughput_aware"``; this module parses ``"ema"`` configs, and
:func:`parse_any_config` hands ``"throughput_aware"`` ones to :mod:`spectune.backends.num_steps.throughput_policy`
(and the bundled engine's ``"p_min"`` / ``"specdec"`` / ``"specserve"`` ones to
:mod:`spectune.backends.num_steps.confidence_config`).

What spectune checks beyond SGLang, always: a slot is an object; parameters have the right type and range
(``update_interval`` >= 1, ``warmup_batches`` >= 0, ``0 <= ema_alpha <= 1``, finite floats; bools are not
numbers); no two keys name the same slot (``"8"`` and ``"08"``). With ``strict=True`` (the default) also: no
unknown keys (SGLang ignores them, so a typo such as ``candidate_step`` or ``down_hysterisis`` would silently change
behaviour), the smallest slot is ``"1"`` (SGLang's router sends smaller batch sizes to the smallest slot anyway),
slot keys are positive and written canonically (no leading zeros, no "0"), ``ema_alpha`` > 0 and ``ceiling_coeff`` >=
0. With
``strict=False`` those become entries in :attr:`AdaptiveConfig.warnings`, accepting everything SGLang accepts.

vLLM schedules are parsed in :mod:`spectune.backends.num_steps.vllm_schedule` (re-exported here):
``parse_vllm_schedule``, ``parse_vllm_speculative_config``, ``VllmSchedule``; :func:`parse_any_config` and
:func:`load_config_file` detect which format a file holds.

All parse functions raise ``ValueError`` with one line naming the slot/key/entry and the fix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from spectune.backends.num_steps.confidence_config import is_confidence_config, parse_confidence_config
from spectune.backends.num_steps.throughput_policy import parse_throughput_aware_config
from spectune.backends.num_steps.vllm_schedule import (  # re-exported: the one place to import formats from
    VllmRange,
    VllmSchedule,
    parse_vllm_schedule,
    parse_vllm_speculative_config,
)
from spectune.core.json_types import JsonObject
from spectune.core.errors import UserError

__all__ = [
    "DEFAULTS", "SGLANG_DEFAULT_CONFIG", "AdaptiveConfig", "SlotConfig", "VllmRange", "VllmSchedule",
    "load_config_file", "parse_any_config", "parse_sglang_adaptive_config", "parse_vllm_schedule",
    "parse_vllm_speculative_config",
]

DEFAULTS: dict[str, float | int] = {
    "ema_alpha": 0.2, "update_interval": 5, "warmup_batches": 10,
    "down_hysteresis": -0.25, "up_hysteresis": 0.0, "ceiling_coeff": 0,
}
"""SGLang's parameter defaults (``AdaptiveStepSlot.__init__``)."""
SLOT_KEYS = frozenset({"candidate_steps", *DEFAULTS})
"""Keys allowed inside a slot object."""
GLOBAL_KEYS = frozenset({"strategy", *DEFAULTS})
"""Non-slot keys allowed at the top level (SGLang merges every one of them into every slot)."""
SGLANG_DEFAULT_CONFIG: JsonObject = {
    "1": {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    "8": {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0},
    "32": {"candidate_steps": [0, 1], "down_hysteresis": 0.0},
    "64": {"candidate_steps": [0], "down_hysteresis": 0.0},
}
"""What current SGLang runs with ``--speculative-adaptive`` and no config file (``DEFAULT_ADAPTIVE_CONFIG``, other
parameters at their defaults). Older releases and the docs' "conservative" preset use "1": [1,3,7], "8": [1,3],
"32": [1] instead."""
_GLOBAL_PARAMS = ("ema_alpha", "update_interval", "warmup_batches")  # SGLang documents these as globals
_INT_PARAMS = {"update_interval": 1, "warmup_batches": 0}  # name -> minimum


@dataclass(frozen=True)
class SlotConfig:
    """One batch-size slot with every parameter resolved (globals merged, defaults filled).

    Attributes:
        lower_bound: smallest batch size routed here (requests); the slot covers up to the next slot's bound - 1.
        candidate_steps: allowed num_steps tiers, sorted ascending, unique (0 = no speculation).
        ema_alpha: EMA weight of the newest verify batch's mean accepted drafts.
        update_interval: verify batches between decisions after warm-up.
        warmup_batches: verify batches observed before the first decision.
        down_hysteresis: added to the step-down threshold (accepted drafts).
        up_hysteresis: added to the step-up threshold (accepted drafts).
        ceiling_coeff: cap num_steps at ceil(EMA * coeff) when > 0 (0 = off).
    """

    lower_bound: int
    candidate_steps: tuple[int, ...]
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ceiling_coeff: float = 0.0

    def params(self) -> JsonObject:
        """The six tunable parameters as a dict (SGLang key names)."""
        return {k: getattr(self, k) for k in DEFAULTS}


@dataclass(frozen=True)
class AdaptiveConfig:
    """A validated SGLang adaptive config (EMA strategy).

    Attributes:
        slots: slots sorted by ``lower_bound`` (at least one).
        warnings: problems tolerated by ``strict=False`` (empty when strict).
    """

    slots: tuple[SlotConfig, ...]
    warnings: tuple[str, ...] = ()

    @property
    def lower_bounds(self) -> tuple[int, ...]:
        """Slot lower bounds (batch sizes), ascending."""
        return tuple(s.lower_bound for s in self.slots)

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """Union of all slots' candidate steps, ascending (what an engine must be able to run)."""
        return tuple(sorted({k for s in self.slots for k in s.candidate_steps}))

    @property
    def server_initial_steps(self) -> int:
        """The num_steps an SGLang server starts with when ``--speculative-num-steps`` is not given: the middle
        entry (index ``len // 2``) of :attr:`candidate_steps`, the sorted union of every slot's candidates.

        Source: ``python/sglang/srt/arg_groups/speculative_hook.py``, ``_init_adaptive_speculative_params``
        (``candidate_steps[len(candidate_steps) // 2]``); a given ``--speculative-num-steps`` outside that union is
        a start-up ``ValueError`` there. Each slot then starts at this value when it is one of its candidates, else
        at its own middle candidate (:class:`spectune.backends.num_steps.ema_policy.AdaptivePolicy`).
        """
        union = self.candidate_steps
        return union[len(union) // 2]

    def to_json(self) -> JsonObject:
        """The config in SGLang's documented layout: ``ema_alpha``/``update_interval``/``warmup_batches`` at the
        top level when every slot shares them (else per slot); hysteresis and ``ceiling_coeff`` in every slot.

        ``parse_sglang_adaptive_config(cfg.to_json()) == cfg`` (without warnings).
        """
        first = self.slots[0].params()
        shared = {k: first[k] for k in _GLOBAL_PARAMS if all(s.params()[k] == first[k] for s in self.slots)}
        out: JsonObject = dict(shared)
        for s in self.slots:
            own = {k: v for k, v in s.params().items() if k not in shared}
            out[str(s.lower_bound)] = {"candidate_steps": list(s.candidate_steps), **own}
        return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_param(where: str, key: str, v: object, strict: bool, warnings: list[str]) -> float | int:
    if key in _INT_PARAMS:
        if not _is_int(v) or v < _INT_PARAMS[key]:
            raise ValueError(f"{where}: '{key}' must be an integer >= {_INT_PARAMS[key]}, got {v!r}")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{where}: '{key}' must be a finite number, got {v!r}")
    soft = None
    if key == "ema_alpha":
        if not 0 <= v <= 1:
            raise ValueError(f"{where}: 'ema_alpha' must be in (0, 1], got {v!r}")
        if v == 0:
            soft = f"{where}: 'ema_alpha' 0 freezes the EMA so num_steps never adapts; use a value in (0, 1]"
    if key == "ceiling_coeff" and v < 0:
        soft = f"{where}: 'ceiling_coeff' {v!r} is negative (SGLang treats it as 0 = off); write 0"
    if soft:
        if strict:
            raise ValueError(soft)
        warnings.append(soft)
    return float(v)


def _check_keys(where: str, keys: list[str], allowed: frozenset[str], strict: bool, warnings: list[str]) -> None:
    unknown = [k for k in keys if k not in allowed]
    if unknown:
        msg = (f"{where}: unknown key(s) {', '.join(repr(k) for k in unknown)} (SGLang would ignore them); "
               f"allowed: {', '.join(sorted(allowed))}")
        if strict:
            raise ValueError(msg)
        warnings.append(msg)


def parse_sglang_adaptive_config(obj: object, *, source: str = "config", strict: bool = True) -> AdaptiveConfig:
    """Validate a decoded ``--speculative-adaptive-config`` JSON value (rules in the module docstring).

    Args:
        obj: the decoded JSON (expected: a dict).
        source: name used in messages (a file path, "preset aggressive").
        strict: also reject unknown keys, a smallest slot other than "1", non-canonical slot keys,
            ``ema_alpha`` 0 and negative ``ceiling_coeff`` (else they become warnings).

    Returns:
        AdaptiveConfig with sorted slots and resolved parameters.

    Raises:
        ValueError: one line naming the slot/key and the fix.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"{source}: an SGLang adaptive config must be a JSON object, got {type(obj).__name__}")
    bad = [k for k in obj if not isinstance(k, str)]
    if bad:
        raise ValueError(f"{source}: keys must be strings as in JSON, got {bad[0]!r}; write \"{bad[0]}\"")
    warnings: list[str] = []
    strategy = obj.get("strategy", "ema")
    if strategy == "throughput_aware":
        raise ValueError(f"{source}: strategy 'throughput_aware' is not the EMA strategy: read it with "
                         "parse_any_config (spectune.backends.num_steps.throughput_policy)")
    if strategy != "ema":
        raise ValueError(f"{source}: 'strategy' must be 'ema' or 'throughput_aware', got {strategy!r}")
    slot_keys = [k for k in obj if isinstance(k, str) and k.isascii() and k.isdigit()]
    other = [k for k in obj if k not in slot_keys]
    if "candidate_steps" in other:
        msg = (f"{source}: top-level 'candidate_steps' is the old flat format; put it inside each batch-size slot, "
               'e.g. {"1": {"candidate_steps": [1, 3, 7]}}')
        if strict or not slot_keys:
            raise ValueError(msg)
        warnings.append(msg)
        other.remove("candidate_steps")
    if not slot_keys:
        raise ValueError(f'{source}: no batch-size slot: add at least one integer-string key, e.g. '
                         f'{{"1": {{"candidate_steps": [1, 3, 7]}}}} (got keys {sorted(map(str, obj))})')
    _check_keys(source, other, GLOBAL_KEYS, strict, warnings)
    glob = {k: _check_param(source, k, obj[k], strict, warnings) for k in other if k in DEFAULTS}
    seen: dict[int, str] = {}
    slots = []
    for key in slot_keys:
        where, bound = f"{source}: slot {key!r}", int(key)
        if bound in seen:
            raise ValueError(f"{where}: names the same batch size as slot {seen[bound]!r}; keep one of them")
        seen[bound] = key
        if key != str(bound) or bound == 0:
            msg = (f"{where}: write batch-size keys as positive integers without leading zeros "
                   f"(batch sizes start at 1)")
            if strict:
                raise ValueError(msg)
            warnings.append(msg)
        entry = obj[key]
        if not isinstance(entry, dict):
            raise ValueError(f'{where}: must be an object like {{"candidate_steps": [1, 3]}}, got {entry!r}')
        _check_keys(where, list(entry), SLOT_KEYS, strict, warnings)
        if "candidate_steps" not in entry:
            raise ValueError(f"{where}: missing 'candidate_steps' (the num_steps tiers, e.g. [1, 3, 7])")
        steps = entry["candidate_steps"]
        if not isinstance(steps, list) or not steps or not all(_is_int(s) and s >= 0 for s in steps):
            raise ValueError(f"{where}: 'candidate_steps' must be a non-empty list of non-negative integers "
                             f"(num_steps tiers, 0 = no speculation), got {steps!r}")
        own = {k: _check_param(where, k, entry[k], strict, warnings) for k in entry if k in DEFAULTS}
        params = {**DEFAULTS, **glob, **own}
        slots.append(SlotConfig(bound, tuple(sorted(set(steps))), float(params["ema_alpha"]),
                                int(params["update_interval"]), int(params["warmup_batches"]),
                                float(params["down_hysteresis"]), float(params["up_hysteresis"]),
                                float(params["ceiling_coeff"])))
    slots.sort(key=lambda s: s.lower_bound)
    if slots[0].lower_bound > 1:
        msg = (f"{source}: the smallest batch-size slot is {slots[0].lower_bound!r}, not \"1\": SGLang routes batch "
               f"sizes 1-{slots[0].lower_bound - 1} to it anyway; rename it \"1\" or add a \"1\" slot")
        if strict:
            raise ValueError(msg)
        warnings.append(msg)
    return AdaptiveConfig(tuple(slots), tuple(warnings))


def parse_any_config(obj: object, *, source: str = "config", strict: bool = True) -> AdaptiveConfig | VllmSchedule:
    """Detect the format and parse: a list is a vLLM schedule, an object with
    ``num_speculative_tokens_per_batch_size`` a vLLM speculative config (with ``num_speculative_tokens`` and no
    batch-size slot keys, a static one), an object with ``"strategy":
    "throughput_aware"`` an SGLang throughput-aware config (``ThroughputAwareConfig``), one with ``"strategy":
    "p_min"``, ``"specdec"`` or ``"specserve"`` a per-request draft-length config for the bundled engine
    (:class:`~spectune.backends.num_steps.confidence_config.ConfidenceConfig`), any other object an SGLang EMA
    config."""
    if isinstance(obj, dict) and obj.get("strategy") == "throughput_aware":
        return parse_throughput_aware_config(obj, source=source)  # type: ignore[return-value]
    if is_confidence_config(obj):
        return parse_confidence_config(obj, source=source)  # type: ignore[return-value,arg-type]
    try:
        if isinstance(obj, list):
            return parse_vllm_schedule(obj, strict=strict)
        if isinstance(obj, dict) and ("num_speculative_tokens_per_batch_size" in obj or (
                "num_speculative_tokens" in obj and not any(str(k).isdigit() for k in obj))):
            return parse_vllm_speculative_config(obj, strict=strict)
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    return parse_sglang_adaptive_config(obj, source=source, strict=strict)


def load_config_file(path: str | Path, *, strict: bool = True) -> AdaptiveConfig | VllmSchedule:
    """Read a JSON file holding an SGLang adaptive config, a vLLM schedule or a vLLM speculative config.

    Raises:
        core.errors.UserError: missing/unreadable file, bad JSON or an invalid config (one line, with the path).
    """
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except OSError as err:
        raise UserError(f"cannot read config {p}: {err.strerror or err}; check the path") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{p}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    try:
        return parse_any_config(obj, source=str(p), strict=strict)
    except ValueError as err:
        raise UserError(str(err)) from None
