"""Durable writes for results folders: nothing finished is ever lost, and readers never see half a file.

JSONL files are appended one flushed line at a time; whole-file rewrites go through :func:`atomic_write`: a temporary
file in the same folder, fsync, :func:`os.replace`, then an fsync of the folder itself (the rename is only durable
once the directory entry is). A write that fails raises :class:`UserError` with one line naming the file, the reason
and the fix (:func:`writing`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Callable, Iterator

from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject


def fsync_dir(folder: Path) -> None:
    """fsync a directory, making renames and new entries in it durable (POSIX: fsync(2) on the directory's fd)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[io.TextIOBase], None]) -> None:
    """Write ``path`` atomically: ``write(fh)`` into a temporary file beside it, fsync, ``os.replace``, then fsync
    the folder so that the rename survives a power loss."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def writing(what: Path, resume_hint: Path | None = None) -> Iterator[None]:
    """Turn an :class:`OSError` raised inside into a one-line :class:`UserError` naming ``what``, the reason and the
    fix (free space, or a writable ``--output-dir``); with ``resume_hint`` (the results folder) the message says
    how to finish the sweep with ``--resume``."""
    try:
        yield
    except OSError as err:
        why = err.strerror or type(err).__name__
        if resume_hint is not None:
            fix = (f"free space (or fix the folder), then finish with --resume --output-dir {resume_hint}; finished "
                   "points are kept")
        else:
            fix = "choose a writable --output-dir"
        raise UserError(f"cannot write {what}: {why}: {fix}", exit_code=1 if resume_hint is not None else 2) from None


def json_object(line: str) -> JsonObject | None:
    """``line`` parsed as JSON when it holds a JSON object; None when it is not JSON or another JSON value."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def iter_jsonl(path: Path) -> Iterator[tuple[str, JsonObject | None]]:
    """(line, parsed object or None) for each non-blank line; a line that is not a JSON object gives None."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.strip():
                yield line if line.endswith("\n") else line + "\n", json_object(line)


