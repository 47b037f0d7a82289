"""``spectune draft accept-train`` and ``accept-eval``: prompts -> the target's greedy responses -> target features ->
the frozen EAGLE head's draft chains (labelled samples) -> acceptance-head training -> export; or, on evaluation
prompts, the same samples scored for calibration against the raw draft confidence.

Each stage writes into its work folder and a rerun resumes after the last stage it finished (responses and features
per chunk, as :mod:`spectune.draft.data` and :mod:`spectune.draft.features` do). Every stage records its wall time
and this process's CPU time (``time.process_time``: on a shared machine the wall time also counts other programs).
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.draft.data import generate_responses, read_jsonl, require_rows, write_jsonl
from spectune.draft.options import DataOptions

if TYPE_CHECKING:
    from spectune.backends.local.engine.tokenizer import Tokenizer
    from spectune.backends.local.model.acceptance import AcceptanceHead
    from spectune.draft.acceptance_train import AcceptanceTrainConfig

TRAIN_STAGES = ("data", "features", "chain", "train", "export")
CARD_FILE = "training.json"


@dataclass(kw_only=True)
class SampleOptions(DataOptions):
    """Where and how chain samples are built: the data's (:class:`spectune.draft.options.DataOptions`; greedy
    responses; the work folder also holds the samples and the card) and:

    Attributes:
        draft: the frozen EAGLE-3 head folder.
        n_max: draft steps unrolled per row.
    """

    draft: Path
    max_new_tokens: int = 192
    max_prompt_tokens: int = 256
    n_max: int = 4


class Stage:
    """Times one stage (wall and process CPU seconds) into ``card["stages"][name]``, adding to an earlier run's."""

    def __init__(self, card: JsonObject, name: str) -> None:
        self.card, self.name = card, name

    def __enter__(self) -> JsonObject:
        self.t0, self.c0 = time.time(), time.process_time()
        self.rec: JsonObject = {}
        return self.rec

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            prev = self.card["stages"].get(self.name, {})
            self.rec["wall_s"] = prev.get("wall_s", 0.0) + time.time() - self.t0
            self.rec["cpu_s"] = prev.get("cpu_s", 0.0) + time.process_time() - self.c0
            self.card["stages"][self.name] = {**prev, **self.rec}


def read_card(work: Path) -> JsonObject:
    """The work folder's record (``{"stages": {}}`` when new)."""
    path = work / CARD_FILE
    return json.loads(path.read_text()) if path.is_file() else {"stages": {}}


def write_card(work: Path, card: JsonObject) -> None:
    """Write the record atomically."""
    tmp = work / (CARD_FILE + ".tmp")
    tmp.write_text(json.dumps(card, indent=2) + "\n")
    tmp.replace(work / CARD_FILE)


def collect_samples(opts: SampleOptions, prompts_fn: Callable[[Tokenizer], list[dict]], stages: tuple[str, ...],
                    card: JsonObject, say: Callable[[str], None]) -> dict[str, torch.Tensor] | None:
    """Run the data, features and chain stages named in ``stages``; returns the samples (None when ``chain`` did not
    run and none are stored).

    ``prompts_fn(tokenizer)`` gives the ``{"id", "prompt_ids", ...}`` records, called once (stored in
    ``prompts.jsonl``).

    Raises:
        UserError: a stage's input is missing (run the earlier stage first).
    """
    from spectune.backends.local.weights.heads import load_head
    from spectune.backends.local.weights.loader import load_target
    from spectune.draft.acceptance_data import SAMPLES_FILE, build_samples
    from spectune.draft.features import FeatureStore, extract_features

    work = opts.work_dir
    work.mkdir(parents=True, exist_ok=True)
    max_len = opts.max_len
    if "data" in stages:
        with Stage(card, "data") as rec:
            engine = opts.response_engine()
            prompts_path = work / "prompts.jsonl"
            if not prompts_path.is_file():
                write_jsonl(prompts_path, prompts_fn(engine.tokenizer))
            prompts = read_jsonl(prompts_path)
            if not prompts:
                raise UserError(f"no prompts fit --max-prompt-tokens {opts.max_prompt_tokens}: raise it")
            say(f"{len(prompts)} prompts")
            produced = generate_responses(engine, prompts, work / "responses.jsonl", opts.max_new_tokens,
                                          opts.batch, lambda d, n, k: say(f"responses {d}/{n} ({k} tokens)"))
            rec.update(prompts=len(prompts), new_tokens=card["stages"].get("data", {}).get("new_tokens", 0) + produced)
            del engine
        write_card(work, card)
    target = head = None
    if "features" in stages or "chain" in stages:
        target, _ = load_target(opts.model, torch.bfloat16, "cpu")
        head = load_head(opts.draft, target, torch.bfloat16, torch.device("cpu"))
        target.capture_layers = head.cfg.aux_layers
        target.build_rope(max_len + 8)
        head.prepare(max_len + opts.n_max + 8)
    if "features" in stages:
        with Stage(card, "features") as rec:
            rows = require_rows(work / "responses.jsonl", "responses")
            index = extract_features(target, rows, work, max_len, progress=lambda d, n: say(f"features {d}/{n}"))
            rec.update(sequences=len(index["sequences"]), tokens=sum(s[1] for s in index["sequences"]))
        write_card(work, card)
    if "chain" in stages:
        with Stage(card, "chain") as rec:
            store = FeatureStore(work)
            if len(store) == 0:
                raise UserError(f"{work} has no features: run the features stage first")
            samples = build_samples(head, target, store, opts.n_max, work / SAMPLES_FILE,
                                    lambda d, n: say(f"draft chains {d}/{n}"))
            rec.update(n_max=opts.n_max, **sample_summary(samples, opts.n_max))
        write_card(work, card)
        return samples
    path = work / SAMPLES_FILE
    return torch.load(path, weights_only=True) if path.is_file() else None


def sample_summary(samples: dict[str, torch.Tensor], n_max: int) -> JsonObject:
    """Kept samples and acceptance rate per draft step, and the sequences they come from."""
    per_step = [int((samples["step"] == j).sum()) for j in range(n_max)]
    rate = [float(samples["label"][samples["step"] == j].float().mean()) if n else None
            for j, n in enumerate(per_step)]
    return {"samples": len(samples["prob"]), "samples_per_step": per_step, "acceptance_per_step": rate,
            "sequences": len(set(samples["seq"].tolist()))}


def host_record() -> JsonObject:
    """Threads and processor of this run (for the card)."""
    return {"device": "cpu", "threads": torch.get_num_threads(), "host": platform.processor() or platform.machine()}


def run_train(opts: SampleOptions, output: Path, prompts_fn: Callable[[Tokenizer], list[dict]],
              cfg: AcceptanceTrainConfig, stages: tuple[str, ...], say: Callable[[str], None],
              command: str = "") -> JsonObject:
    """``spectune draft accept-train``: every stage in ``stages``; returns the record (written to the work folder and,
    by ``export``, beside the head as ``training.json``).

    Raises:
        UserError: a stage's input is missing.
    """
    from spectune.backends.local.model.acceptance import load_acceptance_head, save_acceptance_head
    from spectune.draft.acceptance_train import train_acceptance

    work = opts.work_dir
    card = read_card(work)
    if command:
        card.setdefault("commands", []).append(command)  # every run that built this record, resumed ones too
    samples = collect_samples(opts, prompts_fn, stages, card, say)
    if "train" in stages:
        if samples is None or len(samples["prob"]) == 0:
            raise UserError(f"{work} has no chain samples: run `spectune draft accept-train --stage chain` first")
        with Stage(card, "train") as rec:
            card["stages"].pop("train", None)  # a retrain replaces the record instead of adding to it
            epochs: list[dict] = []
            head = train_acceptance(samples, cfg,
                                    lambda r: (epochs.append(r), say(f"epoch {r['epoch']}: train {r['train_loss']:.4f} "
                                                                     f"val {r['val_loss']:.4f}")))
            save_acceptance_head(head, work / "head")
            rec.update(config=asdict(cfg), epochs=epochs, **host_record())
        write_card(work, card)
    if "export" in stages:
        if not (work / "head" / "config.json").is_file():
            raise UserError(f"{work / 'head'} is missing: run `spectune draft accept-train --stage train` first")
        save_acceptance_head(load_acceptance_head(work / "head", torch.device("cpu"), torch.float32), output)
        timed = [s for s in ("data", "features", "chain", "train") if s in card["stages"]]
        card["total"] = {"wall_s": sum(card["stages"][s]["wall_s"] for s in timed),
                         "cpu_s": sum(card["stages"][s]["cpu_s"] for s in timed)}
        write_card(work, card)
        (output / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")
    return card


def evaluate_samples(acc_head: AcceptanceHead, samples: dict[str, torch.Tensor], bins: int) -> JsonObject:
    """Calibration of the acceptance head's p_hat and of the raw draft confidence on ``samples``, overall and per
    draft step (:func:`spectune.draft.calibration.compare`, keys ``head`` and ``draft_prob``)."""
    from spectune.draft.acceptance_train import predict
    from spectune.draft.calibration import compare

    p_hat = predict(acc_head, samples["feature"], samples["prob"]).numpy()
    return compare({"head": p_hat, "draft_prob": samples["prob"].float().numpy()}, samples["label"].numpy(),
                   samples["step"].numpy(), bins)
