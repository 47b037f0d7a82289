"""``llamacpp-settings.json``: the draft length spectune recommends for a ``llama-server``, and its reader.

llama.cpp takes one draft length per server (``--spec-draft-n-max N``, ``common/arg.cpp``; the per-request
``speculative.n_max`` is compiled out in ``tools/server/server-schema.cpp``), so the settings are one static
num_steps for the whole concurrency range, written as the flags to add to ``llama-server``::

    {"format": "llamacpp-settings", "spec_draft_n_max": 2, "spec_type": "draft-eagle3",
     "llama_server_args": ["--spec-type", "draft-eagle3", "--spec-draft-n-max", "2"], ...}

With ``spec_draft_n_max`` 0 the server runs without ``-md`` (no speculation) and ``llama_server_args`` is empty.

When a swept draft-confidence cutoff beat the best static num_steps (``spectune sweep --p-min``), the settings also
carry it: ``"spec_draft_p_min": 0.3`` and ``--spec-draft-p-min 0.3`` in ``llama_server_args`` (``common/arg.cpp``;
``common/speculative.cpp`` ``common_speculative_impl_draft_eagle3``: a row stops drafting at the first draft token
whose probability, after the drafter's top-k 10 sampler, is under P; ``--spec-draft-n-max`` caps the draft).

``spectune validate --config llamacpp-settings.json`` runs that static num_steps as its "config" run; settings with a
``spec_draft_p_min`` above 0 are run as a server of their own (``-md ... --spec-draft-n-max N --spec-draft-p-min P``).
"""

from __future__ import annotations

import json
from pathlib import Path

from spectune.backends.methods import engine_method
from spectune.core.json_types import JsonObject, JsonValue

FORMAT = "llamacpp-settings"
P_MIN_FLAG = "--spec-draft-p-min"
"""llama-server's draft-confidence cutoff (``common/arg.cpp``; ``--draft-p-min`` is its alias, default 0.00)."""


def settings_json(steps: int, spec_type: str | None = None, p_min: float | None = None,
                  **extra: JsonValue) -> JsonObject:
    """The settings object for num_steps ``steps`` (``extra`` keys are added after the flags); ``spec_type``
    defaults to llama.cpp's spelling of EAGLE-3 (:mod:`spectune.backends.methods`); ``p_min`` (a probability, with
    ``steps`` > 0): the draft-confidence cutoff, written as ``spec_draft_p_min`` and :data:`P_MIN_FLAG`."""
    spec_type = spec_type or engine_method("llamacpp", "eagle3")
    args = ["--spec-type", spec_type, "--spec-draft-n-max", str(steps)] if steps > 0 else []
    cutoff: JsonObject = {}
    if p_min is not None and steps > 0:
        args += [P_MIN_FLAG, f"{p_min:g}"]
        cutoff = {"spec_draft_p_min": p_min}
    return {"format": FORMAT, "spec_draft_n_max": steps, **cutoff, "spec_type": spec_type, "llama_server_args": args,
            **extra}


def read_settings(path: str | Path) -> int | None:
    """The num_steps of a ``llamacpp-settings.json`` file, or None when the file is another kind of config (or not
    JSON: the caller's own reader reports that).

    Raises:
        ValueError: the file says it is llama.cpp settings but ``spec_draft_n_max`` is not an integer >= 0.
    """
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        return None
    k = obj.get("spec_draft_n_max")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"{path}: spec_draft_n_max must be an integer >= 0, got {k!r}")
    return k


def read_p_min(path: str | Path) -> float | None:
    """The ``spec_draft_p_min`` of a ``llamacpp-settings.json`` file, or None when it has none (or is another kind of
    file).

    Raises:
        ValueError: the file says it is llama.cpp settings but ``spec_draft_p_min`` is not a number in 0..1.
    """
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("spec_draft_p_min") is None:
        return None
    p = obj["spec_draft_p_min"]
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{path}: spec_draft_p_min must be a number in 0..1, got {p!r}")
    return float(p)
