"""What ``spectune validate`` runs and what it reports: :class:`ValidatePlan` (the config, the static num_steps it
is compared with, the workload and the request settings; recorded as ``plan`` in validate.json), the config file's
candidate num_steps (:func:`config_candidates`) and whether it is one static num_steps in disguise
(:func:`static_equivalent`), the configs of a bake-off (several ``--config``: :func:`parse_configs`,
:class:`BakeoffConfig`), the progress events of a validation (:class:`ValidateListener`) and what it leaves
(:class:`ValidateOutcome`). The run itself is :mod:`spectune.validate.run`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Sequence

from spectune.backends.llamacpp.settings import FORMAT, read_p_min, read_settings
from spectune.backends.num_steps import VllmSchedule, load_config_file
from spectune.backends.num_steps.confidence_config import ConfidenceConfig
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord
from spectune.measure.load_settings import LoadSpec, failure_rate_check, steps_check
from spectune.measure.node_progress import NodeTask
from spectune.measure.workload import Workload
from spectune.results.validate_run import ValidateRun
from spectune.validate.config_formats import BEST_STATIC, read_best_static
from spectune.validate.repeats import AA_PREFIX
from spectune.validate.verdict import Verdict

DEFAULT_REPEATS = 3
"""``--repeats`` by default. Every repeat starts its servers afresh, so the paired ratios' intervals carry the
server-to-server spread measured over the repeats (:func:`spectune.validate.repeats.instance_spread`), with
M x (repeats - 1) degrees of freedom for M runs. The spread alone then gives a ratio a 95% half-width of
t(0.95, df) x sd x sqrt(2 / repeats): 3.18 sd at 2 repeats of 3 runs, 2.00 sd at 3, 1.60 sd at 4. With one server's
sd of about 2% (two engines 2.4-3.8% apart at batch 1, docs/engine.md), 3 repeats leave about +-4% for it, so a
loss of about 5% or more is called, where 2 repeats leave about +-6.5% (docs/validate.md, "How sure")."""

SERVERS = ("one", "together", "kept")
"""``--servers``: how the runs' servers are held (:meth:`spectune.validate.run.Validation.run_all`).

- ``one`` (default): one server up at a time, each run on a fresh one (a GPU may hold only one server).
- ``together``: every server of a repeat started at once; the repeat's runs then go back to back, one workload
  apart instead of a server start apart; all stopped at the repeat's end (fresh servers every repeat, so the
  intervals still carry how far two processes of one server differ).
- ``kept``: every server started once and kept up through all repeats: a repeat costs no start, so more repeats
  fit in an hour on a machine whose speed drifts within minutes. The intervals then hold the run-to-run spread of
  the same processes; how far two processes of one server differ is not in them.
"""


def config_candidates(path: str) -> tuple[str, tuple[int, ...]]:
    """(format, candidate num_steps) of a config file: ``sglang-adaptive`` (union of the slots' candidate steps),
    ``vllm-schedule`` (every K of the schedule), ``llamacpp-settings`` (its one static num_steps,
    :mod:`spectune.backends.llamacpp.settings`: the "config" run is then a static server at that K) or
    ``best-static`` (recommend's ``best-static.json``: the same, for any engine), or ``p_min`` / ``specdec`` (draft
    length per row on the bundled engine: lengths 0..n_max).

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
    best = read_best_static(path)
    if best is not None:
        return BEST_STATIC, (best,)

    cfg = load_config_file(path)
    if isinstance(cfg, ConfidenceConfig):  # draft length per row: every length 0..n_max is a static rival
        return cfg.strategy, cfg.candidate_steps
    if not isinstance(cfg, VllmSchedule):  # an SGLang config, EMA or throughput-aware
        return "sglang-adaptive", cfg.candidate_steps
    return "vllm-schedule", tuple(sorted({r.k for r in cfg.ranges}))


def static_equivalent(path: str) -> tuple[int, str] | None:
    """(K, why) when the config file makes its server run the same rounds as a static server at num_steps K, else
    None:

    - llama.cpp settings: one static draft length K (K = 0 too: ``llama-server`` then runs without a draft model),
      unless they carry a draft-confidence cutoff above 0 (``spec_draft_p_min``: rows then draft 0..K tokens);
    - recommend's ``best-static.json``: static num_steps K for every engine (K = 0: no drafter);
    - an SGLang adaptive config (EMA or throughput-aware) whose every slot lists the one candidate K >= 1: the
      controller has nothing to switch to;
    - a vLLM schedule (bare or inside a speculative config) with the same K >= 1 in every range (vLLM carries the
      last range's K to larger batches, so that is K everywhere).

    K = 0 everywhere is not static K = 0 on an adaptive server: it keeps the draft model loaded and may keep it up to
    date (SGLang extends the draft every round; vLLM ran the EAGLE head over the batch every step and its K = 0
    schedule ran at about static K = 1's speed, docs/examples/vllm-cpu), which a static K = 0 server does not pay.

    Raises:
        UserError: as :func:`config_candidates`.
    """
    fmt, candidates = config_candidates(path)
    if fmt == FORMAT:
        try:
            cutoff = read_p_min(path)
        except ValueError as err:
            raise UserError(str(err)) from None
        if cutoff and candidates[0] > 0:
            return None
        return candidates[0], "llama.cpp settings: one static draft length"
    if fmt == BEST_STATIC:
        return candidates[0], ("best-static.json: no drafter on any engine" if candidates[0] == 0 else
                               "best-static.json: one static num_steps for every engine")
    if len(candidates) != 1 or candidates[0] < 1:
        return None
    k = candidates[0]
    if fmt == "vllm-schedule":
        return k, f"K={k} at every batch size of its vLLM schedule"
    return k, f"one candidate, {k}, in every slot"


CONFIG_PREFIX = "config:"
"""Run name prefix of a bake-off's config runs: ``config:NAME`` is the config named NAME (:class:`BakeoffConfig`);
a validation of one config names its run ``config``."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_configs(values: Sequence[str]) -> list[tuple[str, str]]:
    """(name, path) of each ``--config`` value: ``NAME=PATH``, or a bare PATH named by its file stem
    (``ema=configs/sglang.json`` -> ``("ema", "configs/sglang.json")``, ``runs/best-static.json`` ->
    ``("best-static", ...)``). A value is ``NAME=PATH`` when the text before its first ``=`` is a name (a letter or
    digit, then letters, digits, ``.``, ``_``, ``-``) and the value is not itself an existing file. Paths come back
    as :class:`~pathlib.Path` spells them (``./a.json`` -> ``a.json``).

    Raises:
        UserError: no value; a name used twice (one line naming both paths and the fix).
    """
    out: list[tuple[str, str]] = []
    for value in values:
        head, eq, tail = value.partition("=")
        if eq and tail and _NAME.fullmatch(head) and not Path(value).is_file():
            out.append((head, str(Path(tail))))
        else:
            out.append((Path(value).stem, str(Path(value))))
    if not out:
        raise UserError("no --config given: pass the config to validate, or several to compare (NAME=PATH each)")
    seen: dict[str, str] = {}
    for name, path in out:
        if name in seen:
            raise UserError(f"two configs named {name!r} ({seen[name]}, {path}): name them apart with NAME=PATH, "
                            f"e.g. --config {name}-2={path}")
        seen[name] = path
    return out


@dataclass(frozen=True)
class BakeoffConfig:
    """One config of a bake-off (several ``--config`` in one validation; docs/validate.md, "A bake-off").

    Attributes:
        name: its name in the tables (``NAME=PATH`` or the file stem: :func:`parse_configs`). path: the file.
        format, candidates: :func:`config_candidates`. static: (K, why) when it runs the same rounds as static
            num_steps K (:func:`static_equivalent`): it is then not run, static K stands for it.
    """

    name: str
    path: str
    format: str
    candidates: tuple[int, ...]
    static: tuple[int, str] | None = None

    @classmethod
    def read(cls, name: str, path: str) -> "BakeoffConfig":
        """The config file ``path`` as bake-off config ``name``. Raises UserError as :func:`config_candidates`."""
        fmt, candidates = config_candidates(path)
        return cls(name, path, fmt, tuple(candidates), static_equivalent(path))

    @property
    def run(self) -> str:
        """The run that measures it: ``config:NAME``, or ``static:K`` when it is static K."""
        return f"static:{self.static[0]}" if self.static is not None else f"{CONFIG_PREFIX}{self.name}"

    @property
    def initial_steps(self) -> int:
        """num_steps its server starts at: the largest candidate (as for one config)."""
        return max(self.candidates)

    def to_json(self) -> JsonObject:
        """validate.json's ``configs`` entry: ``name``, ``path``, ``format``, ``candidate_steps``,
        ``initial_steps``, ``static_equivalent`` (``{"steps", "reason"}`` or None) and ``run``."""
        return {"name": self.name, "path": self.path, "format": self.format,
                "candidate_steps": list(self.candidates), "initial_steps": self.initial_steps,
                "static_equivalent": None if self.static is None else {"steps": self.static[0],
                                                                        "reason": self.static[1]},
                "run": self.run}


@dataclass(frozen=True)
class ValidatePlan(LoadSpec):
    """What a validation runs; recorded as ``plan`` in validate.json.

    The prompts and request settings are :class:`~spectune.measure.load_settings.LoadSpec`'s (keyword-only):
    ``dataset``, ``num_prompts``, ``seed``, ``max_tokens``, ``temperature``, ``ignore_eos``, ``api``, ``slo_ttft_ms``,
    ``slo_tpot_ms`` and ``warmup_requests`` (None = min(first phase's concurrency, 4) warm-up requests before each
    run).

    Attributes:
        config: path of the SGLang adaptive config or vLLM schedule. steps: static num_steps to compare with.
        workload: the time-varying load.
        tolerance: the config passes at >= (1 - tolerance) x the best static's throughput (0..1).
        max_failure_rate: a run with a larger share of failed requests is ``failed``.
        repeats: times every run is measured, in alternating order (:meth:`run_order`); tables and the verdict
            use the means over repeats (:func:`spectune.validate.repeats.combine_repeats`). Default
            :data:`DEFAULT_REPEATS`.
        config_static: K when the config runs the same rounds as static num_steps K (:func:`static_equivalent`):
            the config is then not run as a run of its own (``steps`` must hold K), and the verdict asks whether
            another static num_steps beats K. None: the config is run.
        bakeoff: the configs of a bake-off (two or more ``--config``), each run as ``config:NAME`` (or stood for
            by its static K, which ``steps`` must hold) beside the shared static runs; ``config`` is then empty.
            Empty: one config, ``config``.
    """

    config: str
    steps: tuple[int, ...]
    workload: Workload
    tolerance: float = 0.0
    max_failure_rate: float = 0.1
    repeats: int = DEFAULT_REPEATS
    config_static: int | None = None
    servers: str = "one"
    bakeoff: tuple[BakeoffConfig, ...] = ()

    @property
    def aa_steps(self) -> int:
        """num_steps of the A/A run (one repeat only): the config's own K when it is a static num_steps
        (:attr:`config_static`, the run the verdict turns on), else the smallest K of :attr:`steps`, the cheapest
        static server (the least drafting; no draft model at K = 0)."""
        return self.config_static if self.config_static is not None else min(self.steps)

    def run_order(self, config_steps: int) -> list[tuple[str, int, int]]:
        """(run name, num_steps, repeat 1..n) in execution order: static runs by K, then the config (left out when
        :attr:`config_static` is set); every second repeat reversed (config first), so a slow drift of the
        machine's speed does not favour one side (each repeat starts its servers afresh unless :attr:`servers`
        is ``kept``: :meth:`spectune.validate.run.Validation.run_all`). With one repeat, last, the A/A run ``aa:K``
        (:attr:`aa_steps` on a second fresh server): with no repeats it is what measures how far two servers of
        the same num_steps differ (:func:`spectune.validate.repeats.instance_spread`). A bake-off
        (:attr:`bakeoff`) runs each of its configs where one config runs (``config:NAME``, ``config_steps`` unused),
        so its static runs are the same as one config's."""
        once = [(f"static:{k}", k) for k in self.steps]
        if self.bakeoff:  # a bake-off: every config run after the shared static runs, in the order given
            once += [(c.run, c.initial_steps) for c in self.bakeoff if c.static is None]
        elif self.config_static is None:
            once.append(("config", config_steps))
        order = [(name, k, r + 1) for r in range(self.repeats) for name, k in (once if r % 2 == 0 else once[::-1])]
        if self.repeats == 1 and self.steps:
            order.append((f"{AA_PREFIX}{self.aa_steps}", self.aa_steps, 1))
        return order

    def validate(self) -> None:
        """Raises UserError naming the first bad value."""
        checks = [steps_check(self.steps or (0,)),
                  *self.load_checks(),
                  failure_rate_check(self.max_failure_rate)]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        if not self.steps:
            raise UserError("no static num_steps to compare with: pass --steps, e.g. --steps 0,1,3")
        if self.repeats < 1:
            raise UserError(f"--repeats must be at least 1, got {self.repeats}")
        if self.config_static is not None and self.config_static not in self.steps:
            raise UserError(f"the config is static num_steps {self.config_static}: add it to --steps")
        for c in self.bakeoff:
            if c.static is not None and c.static[0] not in self.steps:
                raise UserError(f"config {c.name} is static num_steps {c.static[0]}: add it to --steps")
        if not 0.0 <= self.tolerance < 1.0:
            raise UserError(f"--tolerance must be in 0..1 (0.02 = 2%), got {self.tolerance}")
        if self.servers not in SERVERS:
            raise UserError(f"--servers must be one of {', '.join(SERVERS)}, got {self.servers!r}")

    @property
    def warmup(self) -> int:
        """Warm-up requests before each run."""
        return self.warmup_requests if self.warmup_requests is not None else min(self.workload.first_concurrency(), 4)

    def to_json(self) -> JsonObject:
        """The plan as a JSON object (the workload as :meth:`Workload.to_json`, without the trace itself)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["steps"], d["workload"] = list(self.steps), self.workload.to_json()
        configs = d.pop("bakeoff")
        if configs:  # a bake-off only: one config's plan is written as it always was
            d["configs"] = [{"name": c.name, "path": c.path} for c in configs]
        return self.plan_json(("config", "steps", "workload"), d)


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

    def run_finished(self, result: ValidateRun) -> None:
        """A run is finished (its validate.json entry)."""

    def node_progress(self, task: NodeTask) -> None:
        """A distributed validation's run changed on its node (a :class:`spectune.measure.node_progress.NodeTask`:
        started, its phase and seconds, ended)."""


@dataclass
class ValidateOutcome:
    """What a validation left: the folder, the run results in order, the verdict (None when interrupted)."""

    folder: Path
    plan: ValidatePlan
    runs: list[JsonObject] = field(default_factory=list)
    verdict: Verdict | None = None
    prediction: JsonObject | None = None  # predicted beside measured (spectune.validate.prediction)
    phase_check: JsonObject | None = None  # each phase vs its best static (spectune.validate.phase_check)
    instance_spread: JsonObject | None = None  # server-to-server spread (spectune.validate.repeats.InstanceSpread)
    bakeoff: JsonObject | None = None  # a bake-off's table and winner (spectune.validate.bakeoff)
