"""Built-in SGLang ``--speculative-adaptive-config`` presets, shipped as JSON files in this package
(``presets/`` in the source tree, ``spectune.presets`` once installed).

- ``sglang-conservative``: SGLang docs' "Conservative (default) - for weak draft models" config.
- ``sglang-aggressive``: SGLang docs' "Aggressive - for strong or high-variance draft models" config.
- ``sglang-default``: ``DEFAULT_ADAPTIVE_CONFIG`` of current SGLang source
  (python/sglang/srt/speculative/adaptive_spec_params.py), which adds num_steps 0 at high batch sizes.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from spectune.core.errors import UserError

DESCRIPTIONS = {
    "sglang-conservative": "SGLang docs' conservative preset (weak drafts): BS 1-7 [1,3,7], 8-31 [1,3], 32+ [1]",
    "sglang-aggressive": "SGLang docs' aggressive preset (strong drafts): wider ladders capped by ceiling_coeff "
                         "at BS 8+, 64+, 128+",
    "sglang-default": "current SGLang source's built-in default: BS 1-7 [1,3,5,7], 8-31 [0,1,3], 32-63 [0,1], "
                      "64+ [0]",
}


def preset_names() -> list[str]:
    """Names of the shipped presets (JSON file stems in the ``presets`` package), sorted."""
    return sorted(p.name[: -len(".json")] for p in files(__name__).iterdir() if p.name.endswith(".json"))


def load_preset(name: str) -> dict[str, Any]:
    """The preset's config object, as SGLang reads it.

    Raises:
        UserError: unknown name (the message lists the known ones).
    """
    names = preset_names()
    if name not in names:
        raise UserError(f"unknown preset '{name}': use one of {', '.join(names)}")
    return json.loads(files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8"))


def describe(name: str) -> str:
    """One-line description of a preset (empty for a JSON file without one)."""
    return DESCRIPTIONS.get(name, "")
