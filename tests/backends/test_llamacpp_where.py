"""``spectune llamacpp where`` as users run it (a subprocess): it names the llama-server that ``--backend llamacpp``
would run and what that build supports. ``spectune llamacpp install`` runs in CI's setup (.ci/run), which builds the
server every llama.cpp test uses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spectune.backends.llamacpp.install import find_llama_server, server_features
from spectune.core.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def _server() -> str | None:
    try:
        return str(find_llama_server(None))
    except UserError:
        return None


@pytest.mark.skipif(_server() is None, reason="no llama-server (spectune llamacpp install builds one)")
def test_where_names_the_server_and_its_features() -> None:
    run = subprocess.run([sys.executable, "-m", "spectune.cli", "llamacpp", "where"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == _server()
    feats = server_features(_server())
    assert f"EAGLE-3: {'yes' if feats.eagle3 else 'no'}" in lines
    assert "EAGLE-3: yes" in lines  # the pinned release spectune builds has draft-eagle3
