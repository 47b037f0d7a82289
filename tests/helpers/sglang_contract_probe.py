"""Run spectune's SGLang adaptive configs through SGLang's own code; print one JSON object with what it found.

    PYTHONPATH=SGLANG_DIR:REPO python tests/sglang_contract_probe.py INPUT.json

INPUT.json: ``{"configs": [{"path": FILE, "launch_steps": K or null}, ...], "batches": N, "seed": S}``. For each
config file it reports SGLang's candidate union (``resolve_candidate_steps_from_config``), what SGLang's start-up
check (``_init_adaptive_speculative_params``, ``arg_groups/speculative_hook.py``) does with ``launch_steps`` and
without a value, and whether spectune's ``AdaptivePolicy`` and SGLang's ``AdaptiveSpeculativeParams`` choose the same
num_steps over N random verify batches (random batch sizes and accepted drafts), from SGLang's initial tier. It
also reports SGLang's ``DEFAULT_ADAPTIVE_CONFIG`` and the algorithms SGLang's ``SpeculativeAlgorithm`` parses. With
``"throughput": {"configs": [FILE, ...], "cost_table": {bs: {steps: ms}}, "cuda_graph_bs": [...]}`` it also replays
each ``"strategy": "throughput_aware"`` config through SGLang's ``ThroughputAwareAdaptiveController`` and spectune's
``ThroughputAwarePolicy`` (reported as unavailable when this SGLang has no such strategy: 0.5.23 has none).

SGLang is imported from a wheel installed without its dependencies (``pip install --no-deps --target``) plus the few
pure-Python modules its import chain needs; Triton (a GPU compiler, ~1 GB, never called by this code) is replaced by
SGLang's own stub for platforms without it (``sglang/_platform_stubs.py``, used on macOS). It runs in a subprocess
because importing SGLang patches torch and transformers process-wide.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import random
import sys
from types import SimpleNamespace


def install_triton_stub() -> None:
    """SGLang's macOS Triton stub, installed here by presenting the platform it is written for."""
    if importlib.util.find_spec("triton") is not None:
        return
    import psutil  # noqa: F401 - import before sys.platform is faked (psutil picks its backend at import)
    import torch

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not importable: put its install folder on PYTHONPATH")
    path = list(spec.submodule_search_locations)[0] + "/_platform_stubs.py"
    stub_spec = importlib.util.spec_from_file_location("_sglang_platform_stubs", path)
    stubs = importlib.util.module_from_spec(stub_spec)
    sys.modules[stub_spec.name] = stubs
    stub_spec.loader.exec_module(stubs)  # type: ignore[union-attr]
    real = (sys.platform, platform.machine, torch.backends.mps.is_available)
    sys.platform, platform.machine, torch.backends.mps.is_available = "darwin", (lambda: "arm64"), (lambda: True)
    try:
        stubs.install_platform_stubs()
    finally:
        sys.platform, platform.machine, torch.backends.mps.is_available = real


def start_up(init, path: str, steps: int | None) -> dict:
    """SGLang's start-up handling of ``--speculative-num-steps`` ``steps`` with adaptive config ``path``."""
    args = SimpleNamespace(speculative_adaptive_config=path, speculative_eagle_topk=None,
                           speculative_num_steps=steps, speculative_num_draft_tokens=None)
    try:
        init(args)
    except ValueError as err:
        return {"accepted": False, "error": str(err)}
    try:  # current SGLang declares resolved values (arg_groups/overrides.py) instead of setting them
        from sglang.srt.arg_groups.overrides import resolution_result
    except ImportError:
        resolution_result = getattr  # type: ignore[assignment]
    return {"accepted": True, "num_steps": resolution_result(args, "speculative_num_steps"),
            "num_draft_tokens": resolution_result(args, "speculative_num_draft_tokens"),
            "topk": resolution_result(args, "speculative_eagle_topk")}


def replay(path: str, initial: int, batches: int, seed: int) -> dict:
    """Both policies over the same random verify batches; the first differing batch, if any."""
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    from spectune.backends.num_steps.sglang_config import load_config_file
    from spectune.backends.num_steps.ema_policy import AdaptivePolicy

    theirs = AdaptiveSpeculativeParams(initial_steps=initial, cfg_path=path)
    ours = AdaptivePolicy(load_config_file(path, strict=False), initial_steps=initial)
    rng = random.Random(seed)
    for i in range(batches):
        bs = rng.choice([1, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96])
        k_theirs, k_ours = theirs.get_steps_for_batch(bs), ours.steps_for_batch(bs)
        if k_theirs != k_ours:
            return {"same": False, "batch": i, "batch_size": bs, "sglang": k_theirs, "spectune": k_ours}
        accepted = [rng.randint(0, k_theirs) for _ in range(bs)]
        theirs.on_verify_complete(accepted, bs)
        ours.on_verify(accepted, bs)
    return {"same": True, "batches": batches}


def replay_throughput(path: str, cost_table: dict, graph_bs: list[int], batches: int, seed: int) -> dict:
    """SGLang's ``ThroughputAwareAdaptiveController`` (driven through a stand-in worker: it only builds and applies
    runtime states, and its cost table is filled from ``cost_table`` instead of GPU profiling) and spectune's
    ``ThroughputAwarePolicy`` over the same random verify batches; the first differing batch, if any."""
    from types import SimpleNamespace as NS

    from sglang.srt.speculative.throughput_aware_controller import ThroughputAwareAdaptiveController

    from spectune.backends.num_steps.sglang_config import load_config_file
    from spectune.backends.num_steps.throughput_policy import CostTable, ThroughputAwarePolicy

    cfg = load_config_file(path, strict=False)
    worker = NS(speculative_num_steps=cfg.server_initial_steps, server_args=NS(context_length=4096))
    worker.build_adaptive_runtime_state = lambda speculative_num_steps, speculative_num_draft_tokens, \
        cuda_graph_bs=None: NS(speculative_num_steps=speculative_num_steps)
    worker.apply_runtime_state = lambda state: setattr(worker, "speculative_num_steps", state.speculative_num_steps)
    theirs = ThroughputAwareAdaptiveController(worker, path)
    theirs.init_states(graph_bs)
    table = CostTable.from_json(cost_table)
    for steps, sizes in theirs._build_profile_grid().items():  # what SGLang's start-up profile would time
        for bs in sizes:
            if (bs, steps) in table.entries:
                theirs._cost_table.set(bs, steps, table.entries[(bs, steps)])
    ours = ThroughputAwarePolicy(cfg, table, initial_steps=cfg.server_initial_steps, cuda_graph_bs=graph_bs)
    rng = random.Random(seed)
    switches = 0
    for i in range(batches):
        bs = rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
        theirs.activate_step_by_batch(bs)
        k_theirs, k_ours = worker.speculative_num_steps, ours.steps_for_batch(bs)
        if k_theirs != k_ours:
            return {"same": False, "batch": i, "batch_size": bs, "sglang": k_theirs, "spectune": k_ours}
        scale = 0.4 if (i // 400) % 2 else 1.0  # acceptance drops every other 400 batches: the best step moves
        accepted = [min(k_theirs, int(rng.random() * (k_theirs + 1) * scale)) for _ in range(bs)]
        theirs.on_verify_complete(accepted, bs)
        ours.on_verify(accepted, bs)
    return {"same": True, "batches": batches, "switches": ours.switch_count}


def main() -> None:
    job = json.loads(open(sys.argv[1]).read())
    install_triton_stub()
    from sglang.srt.arg_groups.speculative_hook import _init_adaptive_speculative_params
    from sglang.srt.speculative import adaptive_spec_params as asp
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from spectune.backends.num_steps.sglang_config import load_config_file

    import sglang

    out: dict = {"sglang_version": getattr(sglang, "__version__", None),
                 "default_config": asp.DEFAULT_ADAPTIVE_CONFIG, "configs": []}
    algorithms = {}
    for name in ("EAGLE", "EAGLE3"):
        algo = SpeculativeAlgorithm.from_string(name)
        algorithms[name] = {"is_eagle": bool(algo.is_eagle()), "is_eagle3": bool(algo.is_eagle3())}
    out["algorithms"] = algorithms
    for item in job["configs"]:
        path = item["path"]
        entry: dict = {"path": path, "union": asp.resolve_candidate_steps_from_config(path),
                       "spectune_union": list(load_config_file(path, strict=False).candidate_steps),
                       "spectune_initial": load_config_file(path, strict=False).server_initial_steps,
                       "without_num_steps": start_up(_init_adaptive_speculative_params, path, None)}
        for key in ("launch_steps", "rejected_steps"):
            if item.get(key) is not None:
                entry[key] = start_up(_init_adaptive_speculative_params, path, item[key])
        initial = entry["without_num_steps"].get("num_steps")
        entry["replay"] = replay(path, initial, job.get("batches", 4000), job.get("seed", 0))
        if item.get("launch_steps") is not None:
            entry["replay_from_launch"] = replay(path, item["launch_steps"], job.get("batches", 4000),
                                                 job.get("seed", 0) + 1)
        out["configs"].append(entry)
    if job.get("throughput"):
        t = job["throughput"]
        if importlib.util.find_spec("sglang.srt.speculative.throughput_aware_controller") is None:
            out["throughput"] = {"available": False}
        else:
            out["throughput"] = {"available": True, "union": {}, "replay": {}}
            for path in t["configs"]:
                out["throughput"]["union"][path] = asp.resolve_candidate_steps_from_config(path)
                out["throughput"]["replay"][path] = replay_throughput(path, t["cost_table"], t["cuda_graph_bs"],
                                                                      job.get("batches", 4000), job.get("seed", 0))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
