"""SGLang's files: ``sglang-adaptive-{preset}.json`` (``--speculative-adaptive-config``, per-batch-size-slot
ladders; :mod:`spectune.backends.num_steps.sglang_config` reads them back), the launch flags that go with them and
the static flags in ``best-static.json``. Slot keys are lower bounds, so above the largest measured batch size the
last slot's ladder applies, as every engine's file keeps the last slot's num_steps there."""

from __future__ import annotations

from typing import Mapping

from spectune.backends.formats.base import ConfigFile, EngineFormat, Plan
from spectune.backends.methods import engine_method, spellings
from spectune.backends.num_steps.sglang_config import parse_sglang_adaptive_config
from spectune.core.json_types import JsonObject

#: ``--speculative-algorithm`` values SGLang runs adaptively (``adaptive_spec_params.py``,
#: ``adaptive_unsupported_reason``: any other algorithm falls back to static settings).
SGLANG_ADAPTIVE_ALGORITHMS = spellings("sglang", "eagle", "eagle3")


def sglang_algorithm(method: str | None) -> str:
    """``--speculative-algorithm`` for a draft head's method (``eagle3`` -> ``EAGLE3``); ``EAGLE`` when unknown
    (:func:`spectune.backends.methods.engine_method`)."""
    return engine_method("sglang", method) or ""


def sglang_initial_steps(config: JsonObject, first_steps: int) -> int | None:
    """``--speculative-num-steps`` to launch SGLang with the adaptive ``config``, or None when no tier speculates.

    SGLang's rule (``python/sglang/srt/arg_groups/speculative_hook.py``, ``_init_adaptive_speculative_params``):
    the value must be one of the union of every slot's ``candidate_steps``, else start-up fails with ``ValueError``.
    spectune writes the batch-size-1 slot's chosen num_steps ``first_steps`` when it is positive (it is always in
    that slot's ladder, hence in the union), else the smallest positive candidate of the union; a union of only 0
    means no slot speculates (launch without speculation). Each slot starts at this value when it is one of its
    candidates, else at its own middle candidate.

    Raises:
        ValueError: ``config`` is not a valid SGLang adaptive config.
    """
    union = parse_sglang_adaptive_config(dict(config), source="config").candidate_steps
    if first_steps > 0 and first_steps in union:
        return first_steps
    positive = [k for k in union if k > 0]
    return positive[0] if positive else None


def sglang_launch_args(config: JsonObject, first_steps: int, method: str | None,
                       config_file: str = "sglang-adaptive-custom.json") -> list[str] | None:
    """SGLang's adaptive speculative flags for ``config`` (saved as ``config_file``), or None when no tier
    speculates: ``--speculative-algorithm`` from the head's ``method`` (:func:`sglang_algorithm`), topk 1,
    ``--speculative-num-steps`` by :func:`sglang_initial_steps` and ``--speculative-num-draft-tokens`` one more
    (SGLang sets that itself with topk 1).

    Raises:
        ValueError: ``config`` is not a valid SGLang adaptive config.
    """
    k = sglang_initial_steps(config, first_steps)
    if k is None:
        return None
    return ["--speculative-algorithm", sglang_algorithm(method), "--speculative-eagle-topk", "1",
            "--speculative-num-steps", str(k), "--speculative-num-draft-tokens", str(k + 1),
            "--speculative-adaptive", "--speculative-adaptive-config", config_file]


def sglang_launch_line(plan: Plan, config: dict) -> str:
    """The "SGLang launch" paragraph of recommendation.md: the flags of :func:`sglang_launch_args` for the custom
    config (``--speculative-num-steps`` from its candidate union, the algorithm from the sweep's draft head,
    ``plan.method`` and how it was found, ``plan.method_source``), or why there is none."""
    algorithm = (plan.method, plan.method_source)
    first = plan.slots[0][2] if plan.slots else 0
    args = sglang_launch_args(config, first, algorithm[0])
    if args is None:
        return ("\nSGLang launch: no batch-size slot speculates (every ladder is `[0]`): launch SGLang without "
                "speculative decoding.")
    k = int(args[args.index("--speculative-num-steps") + 1])
    why = ("num_steps of the batch-size-1 slot" if k == first else
           "the smallest positive candidate: the batch-size-1 slot does not speculate")
    algo = sglang_algorithm(algorithm[0])
    if algorithm[0] is None:
        algo_note = (f"the sweep did not record the draft head's algorithm: {algo} is written, use "
                     f"{sglang_algorithm('eagle3')} for an EAGLE-3 head")
    elif algo not in SGLANG_ADAPTIVE_ALGORITHMS:
        algo_note = (f"{algo} (from {algorithm[1]}): SGLang runs adaptive num_steps only with "
                     f"{' or '.join(SGLANG_ADAPTIVE_ALGORITHMS)}")
    else:
        algo_note = f"{algo} from {algorithm[1]}"
    return (f"\nSGLang launch: `{' '.join(args)}` and `--max-running-requests` above the largest batch size (SGLang "
            f"caps it at 48 with speculation otherwise). `--speculative-num-steps {k}` ({why}) is in the union of the "
            "config's `candidate_steps`, as SGLang requires at start-up; each slot starts there when it lists it, "
            f"else at its own middle candidate. Algorithm: {algo_note}.")


class SGLangFormat(EngineFormat):
    """``sglang-adaptive-{preset}.json`` per ladder preset of :attr:`Plan.ladders`, the launch flags for the custom
    one, and ``sglang_args`` in ``best-static.json``."""

    engine = "sglang"
    adaptive = True

    @staticmethod
    def file_name(preset: str) -> str:
        return f"sglang-adaptive-{preset}.json"

    def write(self, plan: Plan) -> list[ConfigFile]:
        out = []
        for preset, cfg in plan.ladders.items():
            parse_sglang_adaptive_config(cfg, source=f"sglang-adaptive-{preset}", strict=True)
            out.append(ConfigFile(self.file_name(preset), cfg,
                                  f"SGLang `--speculative-adaptive-config` ({preset} ladders)"))
        return out

    def launch_line(self, plan: Plan, files: Mapping[str, str]) -> str | None:
        if "custom" not in plan.ladders:
            return None
        return sglang_launch_line(plan, plan.ladders["custom"])

    def static_launch(self, steps: int, method: str | None) -> JsonObject:
        return {"sglang_args": ["--speculative-algorithm", sglang_algorithm(method), "--speculative-num-steps",
                                str(steps), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
                                str(steps + 1)]}
