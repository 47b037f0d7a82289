"""Per-batch-size num_steps control, pure Python (no torch): config formats, SGLang's EMA policy, vLLM's static
schedule, and a trace format of verify steps.

- :mod:`spectune.backends.num_steps.sglang_config`: parse/validate SGLang ``--speculative-adaptive-config``
(``AdaptiveConfig``) and,
  re-exported from :mod:`spectune.backends.num_steps.vllm_schedule`, vLLM ``num_speculative_tokens_per_batch_size``
  (``VllmSchedule``); ``load_config_file`` detects the format.
- :mod:`spectune.backends.num_steps.ema_policy`: ``AdaptivePolicy``, SGLang's EMA tier policy restated; ``make_policy``.
- :mod:`spectune.backends.num_steps.vllm_schedule`: ``SchedulePolicy``, vLLM's static lookup behind the same interface.
- :mod:`spectune.backends.num_steps.trace`: ``TraceStep``, ``read_trace``, ``TraceWriter`` (JSONL of verify steps).
"""

from spectune.backends.num_steps.sglang_config import (
    SGLANG_DEFAULT_CONFIG,
    AdaptiveConfig,
    SlotConfig,
    VllmRange,
    VllmSchedule,
    load_config_file,
    parse_any_config,
    parse_sglang_adaptive_config,
    parse_vllm_schedule,
    parse_vllm_speculative_config,
)
from spectune.backends.num_steps.ema_policy import AdaptivePolicy, NumStepsPolicy, SlotState, make_policy
from spectune.backends.num_steps.vllm_schedule import SchedulePolicy
from spectune.backends.num_steps.trace import TraceStep, TraceWriter, read_trace, write_trace

__all__ = [
    "SGLANG_DEFAULT_CONFIG",
    "AdaptiveConfig",
    "AdaptivePolicy",
    "NumStepsPolicy",
    "SchedulePolicy",
    "SlotConfig",
    "SlotState",
    "TraceStep",
    "TraceWriter",
    "VllmRange",
    "VllmSchedule",
    "load_config_file",
    "make_policy",
    "parse_any_config",
    "parse_sglang_adaptive_config",
    "parse_vllm_schedule",
    "parse_vllm_speculative_config",
    "read_trace",
    "write_trace",
]
