"""A results folder's per-request file is read as written (``requests.jsonl``) or gzipped (``requests.jsonl.gz``, as
docs/examples/smollm2-h200 ships it): the same records either way; a damaged gzip file is a one-line UserError."""

from __future__ import annotations

import gzip
import json

import pytest

from spectune.core.errors import UserError
from spectune.results.reader import load_request_records, load_requests, requests_file

LINES = [{"steps": k, "concurrency": 4, "repeat": 0, "prompt_id": str(i), "error": None, "chunk_times": [0.1, 0.2],
          "ttft_ms": 10.0 + i, "tpot_ms": 5.0 + k} for k in (0, 1) for i in range(3)]
TEXT = "".join(json.dumps(line) + "\n" for line in LINES)


@pytest.fixture
def folders(tmp_path):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    (plain / "requests.jsonl").write_text(TEXT)
    (packed / "requests.jsonl.gz").write_bytes(gzip.compress(TEXT.encode()))
    return plain, packed


def test_the_gzipped_file_is_found(folders):
    assert requests_file(folders[1]).name == "requests.jsonl.gz"


def test_the_gzipped_records_are_the_plain_ones(folders):
    assert load_request_records(folders[1]) == load_request_records(folders[0])


def test_the_gzipped_slo_table_is_the_plain_one(folders):
    assert load_requests(folders[1]).equals(load_requests(folders[0]))


def test_a_folder_without_either_file_has_no_requests(tmp_path):
    assert load_request_records(tmp_path) is None


def test_a_damaged_gzip_file_is_a_user_error(tmp_path):
    (tmp_path / "requests.jsonl.gz").write_text(TEXT)  # text under a .gz name
    with pytest.raises(UserError, match="not a gzip file"):
        load_request_records(tmp_path)
