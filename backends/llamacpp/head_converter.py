"""llama.cpp's own converter as the second writer of the head GGUF (``export_head_gguf(..., llama_cpp_dir)``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spectune.backends.llamacpp.eagle3_names import OUTTYPE
from spectune.backends.llamacpp.head_checkpoint import HeadInfo
from spectune.backends.llamacpp.head_target import target_hf_dir
from spectune.core.errors import UserError


def run_converter(head: HeadInfo, target: Path, out: Path, llama_cpp_dir: Path) -> None:
    """Write ``out`` with llama.cpp's own ``convert_hf_to_gguf.py HEAD --target-model-dir TARGET_HF_DIR --outtype
    bf16 --outfile OUT`` (a subprocess, that tree's ``gguf-py`` first on ``PYTHONPATH``).

    Raises:
        UserError: the tree has no converter; it failed (its last log line) or ran for 30 minutes.
    """
    tree = Path(llama_cpp_dir).expanduser()
    script = tree / "convert_hf_to_gguf.py"
    if not script.is_file() or not (tree / "gguf-py").is_dir():
        raise UserError(f"--llama-cpp-dir {tree} has no convert_hf_to_gguf.py and gguf-py/: give a llama.cpp source "
                        "tree (`spectune llamacpp install` keeps one), or omit it to use spectune's writer")
    hf_dir = target_hf_dir(target)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "gguf-py"), *filter(None, [env.get("PYTHONPATH")])])
    argv = [sys.executable, str(script), str(head.folder), "--target-model-dir", str(hf_dir), "--outtype", OUTTYPE,
            "--outfile", str(out)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    except subprocess.TimeoutExpired:
        raise UserError(f"llama.cpp's convert_hf_to_gguf.py ran for 30 minutes on {head.folder}: stopped") from None
    if proc.returncode != 0 or not out.is_file():
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit code {proc.returncode}"
        hint = (f"; install it (llama.cpp lists its converter's modules in {tree}/requirements/"
                "requirements-convert_hf_to_gguf.txt)") if "No module named" in last else ""
        raise UserError(f"llama.cpp's convert_hf_to_gguf.py failed on {head.folder}: {last}{hint}")
