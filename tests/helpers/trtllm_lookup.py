"""TensorRT-LLM's own ``draft_len_schedule`` functions, cut out of its source, and a check of a `spectune recommend`
output against them (tests/backends/test_trtllm_contract.py uses both).

    python tests/helpers/trtllm_lookup.py TRTLLM_ROOT RECOMMEND_DIR

``TRTLLM_ROOT`` holds a ``tensorrt_llm/`` tree (a source checkout or an installed package): ``version.py`` names its
release; ``_torch/speculative/utils.py`` has the module-level ``get_draft_len_for_batch_size`` from 1.3.0rc8 on
(``bisect_left``: keys are upper bounds), ``_torch/speculative/drafter.py`` has ``Drafter``'s method before
(``bisect_right``: keys are lower bounds); ``llmapi/llm_args.py`` has ``validate_draft_len_schedule_and_sort``. The
functions are cut out with ``ast`` and run with only ``bisect`` (importing ``tensorrt_llm`` needs CUDA libraries).

``RECOMMEND_DIR`` is a ``spectune recommend`` output folder: its ``trtllm-speculative-config.json`` goes through
TensorRT-LLM's validator, then every batch size 1..N+1 (N: the largest finite key or slot bound) and 2N, 10N through
its lookup, against the sweep's choice in ``recommendation.json`` (``slots``: the slot containing the batch size, the
last open-ended, capped at the batch-size-1 slot's num_steps, TensorRT-LLM's ``max_draft_len``). A file without
``draft_len_schedule`` drafts ``max_draft_len`` at every batch size (the executor consults no schedule; the
module-level lookup returns ``max_draft_len`` for None). Prints one line per batch size and exits 1 when any differs
(or the validator refuses the schedule), else 0.
"""

from __future__ import annotations

import ast
import bisect
import json
import logging
import re
import sys
import textwrap
import typing
from pathlib import Path
from types import SimpleNamespace

from spectune.backends.num_steps.trtllm_schedule import OPEN_END


def cut_function(path: Path, name: str, namespace: dict) -> typing.Callable:
    """The function (module level or a class's method) ``name`` in ``path``, without decorators, defined in
    ``namespace``. Raises LookupError when the file has none."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            exec(compile(textwrap.dedent(ast.get_source_segment(source, node)), str(path), "exec"), namespace)
            return namespace[name]
    raise LookupError(f"{path} has no function {name}")


def trtllm_functions(root: Path) -> SimpleNamespace:
    """TensorRT-LLM's release, schedule lookup ``lookup(schedule: dict[int, int], batch_size) -> int``, the
    draft length of a whole ``speculative_config`` ``config_lookup(schedule or None, max_draft_len, batch_size)``
    and validator ``validate(schedule: dict[int, int], max_draft_len) -> dict`` from the tree at ``root``."""
    pkg = root / "tensorrt_llm"
    version = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", (pkg / "version.py").read_text()).group(1)
    ns = {"bisect_left": bisect.bisect_left, "bisect_right": bisect.bisect_right,
          "logger": logging.getLogger("trtllm"), **{n: getattr(typing, n) for n in ("Dict", "Optional", "List")}}
    try:
        fn = cut_function(pkg / "_torch" / "speculative" / "utils.py", "get_draft_len_for_batch_size", ns)
        lookup = lambda sched, b: fn(sched, b, max(sched.values()))  # noqa: E731
        config_lookup = lambda sched, k, b: fn(sched, b, k)  # noqa: E731
        where = "_torch/speculative/utils.py"
    except (LookupError, FileNotFoundError):
        method = cut_function(pkg / "_torch" / "speculative" / "drafter.py", "get_draft_len_for_batch_size", ns)
        lookup = lambda sched, b: method(SimpleNamespace(draft_len_schedule=sched), b)  # noqa: E731
        # the executor calls the drafter's lookup only when a schedule is set; without one every batch drafts
        # max_draft_len
        config_lookup = lambda sched, k, b: k if sched is None else lookup(sched, b)  # noqa: E731
        where = "_torch/speculative/drafter.py"
    validator = cut_function(pkg / "llmapi" / "llm_args.py", "validate_draft_len_schedule_and_sort", ns)
    validate = lambda sched, k: validator(None, sched, SimpleNamespace(data={"max_draft_len": k}))  # noqa: E731
    return SimpleNamespace(version=version, lookup=lookup, config_lookup=config_lookup, validate=validate,
                           where=where)


def sweep_choice(rec: dict, batch_size: int) -> int:
    """num_steps the sweep chose for ``batch_size`` (the slot containing it; the last slot is open-ended), capped
    at the batch-size-1 slot's (TensorRT-LLM's max_draft_len)."""
    slots = rec["slots"]
    slot = next(s for s in slots if s["lower"] <= batch_size and (s["upper"] is None or batch_size <= s["upper"]))
    return min(slot["steps"], slots[0]["steps"])


def batch_sizes(cfg: dict, rec: dict) -> list[int]:
    """The batch sizes to read a written ``cfg`` at: 1..N+1, 2N and 10N, N the largest of its finite keys (below
    :data:`~spectune.backends.num_steps.trtllm_schedule.OPEN_END`), the slots' bounds and their concurrencies
    (``rec["slots"]``)."""
    keys = [int(k) for k in cfg.get("draft_len_schedule") or {} if int(k) < OPEN_END]
    top = max(keys + [b for s in rec["slots"] for b in (s["lower"], s["upper"], *s.get("concurrencies", ()))
                      if b is not None])
    return list(range(1, top + 2)) + [2 * top, 10 * top]


def read_back(trt: SimpleNamespace, folder: Path) -> dict[int, tuple[int, int]]:
    """{batch size: (TensorRT-LLM's draft length, the sweep's choice)} for :func:`batch_sizes` of the recommend
    output in ``folder``. Raises ValueError when TensorRT-LLM's validator refuses it."""
    cfg = json.loads((folder / "trtllm-speculative-config.json").read_text())
    rec = json.loads((folder / "recommendation.json").read_text())
    sched = cfg.get("draft_len_schedule")
    if sched is not None:
        sched = trt.validate({int(k): v for k, v in sched.items()}, cfg["max_draft_len"])
    return {b: (trt.config_lookup(sched, cfg["max_draft_len"], b), sweep_choice(rec, b))
            for b in batch_sizes(cfg, rec)}


def main(argv: list[str]) -> int:
    root, folder = Path(argv[0]), Path(argv[1])
    trt = trtllm_functions(root)
    cfg = json.loads((folder / "trtllm-speculative-config.json").read_text())
    print(f"TensorRT-LLM {trt.version} ({trt.where}); {folder}/trtllm-speculative-config.json: "
          f"{json.dumps(cfg, separators=(',', ':'))}")
    try:
        got = read_back(trt, folder)
    except ValueError as err:
        print(f"FAIL: TensorRT-LLM's validator refuses it: {err}")
        return 1
    wrong = 0
    for b, (theirs, chosen) in got.items():
        ok = theirs == chosen
        wrong += not ok
        print(f"batch {b}: TensorRT-LLM drafts {theirs}, the sweep chose {chosen}{'' if ok else '  <- differs'}")
    print(f"{'FAIL' if wrong else 'PASS'}: {wrong} of {len(got)} batch sizes differ")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
