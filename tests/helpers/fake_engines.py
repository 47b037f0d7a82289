"""Stand-ins for the engine programs the ``vllm`` and ``sglang`` backends launch, built on tests/helpers/fake_server.py.

:func:`install` writes, under a folder:

- ``py/vllm/entrypoints/openai/api_server.py``: the module ``python -m vllm.entrypoints.openai.api_server`` runs
  (``vllm_argv``: ``--model MODEL --host H --port P [--max-num-seqs N] [--speculative-config JSON]
  [--per-request-spec-decode-metrics summary] ...``); point ``SPECTUNE_VLLM_PYTHON`` at this Python (with ``py`` on
  PYTHONPATH) so the backend launches it;
- ``py/sglang/launch_server.py``: the module ``python -m sglang.launch_server`` runs (``sglang_argv``:
  ``--model-path M --host H --port P [--speculative-algorithm A --speculative-draft-model-path D
  --speculative-num-steps K ...]``), found by the sglang backend's ``find_spec("sglang")``;
- ``py/vllm-0.29.0.dist-info``: package metadata that makes the found vLLM 0.29 (``spectune.backends.vllm.install``
  reads it), so the backend asks for per-request spec-decode metrics as it does with a real vLLM >= 0.29.

Put ``py`` on PYTHONPATH of the spectune process. Each launch appends one JSON line to
``argv.jsonl`` (its pid and its argv, exactly as received), then serves as the fake server with the num_steps
read from the engine's own flags: vLLM's ``num_speculative_tokens`` from ``--speculative-config`` (no flag: 0,
``/metrics`` with ``vllm:`` counters), SGLang's ``--speculative-num-steps`` (no flag: 0; no ``/metrics``, spec
details in the responses when asked). Acceptance probability ``FAKE_ENGINE_ACCEPT`` (default 0.7), decode speed
``FAKE_ENGINE_TPS`` tokens/s (default 2000). The vLLM stand-in also fails at start when the head's path contains
``rejected-head`` (as vLLM does for a head it cannot load), exits after ``FAKE_ENGINE_EXIT_AFTER`` completions,
waits ``FAKE_ENGINE_STARTUP_DELAY`` s before listening, and with ``FAKE_ENGINE_IGNORE_K=N`` drafts N tokens per
step whenever it has a speculative config, whatever its ``num_speculative_tokens`` (an engine that ignores the K it
was given, what ``spectune sweep``'s schedule check must catch).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def install(folder: Path) -> dict[str, Path]:
    """Write the stand-ins under ``folder``; returns {"bin", "py", "log"}."""
    bin_dir, py_dir = folder / "bin", folder / "py"
    (py_dir / "sglang").mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = folder / "argv.jsonl"
    boot = f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport fake_engines\n"
    openai = py_dir / "vllm" / "entrypoints" / "openai"
    openai.mkdir(parents=True, exist_ok=True)
    for pkg in (py_dir / "vllm", py_dir / "vllm" / "entrypoints", openai):
        (pkg / "__init__.py").write_text("")
    (openai / "api_server.py").write_text(
        f"{boot}if __name__ == '__main__':\n    fake_engines.vllm_main({str(log)!r})\n")
    (py_dir / "sglang" / "__init__.py").write_text("")
    (py_dir / "sglang" / "launch_server.py").write_text(
        f"{boot}if __name__ == '__main__':\n    fake_engines.sglang_main({str(log)!r})\n")
    meta = py_dir / "vllm-0.29.0.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.29.0\n")
    return {"bin": bin_dir, "py": py_dir, "log": log}


def _record(log: str, engine: str) -> None:
    with open(log, "a") as f:
        f.write(json.dumps({"engine": engine, "pid": os.getpid(), "argv": sys.argv[1:]}) + "\n")


def _serve(host: str, port: int, steps: int, metrics: str, model: str, extra: list[str]) -> None:
    import fake_server

    fake_server.main(["--host", host, "--port", str(port), "--steps", str(steps), "--metrics", metrics,
                      "--model", model, "--accept-prob", os.environ.get("FAKE_ENGINE_ACCEPT", "0.7"),
                      "--tokens-per-second", os.environ.get("FAKE_ENGINE_TPS", "2000"), *extra])


def vllm_main(log: str) -> None:
    """``python -m vllm.entrypoints.openai.api_server --model MODEL ...``."""
    _record(log, "vllm")
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("--model", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--speculative-config")
    p.add_argument("--per-request-spec-decode-metrics", choices=["summary"])
    args, _ = p.parse_known_args()
    spec = json.loads(args.speculative_config) if args.speculative_config else {}
    extra = ["--per-request-metrics"] if args.per_request_spec_decode_metrics else []
    if "rejected-head" in str(spec.get("model", "")):  # what vLLM prints for a head it cannot load, then exits 1
        extra += ["--fail-start", "--fail-message", "ValueError: fake vLLM: unsupported draft head architecture"]
    if os.environ.get("FAKE_ENGINE_EXIT_AFTER"):
        extra += ["--exit-after-requests", os.environ["FAKE_ENGINE_EXIT_AFTER"]]
    if os.environ.get("FAKE_ENGINE_STARTUP_DELAY"):
        extra += ["--startup-delay", os.environ["FAKE_ENGINE_STARTUP_DELAY"]]
    steps = int(spec.get("num_speculative_tokens", 0))
    if steps > 0 and os.environ.get("FAKE_ENGINE_IGNORE_K"):
        steps = int(os.environ["FAKE_ENGINE_IGNORE_K"])
    _serve(args.host, args.port, steps, "vllm", args.model, extra)


def sglang_main(log: str) -> None:
    """``python -m sglang.launch_server --model-path M ...``."""
    _record(log, "sglang")
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--speculative-num-steps", type=int, default=0)
    args, _ = p.parse_known_args()
    _serve(args.host, args.port, args.speculative_num_steps, "none", args.model_path, [])
