"""The docs name only files that exist: a backtick-quoted path into the repository's own folders (``spectune/``,
``backends/``, ``loadgen/``, ``presets/``, ``benchmarks/``, ``tests/``) in any ``docs/**/*.md`` is a file of this
checkout, so a module that moves or is split takes its mentions along (docs/backends.md named ``backends/vllm.py``
after it became the ``backends/vllm/`` package). Upstream paths (``vllm/config/vllm.py``) are not checked."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.paths import DOCS, ROOT

OWN_PATH = re.compile(r"`((?:spectune|backends|loadgen|presets|benchmarks|tests)/[\w./-]+\.(?:py|json|md|yml))`")
"""A backtick-quoted path to a file under one of the repository's own top-level folders."""


def missing_paths(docs: Path, root: Path) -> list[str]:
    """``FILE:LINE: PATH`` for each :data:`OWN_PATH` under ``docs`` that names no file below ``root``."""
    found = []
    for md in sorted(docs.rglob("*.md")):
        for n, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{md.relative_to(docs)}:{n}: {m.group(1)}" for m in OWN_PATH.finditer(line)
                      if not (root / m.group(1)).is_file()]
    return found


def test_the_docs_name_only_files_that_exist():
    found = missing_paths(DOCS, ROOT)
    assert not found, "docs name files that do not exist:\n" + "\n".join(found)


def test_the_check_finds_a_missing_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "here.py").write_text("")
    (tmp_path / "docs" / "a.md").write_text("| `backends/here.py` | `backends/gone.py` | `vllm/config/vllm.py` |\n")
    assert missing_paths(tmp_path / "docs", tmp_path) == ["a.md:1: backends/gone.py"]
