"""Magpie prompts for draft training (`spectune draft train --magpie-prompts`): the target is fed the chat template
up to the user turn, its sampled messages are filtered, deduplicated, cleared of evaluation prompts, and a rerun
after an interruption continues with the same draws as a straight run."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from spectune.draft.data import magpie_prompts, normalise

EOS = 0
POOL = [
    "Can you write a short poem about the sea?",
    "Explain how a binary search works, step by step.",
    "Can you write a short poem about the sea?",  # a repeat: kept once
    "hi there",  # under 4 words
    "Écris-moi un poème très élégant à propos de la mer",  # under 95% ASCII
    "Compose an engaging travel blog post about a recent trip to Hawaii.",  # MT-Bench's first question
    "What are three tips for staying productive while working from home?",
    "Describe the water cycle to a ten year old child.",
    "UNFINISHED",  # generated without its end-of-turn token
    "List four prime numbers larger than one hundred please.",
    "How do I reverse a linked list in Python without recursion?",
    "Summarise the plot of Hamlet in three sentences or fewer.",
]


class CharTokenizer:
    """One token per character (ord), EOS = 0; chat template ``<u>{message}</u><a>``."""

    eos_token_ids = {EOS}

    def __init__(self) -> None:
        self.hf = self

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != EOS)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.encode("".join(f"<u>{m['content']}</u>" for m in messages) + "<a>")


class PoolEngine:
    """Stands in for the bundled engine: each request samples a POOL message with the decoder's generator."""

    def __init__(self) -> None:
        self.tokenizer = CharTokenizer()
        self.decoder = type("Decoder", (), {"generator": torch.Generator().manual_seed(123)})()
        self.openings: list[list[int]] = []

    def generate(self, prompts: list[list[int]], params) -> list[list[int]]:
        self.openings += prompts
        picks = torch.randint(len(POOL), (len(prompts),), generator=self.decoder.generator).tolist()
        out = []
        for i in picks:
            ids = self.tokenizer.encode(POOL[i])[: params.max_tokens]
            out.append(ids if POOL[i] == "UNFINISHED" else ids + [EOS])
        return out


EXCLUDE = {normalise("Compose an engaging travel blog post about a recent trip to Hawaii.")}


def test_magpie_prompts_are_the_targets_own_filtered_messages(tmp_path: Path) -> None:
    engine = PoolEngine()
    rows = magpie_prompts(engine, 6, 200, EXCLUDE, seed=0, out=tmp_path / "m.jsonl", chunk=4)
    assert engine.openings
    assert all(o == engine.tokenizer.encode("<u>") for o in engine.openings)
    texts = [r["text"] for r in rows]
    assert len(texts) == 6
    assert len(set(texts)) == 6
    allowed = {POOL[i] for i in (0, 1, 6, 7, 9, 10, 11)}
    assert set(texts) <= allowed
    for r in rows:
        assert r["prompt_ids"] == engine.tokenizer.encode_chat([{"role": "user", "content": r["text"]}])
    assert [r["id"] for r in rows] == [f"magpie-0-{i}" for i in range(6)]
    short = magpie_prompts(PoolEngine(), 2, 60, EXCLUDE, seed=0, out=tmp_path / "s.jsonl", chunk=4)
    fits = {t for t in allowed if len(engine.tokenizer.encode_chat([{"role": "user", "content": t}])) <= 60}
    assert len(short) == 2
    assert {r["text"] for r in short} <= fits
    assert len(fits) < len(allowed)


def test_a_target_that_runs_out_of_new_prompts_is_a_user_error(tmp_path: Path) -> None:
    import pytest

    from spectune.core.errors import UserError

    with pytest.raises(UserError, match="--magpie-prompts"):
        magpie_prompts(PoolEngine(), 20, 200, EXCLUDE, seed=0, out=tmp_path / "m.jsonl", chunk=4)
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 7  # what it found is kept


def test_an_interrupted_run_continues_with_the_straight_runs_draws(tmp_path: Path) -> None:
    straight = magpie_prompts(PoolEngine(), 6, 200, EXCLUDE, seed=7, out=tmp_path / "a.jsonl", chunk=3)
    first = magpie_prompts(PoolEngine(), 2, 200, EXCLUDE, seed=7, out=tmp_path / "b.jsonl", chunk=3)
    assert [r["text"] for r in first] == [r["text"] for r in straight[:2]]
    resumed = magpie_prompts(PoolEngine(), 6, 200, EXCLUDE, seed=7, out=tmp_path / "b.jsonl", chunk=3)
    assert [(r["id"], r["text"]) for r in resumed] == [(r["id"], r["text"]) for r in straight]
    stored = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert len({normalise(r["text"]) for r in stored}) == len(stored)
    other = magpie_prompts(PoolEngine(), 6, 200, EXCLUDE, seed=8, out=tmp_path / "c.jsonl", chunk=3)
    assert [r["text"] for r in other] != [r["text"] for r in straight]
