"""`spectune draft train` and `spectune draft eval` end to end on the embedded SmolLM2-135M target (the smallest
target with a real chat template and tokenizer), at toy sizes: 4 ShareGPT prompts, 12-token responses, one epoch.

- a straight run of every stage through the CLI (a subprocess, as users run it);
- the same command interrupted while writing its chunk of responses and run again: it appends only the missing
  responses, and what it exports equals the straight run's head;
- the exported head loads into the bundled engine, where greedy speculative decoding reproduces the target's own
  greedy output (speculation is lossless), with a draft vocabulary that holds every token the responses used, and
  a training-ids file listing exactly the prompts trained on;
- `draft eval` (bundled head): its JSON obeys the counting identities of acceptance length and per-position rates.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.engine import bundled_head_available

pytestmark = pytest.mark.skipif(not bundled_head_available(), reason="the embedded SmolLM2 target is not installed")

ROOT = Path(__file__).resolve().parents[2]
SIZES = ["--num-prompts", "4", "--max-new-tokens", "12", "--epochs", "1", "--draft-vocab-size", "64",
         "--ttt-steps", "2", "--batch-tokens", "512", "--seed", "0"]


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spectune.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[str, Path]:
    """``spectune draft train`` with every stage in one command."""
    tmp = tmp_path_factory.mktemp("draft")
    run = cli("draft", "train", "--output", str(tmp / "head"), "--work-dir", str(tmp / "work"), *SIZES)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"head written to {tmp / 'head'}" in " ".join(run.stderr.split())
    return {"head": tmp / "head", "work": tmp / "work", "tmp": tmp}


def test_straight_run_writes_every_stage(straight) -> None:
    card = json.loads((straight["work"] / "card.json").read_text())
    assert sorted(card["stages"]) == ["data", "features", "train"]
    responses = rows(straight["work"] / "responses.jsonl")
    assert len(responses) == 4
    assert card["stages"]["data"]["new_tokens"] == sum(len(r["output_ids"]) for r in responses)
    assert card["stages"]["features"]["sequences"] == 4
    head_card = json.loads((straight["head"] / "training.json").read_text())
    assert head_card == card


def test_interrupted_run_resumes_to_the_straight_result(straight) -> None:
    """A run killed while appending its chunk of responses left prompts.jsonl and two of the four rows; the same
    command run again generates that chunk again as the same batch (a batch's rounding depends on its rows on some
    CPUs), appends only the missing rows, and the head equals the straight run's. Both runs are the CLI, as a user
    reruns it: the engine promises the same ids for the same batch at the same torch thread count (oneDNN's bf16
    GEMM splits its work by thread on AMX CPUs), and a pytest worker runs with fewer threads than a command."""
    from safetensors.torch import load_file

    work, out = straight["tmp"] / "resumed-work", straight["tmp"] / "resumed-head"
    work.mkdir()
    (work / "prompts.jsonl").write_bytes((straight["work"] / "prompts.jsonl").read_bytes())
    lines = (straight["work"] / "responses.jsonl").read_text().splitlines(keepends=True)
    (work / "responses.jsonl").write_text("".join(lines[:2]))
    run = cli("draft", "train", "--output", str(out), "--work-dir", str(work), *SIZES)
    assert run.returncode == 0, run.stderr[-3000:]
    missing = [json.loads(line) for line in lines[2:]]
    said = " ".join(run.stderr.split())
    assert "responses 4/4 (%d tokens this run)" % sum(len(r["output_ids"]) for r in missing) in said
    by_id = {r["id"]: r for r in rows(straight["work"] / "responses.jsonl")}
    assert {r["id"]: r for r in rows(work / "responses.jsonl")} == by_id
    assert json.loads((work / "card.json").read_text())["stages"]["data"]["prompts"] == 4
    want, got = load_file(straight["head"] / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_exported_head_drafts_losslessly_in_the_engine(straight) -> None:
    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions
    from spectune.backends.local.engine.sequence import SamplingParams
    from spectune.draft.data import TRAINING_IDS_FILE

    responses = rows(straight["work"] / "responses.jsonl")
    ids = (straight["head"] / TRAINING_IDS_FILE).read_text().split()
    assert sorted(ids) == sorted(r["id"] for r in rows(straight["work"] / "prompts.jsonl"))
    opts = dict(dtype="float32", device="cpu", max_num_seqs=2, max_model_len=256, kv_cache_gb=0.2)
    spec = build_engine(EngineOptions(draft=str(straight["head"]), num_steps=2, **opts))
    head = spec.decoder.head
    assert head.cfg.kind == "eagle3"
    vocab = (head.d2t.long().cpu() + torch.arange(head.cfg.draft_vocab_size)).tolist()
    assert len(vocab) == 64
    assert vocab == sorted(set(vocab))  # d2t rebuilt into distinct target ids in ascending order
    # fewer than 64 distinct tokens were generated (4 x 12), so the 64 most frequent include every one of them
    used = {t for r in responses for t in r["output_ids"]}
    assert used <= set(vocab)
    plain = build_engine(EngineOptions(draft="none", num_steps=0, **opts))
    prompts = [r["prompt_ids"] for r in responses[:2]]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    assert spec.generate(prompts, params) == plain.generate(prompts, params)
    assert spec.stats.spec.verify_steps > 0  # it did draft


def test_draft_eval_end_to_end(straight) -> None:
    """`draft eval` with the bundled head (its drafts are accepted: about 0.5 per verify at K=2 on chat prompts,
    docs/examples/smollm2-cpu; the one-epoch toy head above accepts none, which would make the identities 0 = 0)."""
    prompts = straight["tmp"] / "eval-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in
                               (("Write a haiku about rain.", "writing"), ("What is 12 times 7?", "math"),
                                ("Name three colours.", "writing"))))
    out = straight["tmp"] / "eval.json"
    run = cli("draft", "eval", "--dataset", f"jsonl:{prompts}", "--num-prompts", "3", "--steps", "1,2",
              "--max-tokens", "16", "--dtype", "float32", "--batch", "4", "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "acceptance length on jsonl:" in " ".join(run.stdout.split())
    report = json.loads(out.read_text())
    assert report["num_prompts"] == 3
    assert [r["num_steps"] for r in report["results"]] == [1, 2]
    for r in report["results"]:
        assert r["accepted_tokens"] > 0  # ~0.5 per verify over ~30 verifies
        assert r["acceptance_length"] == pytest.approx(1 + r["accepted_tokens"] / r["verify_steps"])
        # per_position[i]: share of verifies whose drafts 1..i+1 were accepted: their sum counts every accepted
        # draft once, and a later position is accepted only after the earlier ones
        assert sum(r["per_position"]) == pytest.approx(r["accepted_tokens"] / r["verify_steps"])
        assert r["per_position"] == sorted(r["per_position"], reverse=True)
        assert sorted(r["per_category"]) == ["math", "writing"]


@pytest.mark.slow
def test_draft_train_with_magpie_prompts_on_the_real_chat_template(tmp_path) -> None:
    """Magpie on SmolLM2's own chat template (tests/draft/test_draft_magpie.py uses a stand-in engine): the target writes
    2 user prompts after the ShareGPT ones. Its default-command twin is the ``straight`` run above."""
    run = cli("draft", "train", "--output", str(tmp_path / "head"), "--work-dir", str(tmp_path / "work"),
              "--magpie-prompts", "2", *SIZES, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    magpie = rows(tmp_path / "work" / "magpie-prompts.jsonl")
    assert len(magpie) >= 2
    responses = rows(tmp_path / "work" / "responses.jsonl")
    assert len(responses) == 6  # 4 ShareGPT + 2 Magpie
    assert sum(r["id"].startswith("magpie-0-") for r in responses) == 2
    assert all(len(m["text"].split()) >= 4 for m in magpie)  # the kept messages passed the word-count filter
    ids = (tmp_path / "head" / "training-prompt-ids.txt").read_text().split()
    assert sorted(ids) == sorted(r["id"] for r in responses)
