"""Which EAGLE version a draft head is, from its config.json or its name: torch-free, so the backend interface
(:meth:`spectune.backends.base.Backend.draft_algorithm`) and every backend that launches a head can ask it."""

from __future__ import annotations

import json
from pathlib import Path

from spectune.backends.head_config import head_eagle_version


def eagle_version(draft: str) -> tuple[str, str]:
    """``"eagle3"`` or ``"eagle"`` for a draft head, and what decided it.

    The head's config.json decides (:func:`spectune.backends.head_config.head_eagle_version`, the one EAGLE version
    rule: an ``Eagle3`` architecture or a ``draft_vocab_size`` key, background §5). The config is read from a
    local folder, else from the Hugging Face cache (never downloaded); without one, a name containing
    ``eagle3`` decides.
    """
    config_path = Path(draft) / "config.json"
    if not config_path.is_file():
        config_path = None
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(draft, "config.json")
            config_path = Path(cached) if isinstance(cached, str) else None
        except Exception:  # not a repo id, or huggingface_hub missing
            config_path = None
    if config_path is not None:
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict):
            return head_eagle_version(config), str(config_path)
    squashed = draft.lower().replace("-", "").replace("_", "")
    return ("eagle3" if "eagle3" in squashed else "eagle"), "name"
