"""The config formats validate runs as one static num_steps, and reading recommend's ``best-static.json``; below
:mod:`spectune.validate.plan` (which reads every config format) so that the prediction and the run can ask
"is this config one static num_steps?" without importing the plan."""

from __future__ import annotations

import json
from pathlib import Path

from spectune.backends.llamacpp.settings import FORMAT

BEST_STATIC = "best-static"
"""recommend's ``best-static.json`` (:func:`spectune.tune.configs.best_static_json`): one static num_steps for every
engine, K=0 (no drafter) included."""

STATIC_FORMATS = (FORMAT, BEST_STATIC)
"""Config formats that are one static num_steps (llama.cpp settings, best-static.json): the config run is a static
server at that K, K=0 included (:func:`spectune.validate.plan.static_equivalent`)."""


def read_best_static(path: str) -> int | None:
    """The num_steps of a ``best-static.json`` (a JSON object with an integer ``num_steps`` >= 0 beside
    ``aggregate_score``), or None for any other file."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    k = obj.get("num_steps") if isinstance(obj, dict) and "aggregate_score" in obj else None
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 0 else None
