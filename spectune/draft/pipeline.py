"""``spectune draft train``: prompts -> self-distilled responses -> target features -> EAGLE-3 training -> export.

Every stage writes into the work folder and resumes where an interrupted run stopped, so training can run in chunks
on a CPU (``--stage`` runs one stage; rerunning the same command continues).
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from spectune.backends.local.weights.loader import load_target
from spectune.core.json_types import JsonObject
from spectune.draft.data import (TRAINING_IDS_FILE, evaluation_texts, generate_responses, magpie_prompts, read_jsonl,
                                 require_rows, training_prompts, write_jsonl)
from spectune.draft.options import DataOptions
from spectune.core.errors import UserError

if TYPE_CHECKING:
    from spectune.draft.train import TrainConfig

STAGES = ("data", "features", "train", "export")


@dataclass(kw_only=True)
class PipelineOptions(DataOptions):
    """Options of ``spectune draft train``: the data's (:class:`spectune.draft.options.DataOptions`; the work folder
    also holds the checkpoints, responses are capped for self-distillation) and:

    Attributes:
        output: folder receiving the trained head (safetensors + config.json + card).
        num_prompts: ShareGPT prompts to regenerate responses for.
        magpie_prompts: prompts the target writes itself (Magpie), answered after the ShareGPT ones.
        spec_bench: Spec-Bench JSONL whose prompts are excluded from training (optional).
        stages: which stages to run.
    """

    output: Path
    max_new_tokens: int = 256
    max_prompt_tokens: int = 512
    num_prompts: int = 6000
    magpie_prompts: int = 0
    spec_bench: Path | None = None
    stages: tuple[str, ...] = STAGES


def run_pipeline(opts: PipelineOptions, train_cfg: TrainConfig, say: Callable[[str], None]) -> JsonObject:
    """Run the requested stages; returns the training card (also written to the output folder)."""
    import torch

    from spectune.draft.features import FeatureStore, extract_features
    from spectune.draft.train import train

    work = opts.work_dir
    work.mkdir(parents=True, exist_ok=True)
    card_path = work / "card.json"
    card: JsonObject = json.loads(card_path.read_text()) if card_path.is_file() else {"stages": {}}
    if "data" in opts.stages:
        t0 = time.time()
        engine = opts.response_engine()
        prompts_path = work / "prompts.jsonl"
        if not prompts_path.is_file():
            exclude = evaluation_texts(opts.spec_bench)
            write_jsonl(prompts_path, training_prompts(engine.tokenizer, opts.num_prompts, opts.max_prompt_tokens,
                                                       exclude, train_cfg.seed))
            say(f"{len(read_jsonl(prompts_path))} training prompts ({len(exclude)} evaluation prompts excluded)")
        prompts = read_jsonl(prompts_path)[: opts.num_prompts]
        if opts.magpie_prompts > 0:
            prompts += magpie_prompts(engine, opts.magpie_prompts, opts.max_prompt_tokens,
                                      evaluation_texts(opts.spec_bench), train_cfg.seed, work / "magpie-prompts.jsonl",
                                      progress=lambda d, n: say(f"magpie prompts {d}/{n}"))
        produced = generate_responses(engine, prompts, work / "responses.jsonl", opts.max_new_tokens, 256,
                                      lambda d, n, k: say(f"responses {d}/{n} ({k} tokens this run)"))
        prev = card["stages"].get("data", {})  # a resumed or extended run adds to the earlier runs' totals
        card["stages"]["data"] = {"prompts": len(prompts), "sharegpt_prompts": len(prompts) - opts.magpie_prompts,
                                  "magpie_prompts": opts.magpie_prompts,
                                  "new_tokens": prev.get("new_tokens", 0) + produced,
                                  "wall_s": prev.get("wall_s", 0.0) + time.time() - t0}
        _write(card_path, card)
    target = None
    if "features" in opts.stages or "train" in opts.stages:
        target, _ = load_target(opts.model, torch.bfloat16, "cpu")
        c = target.cfg
        target.capture_layers = (1, c.num_layers // 2 - 1, c.num_layers - 4)
        target.build_rope(train_cfg.max_len + 8)
    if "features" in opts.stages:
        t0 = time.time()
        rows = require_rows(work / "responses.jsonl", "responses")
        index = extract_features(target, rows, work, train_cfg.max_len,
                                 progress=lambda d, n: say(f"features {d}/{n}"))
        card["stages"]["features"] = {"sequences": len(index["sequences"]),
                                      "tokens": sum(s[1] for s in index["sequences"]), "wall_s": time.time() - t0}
        _write(card_path, card)
    if "train" in opts.stages:
        t0 = time.time()
        store = FeatureStore(work)
        if len(store) == 0:
            raise UserError(f"{work} has no features: run `spectune draft train --stage features` first")
        last = [0.0]

        def log(rec: JsonObject) -> None:
            if "val_acc" in rec:
                say(f"epoch {rec['epoch']}: validation top-1 per draft step {[round(a, 3) for a in rec['val_acc']]}")
                card.setdefault("validation", []).append(rec)
            elif time.time() - last[0] > 30:
                last[0] = time.time()
                say(f"step {rec['step']}/{rec['total_steps']} loss {rec['loss']:.3f} "
                    f"acc {[round(a, 3) for a in rec['acc']]} lr {rec['lr']:.2e}")

        head = train(target, store, train_cfg, work / "checkpoint.pt", log)
        torch.save(head.state_dict(), work / "head_state.pt")
        card["stages"]["train"] = {"config": asdict(train_cfg), "sequences": len(store),
                                   "tokens": int(sum(s[1] for s in store.seqs)), "wall_s": time.time() - t0,
                                   "device": "cpu", "threads": torch.get_num_threads(),
                                   "host": platform.processor() or platform.machine()}
        _write(card_path, card)
    if "export" in opts.stages:
        _export(opts, train_cfg, card)
    return card


def _export(opts: PipelineOptions, train_cfg: TrainConfig, card: JsonObject) -> None:
    import torch

    from spectune.backends.local.weights.heads import save_head
    from spectune.draft.train import new_head

    state_path = opts.work_dir / "head_state.pt"
    if not state_path.is_file():
        raise UserError(f"{state_path} is missing: run `spectune draft train --stage train` first")
    state = torch.load(state_path, weights_only=True)
    target, _ = load_target(opts.model, torch.float32, "cpu")
    c = target.cfg
    vocab_ids = state["d2t"] + torch.arange(len(state["d2t"]))
    head = new_head(target, vocab_ids, (1, c.num_layers // 2 - 1, c.num_layers - 4), train_cfg.seed)
    head.load_state_dict(state)
    head = head.to(torch.bfloat16)
    save_head(head, opts.output)
    (opts.output / "training.json").write_text(json.dumps(card, indent=2) + "\n")

    ids = [row["id"] for row in read_jsonl(opts.work_dir / "responses.jsonl")]  # the sequences trained on
    (opts.output / TRAINING_IDS_FILE).write_text("".join(f"{i}\n" for i in ids))


def _write(path: Path, card: JsonObject) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(card, indent=2))
    tmp.replace(path)
