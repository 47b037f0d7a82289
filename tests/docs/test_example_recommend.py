"""The committed examples' recommend folders are what ``spectune recommend`` writes today from the committed sweeps: a
user who reruns the README command next to an example gets the example's files, and a change to recommend's rules
that changes an answer shows up here (regenerate the example and say why in its README).

Compared per file: every engine config (SGLang's three adaptive configs, vLLM's and TensorRT-LLM's files,
best-static.json, llamacpp-settings.json) as JSON, numbers to 12 significant digits (pandas may sum in another
order), and the vLLM file's head by its folder name (committed relative, written absolute); recommendation.md line by
line but for the sweep's path on its ``Source:`` line (as given on the command line). A gzipped ``requests.jsonl.gz``
(docs/examples/smollm2-h200) is read as the sweep's requests, so that example keeps its paired intervals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.paths import EXAMPLES
from spectune.cli import app

#: (example, sweep folder, recommend folder, recommend's options)
PAIRS = [("llamacpp-cpu", "sweep", "recommend", ()), ("smollm2-cpu", "sweep", "recommend", ()),
         ("smollm2-h200", "sweep", "recommend", ()), ("vllm-cpu", "sweep", "recommend", ()),
         ("vllm-cpu", "sweep-32", "recommend-swing", ("--mix", "1:60,32:60"))]
CONFIGS = ("sglang-adaptive-custom.json", "sglang-adaptive-conservative.json", "sglang-adaptive-aggressive.json",
           "vllm-speculative-config.json", "trtllm-speculative-config.json", "best-static.json",
           "llamacpp-settings.json")


def rounded(obj):
    """``obj`` with floats to 12 significant digits and a vLLM file's ``model`` reduced to its folder name."""
    if isinstance(obj, float):
        return float(f"{obj:.12g}")
    if isinstance(obj, list):
        return [rounded(v) for v in obj]
    if isinstance(obj, dict):
        return {k: Path(v).name if k == "model" and isinstance(v, str) else rounded(v) for k, v in obj.items()}
    return obj


@pytest.fixture(scope="module", params=PAIRS, ids=lambda p: f"{p[0]}-{p[2]}")
def written(request, tmp_path_factory) -> tuple[Path, Path]:
    """(the committed recommend folder, the folder recommend writes now from the committed sweep)."""
    example, sweep, folder, options = request.param
    out = tmp_path_factory.mktemp(example) / folder
    result = CliRunner().invoke(app, ["recommend", str(EXAMPLES / example / sweep), "-o", str(out), *options])
    assert result.exit_code == 0, result.output
    return EXAMPLES / example / folder, out


@pytest.mark.parametrize("name", CONFIGS)
def test_each_engine_file_is_the_committed_one(written, name):
    committed, now = written
    if not (committed / name).is_file():
        assert not (now / name).is_file()
        return
    assert rounded(json.loads((now / name).read_text())) == rounded(json.loads((committed / name).read_text()))


def test_recommendation_md_is_the_committed_one(written):
    committed, now = written

    def lines(path: Path) -> list[str]:
        return [re.sub(r"^Source: `[^`]*`", "Source: SWEEP", line) for line in path.read_text().splitlines()]

    assert lines(now / "recommendation.md") == lines(committed / "recommendation.md")
