"""What ``spectune validate`` runs and what it reports: :class:`ValidatePlan` (the config, the static num_steps it
is compared with, the workload and the request settings; recorded as ``plan`` in validate.json), the config file's
candidate num_steps (:func:`config_candidates`), the progress events of a validation (:class:`ValidateListener`)
and what it leaves (:class:`ValidateOutcome`). The run itself is :mod:`spectune.validate.run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from spectune.backends.llamacpp.settings import FORMAT, read_settings
from spectune.backends.num_steps import VllmSchedule, load_config_file
from spectune.loadgen.errors import UserError
from spectune.loadgen.record import RequestRecord
from spectune.validate.verdict import Verdict
from spectune.validate.workload import Workload


def config_candidates(path: str) -> tuple[str, tuple[int, ...]]:
    """(format, candidate num_steps) of a config file: ``sglang-adaptive`` (union of the slots' candidate steps),
    ``vllm-schedule`` (every K of the schedule) or ``llamacpp-settings`` (its one static num_steps,
    :mod:`spectune.backends.llamacpp.settings`: the "config" run is then a static server at that K).

    Raises:
        UserError: the file is missing or not a valid SGLang adaptive config / vLLM schedule / llama.cpp settings
            (:func:`spectune.backends.num_steps.load_config_file`).
    """
    try:
        static = read_settings(path)
    except ValueError as err:
        raise UserError(str(err)) from None
    if static is not None:
        return FORMAT, (static,)

    cfg = load_config_file(path)
    if not isinstance(cfg, VllmSchedule):  # an SGLang config, EMA or throughput-aware
        return "sglang-adaptive", cfg.candidate_steps
    return "vllm-schedule", tuple(sorted({r.k for r in cfg.ranges}))


@dataclass(frozen=True)
class ValidatePlan:
    """What a validation runs; recorded as ``plan`` in validate.json.

    Attributes:
        config: path of the SGLang adaptive config or vLLM schedule. steps: static num_steps to compare with.
        workload: the time-varying load. dataset, num_prompts, seed: the prompt sample. max_tokens, temperature,
            ignore_eos, api: every request. slo_ttft_ms, slo_tpot_ms: SLOs (ms) or None.
        warmup_requests: unrecorded requests before each run (None: min(first phase's concurrency, 4)).
        tolerance: the config passes at >= (1 - tolerance) x the best static's throughput (0..1).
        max_failure_rate: a run with a larger share of failed requests is ``failed``.
        repeats: times every run is measured, in alternating order (:meth:`run_order`); tables and the verdict
            use the means over repeats (:func:`spectune.validate.repeats.combine_repeats`).
    """

    config: str
    steps: tuple[int, ...]
    workload: Workload
    dataset: str = "mt-bench"
    num_prompts: int = 80
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    ignore_eos: bool = False
    api: str = "chat"
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    warmup_requests: int | None = None
    tolerance: float = 0.0
    max_failure_rate: float = 0.1
    repeats: int = 1

    def run_order(self, config_steps: int) -> list[tuple[str, int, int]]:
        """(run name, num_steps, repeat 1..n) in execution order: static runs by K, then the config; every second
        repeat reversed (config first), so a slow drift of the machine's speed does not favour one side (each repeat
        starts its servers afresh: :meth:`spectune.validate.run.Validation.run_all`)."""
        once = [*((f"static:{k}", k) for k in self.steps), ("config", config_steps)]
        return [(name, k, r + 1) for r in range(self.repeats) for name, k in (once if r % 2 == 0 else once[::-1])]

    def validate(self) -> None:
        """Raises UserError naming the first bad value."""
        from spectune.sweep.plan import SweepPlan

        SweepPlan(steps=self.steps or (0,), dataset=self.dataset, num_prompts=self.num_prompts,
                  max_tokens=self.max_tokens, temperature=self.temperature, api=self.api, slo_ttft_ms=self.slo_ttft_ms,
                  slo_tpot_ms=self.slo_tpot_ms, warmup_requests=self.warmup_requests,
                  max_failure_rate=self.max_failure_rate).validate()
        if not self.steps:
            raise UserError("no static num_steps to compare with: pass --steps, e.g. --steps 0,1,3")
        if self.repeats < 1:
            raise UserError(f"--repeats must be at least 1, got {self.repeats}")
        if not 0.0 <= self.tolerance < 1.0:
            raise UserError(f"--tolerance must be in 0..1 (0.02 = 2%), got {self.tolerance}")

    @property
    def warmup(self) -> int:
        """Warm-up requests before each run."""
        return self.warmup_requests if self.warmup_requests is not None else min(self.workload.first_concurrency(), 4)

    def to_json(self) -> dict[str, Any]:
        """The plan as a JSON object (the workload as :meth:`Workload.to_json`, without the trace itself)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["steps"], d["workload"] = list(self.steps), self.workload.to_json()
        return d


class ValidateListener:
    """Progress events of a validation (the CLI renders them). No-ops here."""

    def started(self, plan: ValidatePlan, runs: list[str]) -> None:
        """Before the first run: the run names in order."""

    def warning(self, message: str) -> None:
        """Something the user should know."""

    def server_starting(self, run: str) -> None:
        """The server of ``run`` is being started (or switched)."""

    def run_started(self, run: str, t0: float, total_s: float) -> None:
        """The measured load of ``run`` starts at ``t0`` (perf_counter s) for ``total_s`` s."""

    def request_finished(self, run: str, record: RequestRecord, phase: int) -> None:
        """A measured request of ``run`` finished; ``phase`` is 1-based."""

    def run_finished(self, result: dict[str, Any]) -> None:
        """A run is finished (its validate.json entry)."""

    def node_progress(self, task: Any) -> None:
        """A distributed validation's run changed on its node (a :class:`spectune.measure.node_progress.NodeTask`:
        started, its phase and seconds, ended)."""


@dataclass
class ValidateOutcome:
    """What a validation left: the folder, the run results in order, the verdict (None when interrupted)."""

    folder: Path
    plan: ValidatePlan
    runs: list[dict[str, Any]] = field(default_factory=list)
    verdict: Verdict | None = None
    prediction: dict[str, Any] | None = None  # predicted beside measured (spectune.validate.prediction)
    phase_check: dict[str, Any] | None = None  # each phase vs its best static (spectune.validate.phase_check)
