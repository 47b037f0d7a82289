"""The engine-format registry (spectune/backends/formats) and the draft-algorithm table (spectune/backends/methods.py):
every format registered once and loaded lazily, none importing spectune's feature packages, each engine's spelling
of the draft method from the one table."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.import_graph import import_graph
from helpers.paths import ROOT
from spectune.backends.formats import FORMATS, EngineFormat, Plan, engine_format, engine_formats
from spectune.backends.formats.vllm import vllm_config
from spectune.backends.llamacpp.backend import SPEC_TYPES
from spectune.backends.methods import engine_method, launch_method, spellings


def test_every_format_is_registered_under_its_engine():
    assert [f.engine for f in engine_formats()] == list(FORMATS)
    assert all(isinstance(f, EngineFormat) for f in engine_formats())


def test_the_registry_imports_no_format_until_asked():
    code = ("import sys, spectune.backends.formats as f; "
            "print(sorted(m for m in sys.modules if m.startswith('spectune.backends.formats.')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['spectune.backends.formats.base']"


def test_formats_import_no_feature_package():
    """Formats take plain data (Plan): backends never import spectune.tune or another feature package."""
    graph = import_graph(ROOT)
    todo, seen = [m for m in graph if m.startswith("spectune.backends.formats")], set()
    while todo:
        for t in graph.get(todo.pop(), set()) - seen:
            seen.add(t)
            todo.append(t)
    assert sorted(t for t in seen if not t.startswith(("spectune.backends.", "spectune.loadgen.", "spectune.core."))) == []


def test_an_unknown_engine_has_no_format():
    with pytest.raises(KeyError):
        engine_format("tgi")


def test_a_plan_without_slots_writes_no_schedule():
    assert vllm_config(Plan()) is None
    assert engine_format("trtllm").write(Plan()) == []


def test_vllm_writes_the_slots_up_to_the_largest_batch_size():
    plan = Plan(slots=[(1, 4, 3), (5, None, 1)], top=32, method="EAGLE3", head="h")
    assert vllm_config(plan) == {"method": "eagle3", "model": "h", "num_speculative_tokens": 3,
                                 "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 32, 1]]}


@pytest.mark.parametrize("method, sglang, vllm", [(None, "EAGLE", "eagle"), ("eagle3", "EAGLE3", "eagle3"),
                                                  ("EAGLE", "EAGLE", "eagle"), ("NextN", "NEXTN", "nextn")])
def test_each_engine_spells_the_method_from_one_table(method, sglang, vllm):
    assert engine_method("sglang", method) == sglang
    assert engine_method("vllm", method) == vllm


def test_llamacpp_takes_only_its_listed_methods():
    assert engine_method("llamacpp", "eagle3") == "draft-eagle3"
    assert engine_method("llamacpp", "eagle") is None
    assert SPEC_TYPES == {"eagle3": "draft-eagle3", "draft-eagle3": "draft-eagle3", "draft": "draft-simple",
                          "draft-simple": "draft-simple"}


def test_sglang_adapts_only_with_eagle_methods():
    assert spellings("sglang", "eagle", "eagle3") == ("EAGLE", "EAGLE3")


def test_launch_method_prefers_the_option_then_the_head(tmp_path):
    head = tmp_path / "some-eagle3-head"
    head.mkdir()
    (head / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    assert launch_method("sglang", "eagle", str(head)) == ("EAGLE", "option")
    assert launch_method("sglang", None, str(head)) == ("EAGLE3", str(head / "config.json"))
    assert launch_method("vllm", None, None) == ("eagle", "default")
