"""Built-in presets: SGLang's documented configs, valid, loadable as package data, listed and shown by the CLI."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from spectune.backends.num_steps.sglang_config import parse_sglang_adaptive_config
from spectune.cli import app, main
from spectune.presets import load_preset, preset_names


def test_presets_are_sglangs_documented_configs():
    assert preset_names() == ["sglang-aggressive", "sglang-conservative", "sglang-default"]
    cons = parse_sglang_adaptive_config(load_preset("sglang-conservative"), strict=True)
    assert [(s.lower_bound, s.candidate_steps, s.down_hysteresis) for s in cons.slots] == [
        (1, (1, 3, 7), -0.25), (8, (1, 3), 0.0), (32, (1,), 0.0)]
    aggr = parse_sglang_adaptive_config(load_preset("sglang-aggressive"), strict=True)
    assert [(s.lower_bound, s.candidate_steps, s.ceiling_coeff) for s in aggr.slots] == [
        (1, (1, 3, 7), 0.0), (8, (1, 3, 7), 3.0), (64, (1, 3), 1.67), (128, (1, 3), 1.2)]
    assert all(s.down_hysteresis == -0.25 for s in aggr.slots)
    default = parse_sglang_adaptive_config(load_preset("sglang-default"), strict=True)
    assert [s.candidate_steps for s in default.slots] == [(1, 3, 5, 7), (0, 1, 3), (0, 1), (0,)]


def test_cli_list_and_show():
    res = CliRunner().invoke(app, ["presets", "list"])
    assert res.exit_code == 0
    lines = res.output.strip().splitlines()
    assert [ln.split("\t")[0] for ln in lines] == preset_names()
    assert all(ln.split("\t")[1] for ln in lines)
    res = CliRunner().invoke(app, ["presets", "show", "sglang-aggressive"])
    assert res.exit_code == 0
    assert json.loads(res.output) == load_preset("sglang-aggressive")


def test_unknown_preset_exits_2_listing_names(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["spectune", "presets", "show", "turbo"])
    with pytest.raises(SystemExit) as exc:
        main()
    err = " ".join(capsys.readouterr().err.split())
    assert exc.value.code == 2
    assert "unknown preset 'turbo'" in err
    assert "sglang-conservative" in err
