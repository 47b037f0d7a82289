"""Contract with TensorRT-LLM: the ``speculative_config`` that ``spectune recommend`` writes gives every batch size
1..N+1 (N: the slot table's top) and 2N, 10N the draft length the sweep chose (above N: the last slot's), read the
way the named TensorRT-LLM release reads it.

Two layers:

- Always: spectune's restated lookups (:mod:`spectune.backends.num_steps.trtllm_schedule`) reproduce TensorRT-LLM's own
  documented examples (tests/fixtures/trtllm_draft_len_schedule.json, data with the source cited), and the written
  schedules, read through those lookups and checked by the restated validator, give each batch size the sweep's
  choice, for the newest release (upper-bound keys) and for 1.2.1 (lower-bound keys).
- With TensorRT-LLM's source (``$SPECTUNE_TRTLLM_SRC``: folders, separated by ``os.pathsep``, each holding a
  ``tensorrt_llm/`` tree, a source checkout or an installed package; ``tensorrt_llm/version.py`` names its release):
  its own ``get_draft_len_for_batch_size`` (module-level in ``_torch/speculative/utils.py`` from 1.3.0rc8,
  ``Drafter``'s method in ``_torch/speculative/drafter.py`` before) and ``validate_draft_len_schedule_and_sort``
  (``llmapi/llm_args.py``) are cut out of the files with ``ast`` and run (importing ``tensorrt_llm`` needs CUDA
  libraries; these functions need only ``bisect``) by tests/helpers/trtllm_lookup.py, which also checks one
  recommend output folder from the command line. TensorRT-LLM's source is not on the package registry (its
  registry entries are stubs that download from NVIDIA's index), so this layer is marked ``engine_source``, which
  the default test command deselects (``python -m pytest -m engine_source`` with the variable set runs it); no
  TensorRT-LLM code is kept in this repository.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spectune.backends.num_steps.trtllm_schedule import (
    OPEN_END,
    UPPER_BOUND_SINCE,
    build_schedule,
    check_schedule,
    config_draft_len,
    draft_len_for_batch_size,
    schedule_form,
)
from spectune.cli import app
from helpers.paths import ROOT
from helpers.results_folders import grid, write_sweep
from helpers.trtllm_lookup import batch_sizes, read_back, sweep_choice, trtllm_functions

CASES = json.loads((ROOT / "tests" / "fixtures" / "trtllm_draft_len_schedule.json").read_text())["forms"]
EXAMPLE = ROOT / "docs" / "examples" / "smollm2-cpu" / "sweep"
VERSIONS = [None, "1.2.1"]  # the newest (upper-bound keys) and the last stable release before 1.3.0rc8


def sweeps(tmp: Path) -> dict[str, Path]:
    """The committed example sweep and two constructed ones (three and four slots, the last not speculating)."""
    three = {1: {0: 100, 1: 160, 3: 200}, 4: {0: 300, 1: 420, 3: 380}, 16: {0: 800, 1: 700, 3: 500}}
    four = {1: {0: 100, 2: 180, 4: 220}, 2: {0: 190, 2: 330, 4: 360}, 8: {0: 600, 2: 800, 4: 700},
            32: {0: 1500, 2: 1300, 4: 900}}
    return {"example": EXAMPLE, "three": write_sweep(tmp / "three", grid(three)),
            "four": write_sweep(tmp / "four", grid(four))}


def recommend(folder: Path, out: Path, version: str | None) -> tuple[dict, dict]:
    args = ["recommend", str(folder), "-o", str(out)] + (["--trtllm-version", version] if version else [])
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return (json.loads((out / "trtllm-speculative-config.json").read_text()),
            json.loads((out / "recommendation.json").read_text()))


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict:
    """{(sweep name, version): (trtllm config, recommendation.json)} for every sweep and version."""
    tmp = tmp_path_factory.mktemp("trtllm")
    out = {}
    for name, folder in sweeps(tmp).items():
        for v in VERSIONS:
            out[(name, v)] = recommend(folder, tmp / f"{name}-{v}", v)
    return out


@pytest.mark.parametrize("form", ["upper", "lower"])
def test_spectunes_lookup_reproduces_trtllms_documented_examples(form):
    case = CASES[form]
    sched = {int(k): v for k, v in case["schedule"].items()}
    got = {(lo, hi): {draft_len_for_batch_size(sched, b, form) for b in range(lo, hi + 1)}
           for lo, hi, _ in case["ranges"]}
    assert got == {(lo, hi): {k} for lo, hi, k in case["ranges"]}


@pytest.mark.parametrize("form", ["upper", "lower"])
def test_build_schedule_writes_trtllms_documented_examples(form):
    case = CASES[form]
    ranges = [tuple(r) for r in case["ranges"] if r[2] > 0 or form == "lower"]  # the implicit 0 tier is unwritten
    assert build_schedule(ranges, form) == case["schedule"]


@pytest.mark.parametrize("form", ["upper", "lower"])
def test_an_open_ended_last_range_keeps_its_draft_length_above_every_key(form):
    sched = {int(k): v for k, v in build_schedule([(1, 4, 3), (5, None, 1)], form).items()}
    assert [draft_len_for_batch_size(sched, b, form) for b in (1, 4, 5, 64, 4096, OPEN_END)] == [3, 3, 1, 1, 1, 1]


def test_a_config_without_a_schedule_drafts_max_draft_len_at_every_batch_size():
    assert {config_draft_len({"max_draft_len": 2}, b, "upper") for b in (1, 32, 4096, OPEN_END)} == {2}


def test_versions_map_to_the_form_they_read():
    got = [schedule_form(v) for v in (None, "1.2.1", "1.3.0rc7", UPPER_BOUND_SINCE, "v1.3.0", "1.4.0rc1")]
    assert got == ["upper", "lower", "lower", "upper", "upper", "upper"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["example", "three", "four"])
def test_every_batch_size_runs_the_sweeps_choice(written, name, version):
    cfg, rec = written[(name, version)]
    got = {b: (config_draft_len(cfg, b, schedule_form(version)), sweep_choice(rec, b)) for b in batch_sizes(cfg, rec)}
    assert {b: pair for b, pair in got.items() if pair[0] != pair[1]} == {}, (cfg, rec["slots"])


@pytest.mark.parametrize("version", VERSIONS)
def test_written_schedules_pass_trtllms_validator_rules(written, version):
    for (name, v), (cfg, _) in written.items():
        if v == version and "draft_len_schedule" in cfg:
            check_schedule(cfg["draft_len_schedule"], cfg["max_draft_len"], schedule_form(version))


def test_the_example_file_gives_every_batch_size_the_sweeps_choice():
    cfg = json.loads((EXAMPLE.parent / "recommend" / "trtllm-speculative-config.json").read_text())
    rec = json.loads((EXAMPLE.parent / "recommend" / "recommendation.json").read_text())
    assert [config_draft_len(cfg, b, "upper") for b in batch_sizes(cfg, rec)] == \
        [sweep_choice(rec, b) for b in batch_sizes(cfg, rec)]


# ---- TensorRT-LLM's own functions, when its source is given ----

SOURCES = [Path(p) for p in os.environ.get("SPECTUNE_TRTLLM_SRC", "").split(os.pathsep) if p]

needs_source = pytest.mark.skipif(
    not SOURCES,
    reason="TensorRT-LLM's own lookup is not run: set SPECTUNE_TRTLLM_SRC to folders (separated by os.pathsep), each "
           "holding a tensorrt_llm/ tree with version.py, llmapi/llm_args.py and _torch/speculative/utils.py (1.3.0rc8 "
           "and later) or drafter.py (before); CI cannot: the registry's tensorrt-llm is a stub that downloads from "
           "NVIDIA's own index, and TensorRT-LLM's code may not be committed here")


@pytest.mark.engine_source
@needs_source
@pytest.mark.parametrize("root", SOURCES, ids=str)
def test_trtllms_own_lookup_gives_every_batch_size_the_sweeps_choice(root, tmp_path):
    trt = trtllm_functions(root)
    for name, folder in sweeps(tmp_path).items():
        cfg, _ = recommend(folder, tmp_path / name, trt.version)
        wrong = {b: pair for b, pair in read_back(trt, tmp_path / name).items() if pair[0] != pair[1]}
        assert wrong == {}, (trt.version, name, cfg)


@pytest.mark.engine_source
@needs_source
@pytest.mark.parametrize("root", SOURCES, ids=str)
def test_spectunes_restated_lookup_is_trtllms(root):
    trt = trtllm_functions(root)
    form = schedule_form(trt.version)
    import random

    rng = random.Random(0)
    for _ in range(300):
        keys = sorted(rng.sample(range(1, 200), rng.randint(1, 6)))
        if form == "lower":
            keys = sorted({1, *keys})
        vals = sorted((rng.randint(0, 7) for _ in keys), reverse=True)
        sched = trt.validate(dict(zip(keys, vals)), vals[0])
        assert [trt.lookup(sched, b) for b in range(1, 256)] == \
            [draft_len_for_batch_size(sched, b, form) for b in range(1, 256)], (trt.version, sched)
