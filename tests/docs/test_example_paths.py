"""The shipped example folders (docs/examples) name no machine's folders: a user who clones the repository, or reads
the files on GitHub, gets paths that mean something on their machine too. Paths in them are relative (to the run's
own folder for its logs, to the repository root for what the README commands name, to the file's folder for a vLLM
``--speculative-config``'s ``model``), under the home folder as ``~/``, or the bundled head by its package path
(``backends/local/heads/NAME``). Gzipped files (``requests.jsonl.gz``) are read through gzip; images are skipped."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from helpers.paths import EXAMPLES, ROOT

ABSOLUTE = re.compile(r"(?<![\w.~:/-])/(?:work|tmp|root|home|opt|Users|mnt|scratch|srv|data|var|private)/"
                      r"|(?<![\w])[A-Z]:\\")
"""An absolute path into a machine's own folders (POSIX top-level folders where runs, checkouts, caches and homes
live; a Windows drive, upper case as Windows writes it: a model's ``with open(...) as f:\\n`` in a JSON-escaped
response is not one). A URL's path (``http://host:8000/v1/...``) and ``~/`` do not match."""

BINARY = {".png", ".jpg", ".jpeg", ".gif", ".pdf"}


def text_of(path: Path) -> str | None:
    """The text of ``path`` (a ``.gz`` file decompressed), or None for an image or a file that is not UTF-8."""
    if path.suffix.lower() in BINARY:
        return None
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def absolute_paths(root: Path) -> list[str]:
    """``FILE:LINE: excerpt`` for each line under ``root`` holding an absolute machine path (:data:`ABSOLUTE`)."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        text = text_of(path)
        for n, line in enumerate((text or "").splitlines(), 1):
            m = ABSOLUTE.search(line)
            if m:
                excerpt = line[max(0, m.start() - 40):m.start() + 80].strip()
                found.append(f"{path.relative_to(root)}:{n}: ...{excerpt}...")
    return found


def test_the_examples_name_no_absolute_machine_path():
    assert EXAMPLES.is_dir()
    found = absolute_paths(EXAMPLES)
    assert not found, (f"{len(found)} lines in docs/examples name a machine's folders (write them relative, as "
                       "~/..., or the bundled head by its package path):\n" + "\n".join(found))


def test_the_check_finds_paths_in_text_and_gzip_and_leaves_urls_alone(tmp_path):
    """The check can fail: a planted path is found in a JSON file and inside a gzipped file, with its line; URLs,
    ``~/`` and relative paths pass."""
    run = tmp_path / "ex" / "sweep"
    run.mkdir(parents=True)
    (run / "sweep.json").write_text('{\n  "log": "logs/server-steps0.log",\n  "url": "http://127.0.0.1:8000/v1/x",\n'
                                    '  "bin": "~/.cache/spectune/llama-server",\n'
                                    '  "draft": "/home/me/heads/h"\n}\n')
    (run / "requests.jsonl.gz").write_bytes(gzip.compress(b'{"a": 1}\n{"model": "/tmp/t/model.gguf"}\n'))
    (run / "plot.png").write_bytes(b"\x89PNG /work/x/")
    assert absolute_paths(tmp_path) == [
        'ex/sweep/requests.jsonl.gz:2: ...{"model": "/tmp/t/model.gguf"}...',
        'ex/sweep/sweep.json:5: ..."draft": "/home/me/heads/h"...',
    ]
    (tmp_path / "gen.jsonl").write_text('{"output_text": "with open(p) as f:\\n    x = 1"}\n')  # escaped newline
    assert not any(line.startswith("gen.jsonl") for line in absolute_paths(tmp_path))
    for planted in ("/work/main/x", "/root/.cache/x", "/opt/x/y", "/Users/me/x", "C:\\runs\\x"):
        (tmp_path / "more.md").write_text(f"Config `{planted}`\n")
        assert absolute_paths(tmp_path)[-1].startswith("more.md:1:"), planted


def test_the_bundled_heads_name_no_absolute_machine_path():
    """The bundled heads' evaluation records and READMEs ship in the wheel: a dataset read from a machine's own
    folder is named by its file (``spec-bench:spec_bench_question.jsonl``), not by where it lay."""
    heads = ROOT / "backends" / "local" / "heads"
    assert heads.is_dir()
    found = [line for head in sorted(p for p in heads.iterdir() if p.is_dir()) for line in absolute_paths(head)
             if not line.split(":", 1)[0].endswith(".safetensors")]
    assert not found, "the bundled heads name a machine's folders:\n" + "\n".join(found)
