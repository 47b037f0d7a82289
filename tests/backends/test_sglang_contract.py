"""Contract with SGLang, checked by SGLang's own code: spectune's adaptive configs, launch line and EMA policy run
through ``sglang.srt.speculative.adaptive_spec_params`` and ``sglang.srt.arg_groups.speculative_hook``; its
throughput-aware policy through ``sglang.srt.speculative.throughput_aware_controller`` when the SGLang given has one
(SGLang main, PR 28045; the 0.5.23 release, the newest on the registry, has none). Those two tests are marked
``engine_source``, which the default test command deselects: run them with ``SPECTUNE_SGLANG_PATH`` set to an SGLang
main tree and ``python -m pytest -m engine_source``.

SGLang's code is found or fetched once by tests/helpers/sglang_code.py: ``$SPECTUNE_SGLANG_PATH``, this environment,
or spectune's cache, filled by ``pip install --no-deps --target`` of the pinned wheel (skipped only when pip cannot
fetch it). The probe (tests/sglang_contract_probe.py) runs in a
subprocess: importing SGLang patches torch and transformers process-wide.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spectune.backends.num_steps.sglang_config import SGLANG_DEFAULT_CONFIG, parse_sglang_adaptive_config
from spectune.cli import app
from helpers.paths import ROOT as REPO_ROOT
from helpers.results_folders import grid, write_sweep
from helpers.sglang_code import sglang_path

ROOT = REPO_ROOT
EXAMPLE = ROOT / "docs" / "examples" / "smollm2-cpu" / "sweep"


def launch_steps(md: str) -> int:
    args = re.search(r"SGLang launch: `([^`]*)`", md).group(1).split()
    return int(args[args.index("--speculative-num-steps") + 1])


def recommend(folder: Path, out: Path) -> Path:
    res = CliRunner().invoke(app, ["recommend", str(folder), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    sglang_dir, why = sglang_path()
    if sglang_dir is None:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("contract")
    configs = []
    example = recommend(EXAMPLE, tmp / "example")
    for preset in ("custom", "conservative", "aggressive"):
        configs.append({"path": str(example / f"sglang-adaptive-{preset}.json"),
                        "launch_steps": launch_steps((example / "recommendation.md").read_text())
                        if preset == "custom" else None})
    # batch size 1 best without speculation, 8 at K=3: a union without 1, which the old launch line wrote
    no_one = recommend(write_sweep(tmp / "r", grid({1: {0: 200, 3: 100}, 8: {0: 500, 3: 800}})), tmp / "no_one")
    configs.append({"path": str(no_one / "sglang-adaptive-custom.json"), "rejected_steps": 1,
                    "launch_steps": launch_steps((no_one / "recommendation.md").read_text())})
    for preset in sorted((ROOT / "presets").glob("sglang-*.json")):
        configs.append({"path": str(preset)})
    default = tmp / "spectune-default.json"
    default.write_text(json.dumps(SGLANG_DEFAULT_CONFIG))
    configs.append({"path": str(default)})
    throughput = tmp / "throughput-aware.json"
    throughput.write_text(json.dumps(THROUGHPUT_CONFIG))
    job = tmp / "job.json"
    job.write_text(json.dumps({"configs": configs, "batches": 4000, "seed": 0,
                               "throughput": {"configs": [str(throughput)], "cost_table": COST_TABLE,
                                              "cuda_graph_bs": [1, 2, 4, 8, 16, 32]}}))
    env = {**os.environ, "PYTHONPATH": sglang_dir}  # "" when this environment has SGLang installed
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "sglang_contract_probe.py"), str(job)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# A throughput-aware config as recommend writes one (spectune/tune/strategy.py) and round times (ms) that make the
# best num_steps move with acceptance: drafting costs more per step at larger batch sizes.
THROUGHPUT_CONFIG = {"strategy": "throughput_aware", "1": {"candidate_steps": [1, 2, 3]},
                     "8": {"candidate_steps": [1, 2]}}
COST_TABLE = {str(b): {str(s): 10.0 + b * 0.05 + s * (0.5 + b * 0.2) for s in (1, 2, 3)} for b in (1, 2, 4, 8, 16, 32)}


def throughput(probe: dict) -> dict:
    if not probe.get("throughput", {}).get("available"):
        pytest.skip(f"SGLang {probe.get('sglang_version')} has no throughput-aware strategy: set "
                    "SPECTUNE_SGLANG_PATH to an SGLang tree with sglang/srt/speculative/throughput_aware_controller.py "
                    "and throughput_aware_spec_params.py (SGLang main, PR 28045); CI cannot: it installs the "
                    "registry's newest sglang, 0.5.23, which predates PR 28045, and SGLang's code may not be "
                    "committed here")
    return probe["throughput"]


@pytest.mark.engine_source
def test_sglang_reads_the_throughput_aware_candidate_union(probe):
    assert list(throughput(probe)["union"].values()) == [[1, 2, 3]]


@pytest.mark.engine_source
def test_spectunes_throughput_aware_policy_matches_sglangs_controller(probe):
    for path, replay in throughput(probe)["replay"].items():
        assert replay["same"], (path, replay)


def by_name(probe: dict, name: str) -> dict:
    return next(c for c in probe["configs"] if c["path"].endswith(name))


def test_sglang_loads_every_config_with_spectunes_candidate_union(probe):
    for c in probe["configs"]:
        assert c["union"] == c["spectune_union"], c["path"]


def test_sglangs_initial_tier_is_spectunes(probe):
    """Without --speculative-num-steps SGLang starts at the middle of the union: AdaptiveConfig.server_initial_steps
    (what spectune simulate and AdaptivePolicy use by default)."""
    for c in probe["configs"]:
        assert c["without_num_steps"]["num_steps"] == c["spectune_initial"], c["path"]


def test_sglang_accepts_the_recommended_launch_line(probe):
    for c in probe["configs"]:
        if "launch_steps" in c:
            assert c["launch_steps"]["accepted"], (c["path"], c["launch_steps"])


def test_the_recommended_num_draft_tokens_is_what_sglang_sets(probe):
    for c in probe["configs"]:
        if "launch_steps" in c:
            assert c["launch_steps"]["num_draft_tokens"] == c["launch_steps"]["num_steps"] + 1


def test_sglang_rejects_the_old_launch_value_outside_the_union(probe):
    """The defect spectune fixed: --speculative-num-steps max(first, 1) = 1 with a union of [0, 3] stops SGLang."""
    rejected = by_name(probe, "no_one/sglang-adaptive-custom.json")["rejected_steps"]
    assert not rejected["accepted"]
    assert "is not in the adaptive config candidate_steps" in rejected["error"]


def test_spectunes_policy_matches_sglangs_on_random_verify_batches(probe):
    for c in probe["configs"]:
        assert c["replay"]["same"], (c["path"], c["replay"])
        if "replay_from_launch" in c:
            assert c["replay_from_launch"]["same"], (c["path"], c["replay_from_launch"])


def test_spectunes_copy_of_sglangs_default_config(probe):
    theirs = parse_sglang_adaptive_config(probe["default_config"], strict=False)
    assert theirs == parse_sglang_adaptive_config(SGLANG_DEFAULT_CONFIG)


def test_the_example_launch_algorithm_is_sglangs_eagle3(probe):
    md = (EXAMPLE.parent / "recommend" / "recommendation.md").read_text()
    algo = re.search(r"SGLang launch: `[^`]*--speculative-algorithm (\S+)", md).group(1)
    assert probe["algorithms"][algo]["is_eagle3"]
