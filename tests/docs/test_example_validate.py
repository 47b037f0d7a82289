"""The committed examples' validations rule again to their committed verdicts: ``spectune validate --rule-again`` on a
copy of each validate folder, with the config files validate.json names, writes the verdict (and a bake-off's
``bakeoff`` section) that the example ships. A change to the verdict's rules, or to how validate reads a folder, that
changes an answer shows up here (rule the example again and say why in its README).

Only the verdict and the bake-off are compared: a folder ruled again also gains the keys added to validate.json since
it was measured (``load_mix``, ``kept``...), which change no answer. docs/examples/smollm2-h200 ships its requests
gzipped (``requests.jsonl.gz``): its verdict's intervals come from those requests, so it also holds validate to
reading the gzipped file (spectune.results.reader.request_objects)."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from helpers.paths import EXAMPLES, ROOT
from spectune.cli import app

FOLDERS = sorted(p.parent.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.glob("*/*/validate.json"))


def config_args(doc: dict) -> list[str]:
    """``--config`` arguments for the config(s) a validate.json names: one path, or a bake-off's NAME=PATH values."""
    if doc.get("configs"):
        return [a for c in doc["configs"] for a in ("--config", f"{c['name']}={ROOT / c['path']}")]
    return ["--config", str(ROOT / doc["config"]["path"])]


def test_every_example_validation_is_found():
    assert len(FOLDERS) >= 8


@pytest.mark.parametrize("name", FOLDERS)
def test_an_example_validation_rules_again_to_its_committed_verdict(tmp_path, name):
    committed = json.loads((EXAMPLES / name / "validate.json").read_text(encoding="utf-8"))
    folder = tmp_path / "validate"
    shutil.copytree(EXAMPLES / name, folder)
    CliRunner().invoke(app, ["validate", "--rule-again", "--output-dir", str(folder), *config_args(committed)])
    again = json.loads((folder / "validate.json").read_text(encoding="utf-8"))
    assert again.get("ruled_again") != committed.get("ruled_again")  # it was rewritten by this run
    assert again["verdict"] == committed["verdict"]
    assert again.get("bakeoff") == committed.get("bakeoff")
