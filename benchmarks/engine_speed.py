"""Engine speed per compute path vs llama.cpp (and optionally HF transformers), measured side by side in one run.

CPU part (always): SmolLM2-135M-Instruct (the embedded default, its Q4_1 GGUF with a Q8_0 embedding), greedy.
For each batch size of ``--batches`` (default 1, 4 and 16), every available engine path (``--dtype native``,
``bfloat16``, ``float32``; see ``backends/local/weights/compute_paths.py``) and llama.cpp's ``llama-server`` on the same
GGUF generate 64 new tokens (EOS ignored) from the same chat prompts; decode tokens/s = batch * 63 / (t(64 new tokens) -
t(1 new token)), so prefill is excluded for all of them; llama.cpp is timed the same way over HTTP (continuous batching,
raw token-id prompts, no prompt cache; as many slots as the largest batch, at least 8). Repeats are interleaved (path A,
B, C, llama.cpp, A, B, ...) and the median is printed, so a busy neighbour on the machine hits every column alike. Both
use ``--threads`` threads (default: all CPUs). Also printed: the CPU model and vector flags, torch's ATen CPU
capability, what ``--dtype auto`` picks here and its estimates, and the engine's speculative decoding at num_steps 0-3
with the bundled head (batch 1 and 8, the auto path), as output tokens/s including prefill on the first chat prompt(s);
``benchmarks/spec_speedup.py`` measures the batch-1 speedup over many real prompts.

To emulate an AVX2-only CPU on an AVX-512 one: ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2`` (ATen's, oneDNN's and MKL's kernels then use their AVX2 code; PyTorch's own
bf16-GEMM dispatch still sees the real CPU, so this is an approximation of an AVX2 machine, not one), with
``--server-bin`` naming a llama-server built without AVX-512 (``cmake -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON
-DGGML_F16C=ON -DGGML_AVX512=OFF``); the ``llama-server:`` line prints the features it was built with. The
compiled paths then use an inductor cache folder of their own (``compiled.isa_cache_dir``: kernels cached
without the override are wrong under it), so the first emulated run compiles from scratch.

CUDA part (when a GPU is present): a randomly initialised Llama-3.1-8B-shaped target in bf16, batch-1 num_steps 0
decode, as a percentage of the HBM roofline (weights bytes / measured device-to-device copy bandwidth).

``--paths native:int4,native:int8`` compares the two kernels of a Q8_0 lm_head (``spectune serve --native-lm-head``).
An ``@float32`` or ``@bfloat16`` suffix forces the native path's dense copy above ``dense_above`` rows
(``--native-dense-dtype``): ``--paths native@float32,native`` compares the float32 copy, the only dense kind a
batch-1-only path choice had, with the kind the multi-row probe picks (the bf16 copy through oneDNN on AMX and
AVX512-BF16 CPUs); ``auto`` is what ``--dtype auto`` picks now, from estimates at batch 1, 4 and 16.

A ``#ROWS`` suffix forces the row count above which the native path runs its dense copy (``--native-dense-above``;
``#off``: int4 at every row count): ``--paths native#2+compile,native+compile`` compares the choice the cache-resident
crossover probe made on a Zen 4 VM (dense above 2 rows) with the streamed probe's (issue #71).

A ``+pytorch`` suffix (last) builds the path with ``--cpu-kernels off``: PyTorch's SDPA, int8 and int4 kernels instead
of spectune's own (``backends/local/kernels``), so ``--paths native+compile,native+compile+pytorch`` measures them.

``native+compile`` is the native path with ``--compile on`` (the target's decode layers through torch.compile:
``backends/local/engine/compiled.py``); its one-off compile happens when the engine is built, before any timing, and is
printed. ``native+compile1`` (``+compile2``, ...) groups at most that many layers per compiled graph, to compare
group sizes: ``--paths native+compile1,native+compile2,native+compile5,native --skip-llamacpp --skip-spec``.
``native+compile+asserts`` keeps the size and stride checks of inductor's wrapper, which the engine turns off
(``compiled.NO_WRAPPER_ASSERTS``): ``--paths native+compile,native+compile+asserts --skip-llamacpp --skip-spec``.

Usage: ``python benchmarks/engine_speed.py [--repeats 3] [--threads N] [--batches 1,4,16]
[--paths native+compile,native,bfloat16,float32]
[--spec-path auto+compile] [--hf] [--skip-llamacpp] [--skip-spec]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

PROMPTS = ["Write a short story about a robot learning to paint.", "Explain how a refrigerator works.",
           "What are the benefits of regular exercise?", "Describe the water cycle.",
           "Give me a recipe for pancakes.", "Why do cats purr?", "Summarize the plot of Hamlet.",
           "How do airplanes stay in the air?"]


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def hf_decode_tok_s(folder, prompts: list[list[int]], batch: int, repeats: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
    ids = prompts[:batch]
    width = max(len(p) for p in ids)
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 2
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])

    def run(n: int) -> None:
        with torch.inference_mode():
            model.generate(input_ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           cache_implementation="static", pad_token_id=pad)

    run(4)  # warm-up
    deltas = [_timed(lambda: run(64)) - _timed(lambda: run(1)) for _ in range(repeats)]
    return batch * 63 / statistics.median(deltas)


def make_engine(path: str, threads: int, k: int = 0, capacity: int = 0, max_num_seqs: int = 8):
    """An engine on ``path``: a ``--dtype`` value, ``native:int4`` / ``native:int8`` to force the Q8_0 lm_head's
    kernel (``--native-lm-head``), ``native@float32`` / ``native@bfloat16`` to force the dense copy's dtype
    (``--native-dense-dtype``), ``#ROWS`` (``#off``) to force ``--native-dense-above``, and a ``+compile`` suffix for ``--compile on`` (otherwise off); ``+compileN``
    compiles at most N layers per graph instead of the engine's default (``compiled.MAX_LAYERS_PER_GRAPH``), and a
    final ``+asserts`` keeps the wrapper's size checks (``compiled.NO_WRAPPER_ASSERTS`` emptied); ``+pytorch`` (last)
    sets ``--cpu-kernels off``."""
    from spectune.backends.local.engine import compiled
    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions

    path, pytorch, _ = path.partition("+pytorch")
    path, asserts, _ = path.partition("+asserts")
    path, plus, group = path.partition("+compile")
    path, _, above = path.partition("#")
    path, _, dense = path.partition("@")
    dtype, _, lm_head = path.partition(":")
    default_group, default_options = compiled.MAX_LAYERS_PER_GRAPH, compiled.NO_WRAPPER_ASSERTS
    compiled.MAX_LAYERS_PER_GRAPH = int(group) if group else default_group
    compiled.NO_WRAPPER_ASSERTS = {} if asserts else default_options
    try:
        return build_engine(EngineOptions(num_steps=k, num_steps_capacity=capacity,
                                          draft=None if capacity else "none", dtype=dtype,
                                          max_num_seqs=max_num_seqs, max_model_len=512, kv_cache_gb=1.0,
                                          threads=threads, native_lm_head=lm_head or "auto",
                                          native_dense_dtype=dense or "auto", native_dense_above=above or "auto",
                                          compile="on" if plus else "off",
                                          cpu_kernels="off" if pytorch else "auto"))
    finally:
        compiled.MAX_LAYERS_PER_GRAPH, compiled.NO_WRAPPER_ASSERTS = default_group, default_options


def engine_timer(engine, prompts: list[list[int]], batch: int):
    """A function n -> seconds to generate n tokens for the first ``batch`` prompts (warmed up)."""
    from spectune.backends.local.engine.sequence import SamplingParams

    ids = prompts[:batch]

    def run(n: int) -> float:
        return _timed(lambda: engine.generate(ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)))

    run(4)
    return run


class LlamaServer:
    """``llama-server`` on the GGUF with ``slots`` slots; :meth:`timer` times n-token generations like the engine's."""

    def __init__(self, gguf: str, threads: int, server_bin: str | None = None, slots: int = 8) -> None:
        import socket
        import subprocess
        import urllib.request

        from spectune.backends.llamacpp.backend import cpu_workarounds
        from spectune.backends.llamacpp.install import find_llama_server

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.argv = [str(find_llama_server(server_bin)), "-m", gguf, "-t", str(threads), "-tb", str(threads), "-c",
                     str(slots * 512), "-np", str(slots), "--host", "127.0.0.1", "--port", str(self.port),
                     *cpu_workarounds()]
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("llama-server did not start")

    def _one(self, ids: list[int], n: int) -> None:
        import json
        import urllib.request

        body = json.dumps({"prompt": ids, "n_predict": n, "temperature": 0.0, "ignore_eos": True,
                           "cache_prompt": False}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", body,
                                     {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=600).read()

    def timer(self, prompts: list[list[int]], batch: int):
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(batch)

        def run(n: int) -> float:
            return _timed(lambda: list(pool.map(lambda ids: self._one(ids, n), prompts[:batch])))

        run(4)
        return run

    def cpu_features(self) -> str:
        """The CPU features this llama-server was built with: its ``system_info`` line (``AVX2 = 1 | ...``). llama.cpp
        logs it with ``COM_TRC`` (``common/common.cpp``, ``common_params_get_system_info``), i.e. at the trace level
        4 of ``-lv`` (``common/arg.cpp``: 3 info, the default; 4 trace), so a second short-lived process started with
        ``-lv 4`` prints it and the timed server keeps the default verbosity."""
        import subprocess

        argv = [self.argv[0], "-m", self.argv[2], "-lv", "4", "--host", "127.0.0.1", "--port", "0"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = ""
        try:
            for ln in proc.stdout:
                if "system_info" in ln:
                    line = ln
                    break
        finally:
            proc.kill()
            proc.wait()
        return " ".join(line.split("|", 1)[-1].split())[:300]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def decode_tok_s(run, batch: int) -> float:
    """batch * 63 / (t(64) - t(1)) for one repeat."""
    return batch * 63 / (run(64) - run(1))


def cpu_description() -> str:
    """The CPU line (:func:`spectune.measure.environment.cpu_line`: model name, vector flags) and torch's ATen CPU
    capability."""
    from spectune.measure.environment import cpu_line

    return f"{cpu_line()}; torch ATen capability {torch.backends.cpu.get_cpu_capability()}"


def cuda_roofline_percent(repeats: int) -> str:
    """Batch-1 decode of a random Llama-3.1-8B-shaped bf16 model on CUDA as % of the HBM roofline."""
    from spectune.backends.local.model.attention import AttnMeta
    from spectune.backends.local.model.config import ModelConfig
    from spectune.backends.local.model.kv_cache import KVCache
    from spectune.backends.local.model.target import TargetModel

    cfg = ModelConfig(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                      max_position_embeddings=8192)
    with torch.device("cuda"):
        model = TargetModel(cfg).to(torch.bfloat16).eval().requires_grad_(False)
    model.build_rope(2048)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    src = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    copy_bw = 2 * src.numel() * 10 / (time.perf_counter() - t)  # read + write bytes/s
    cache = KVCache(cfg.num_layers, 1, 2048, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, "cuda")
    from spectune.backends.local.engine.cuda_graphs import CapturedGraphs

    graphs = CapturedGraphs(num_slots=1, max_len=2048, capture=True)

    def forward(tokens, positions, _features, kv):
        meta = AttnMeta.for_batch(cache, model.rope, positions, cfg.num_heads // cfg.num_kv_heads, kv)
        hidden, _ = model(tokens, meta)
        return model.logits(hidden[:, -1])

    tok = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.full((1, 1), 512, device="cuda")
    with torch.inference_mode():
        for _ in range(3):
            graphs.run("target", forward, tok, pos, None)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats * 20):
            t = time.perf_counter()
            graphs.run("target", forward, tok, pos, None)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    step = statistics.median(times)
    roof = weight_bytes / copy_bw
    return (f"CUDA {torch.cuda.get_device_name()}: 8B-shaped bf16 decode step {step * 1e3:.2f} ms, roofline "
            f"{roof * 1e3:.2f} ms (weights {weight_bytes / 1e9:.1f} GB / copy bandwidth {copy_bw / 1e12:.2f} TB/s) "
            f"-> {100 * roof / step:.0f}% of roofline, {1 / step:.0f} tok/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="engine and llama.cpp threads (0: all CPUs)")
    parser.add_argument("--paths", default="native+compile,native,bfloat16,float32")
    parser.add_argument("--batches", default="1,4,16", help="batch sizes of the decode table")
    parser.add_argument("--spec-path", default="auto+compile", help="path of the speculative table (what the local "
                        "sweep backend runs: --dtype auto, --compile auto)")
    parser.add_argument("--hf", action="store_true", help="add HF transformers (bf16) as a column")
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--skip-spec", action="store_true")
    parser.add_argument("--server-bin", default=None,
                        help="llama-server to compare with (default: PATH, then spectune's build); e.g. an AVX2-only "
                             "build next to ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2")
    args = parser.parse_args()
    import os

    from rich.console import Console
    from rich.table import Table

    from spectune.backends.local.engine.tokenizer import Tokenizer
    from spectune.backends.local.weights.loader import convert_gguf, default_model_path

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    gguf = default_model_path()
    folder = convert_gguf(gguf)
    tok = Tokenizer(folder)
    batches = [int(b) for b in args.batches.split(",") if b]
    slots = max(batches + [8])
    chats = [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" (version {i // len(PROMPTS) + 1})")
             for i in range(slots)]
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in chats]
    console = Console(width=200)
    console.print(f"CPU: {cpu_description()}; {threads} threads; load average {os.getloadavg()}", markup=False)
    paths = [p for p in args.paths.split(",") if p]
    engines = {p: make_engine(p, threads, max_num_seqs=slots) for p in paths}
    for p, e in engines.items():
        console.print(f"{p}: kernel ranges {e.path.kernel_ranges()}", markup=False)
    for p, e in engines.items():
        if e.path.compile["mode"] != "off":
            console.print(f"{p}: compile {e.path.compile}", markup=False)
    auto = make_engine("auto", threads)
    console.print(f"--dtype auto here: {auto.path.to_json()}", markup=False)
    del auto
    llama = None if args.skip_llamacpp else LlamaServer(str(gguf), threads, args.server_bin, slots)
    if llama is not None:
        console.print(f"llama-server: {llama.cpu_features()}", markup=False)
    table = Table(title=f"SmolLM2-135M-Instruct decode tokens/s on CPU, num_steps 0, greedy, {threads} threads "
                        f"(median of {args.repeats}, interleaved)")
    cols = [f"spectune {p}" for p in paths] + ([] if llama is None else ["llama.cpp Q4_1"])
    cols += ["HF bf16"] if args.hf else []
    table.add_column("batch", justify="right")
    for c in cols:
        table.add_column(c, justify="right")
    if llama is not None:
        for p in paths:
            table.add_column(f"{p} / llama.cpp", justify="right")
    try:
        for batch in batches:
            runs = {f"spectune {p}": engine_timer(e, prompts, batch) for p, e in engines.items()}
            if llama is not None:
                runs["llama.cpp Q4_1"] = llama.timer(prompts, batch)
            vals: dict[str, list[float]] = {c: [] for c in runs}
            for _ in range(args.repeats):
                for c, run in runs.items():
                    vals[c].append(decode_tok_s(run, batch))
            med = {c: statistics.median(v) for c, v in vals.items()}
            if args.hf:
                med["HF bf16"] = hf_decode_tok_s(folder, prompts, batch, args.repeats)
            row = [str(batch)] + [f"{med[c]:.1f}" for c in cols]
            if llama is not None:
                row += [f"{med[f'spectune {p}'] / med['llama.cpp Q4_1']:.2f}x" for p in paths]
            table.add_row(*row)
            console.print(f"batch {batch} raw: " + "; ".join(f"{c} {[round(x, 1) for x in v]}"
                                                            for c, v in vals.items()), markup=False)
    finally:
        if llama is not None:
            llama.close()
    console.print(table)
    del engines
    if not args.skip_spec:
        spec = Table(title=f"spectune output tok/s incl. prefill (64 tokens, greedy, bundled head, {args.spec_path})")
        spec.add_column("batch", justify="right")
        for k in range(4):
            spec.add_column(f"K={k}", justify="right")
        spec.add_column("K=2 / K=0", justify="right")
        spec.add_column("K=3 / K=0", justify="right")
        engine = make_engine(args.spec_path, threads, 0, 3)
        for batch in (1, 8):
            run = engine_timer(engine, prompts, batch)
            vals = {k: [] for k in range(4)}
            for _ in range(args.repeats):
                for k in range(4):
                    engine.set_num_steps(k)
                    vals[k].append(batch * 64 / run(64))
            med = [statistics.median(vals[k]) for k in range(4)]
            spec.add_row(str(batch), *(f"{v:.1f}" for v in med), f"{med[2] / med[0]:.2f}x", f"{med[3] / med[0]:.2f}x")
        console.print(spec)
    if torch.cuda.is_available():
        console.print(cuda_roofline_percent(args.repeats))
    else:
        console.print("CUDA: no GPU available on this machine; the 8B-shaped roofline figure was not measured.")


if __name__ == "__main__":
    main()
