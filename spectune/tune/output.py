"""Every file ``spectune recommend`` writes: each registered engine format's configs (:mod:`spectune.backends.formats`,
each parsed back by its engine-format reader first), recommendation.json and recommendation.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

from spectune.backends.local.options import bundled_head
from spectune.backends.formats import engine_formats
from spectune.backends.num_steps.sglang_config import parse_any_config
from spectune.core.json_types import JsonValue
from spectune.tune.configs import best_static_json, engine_plan, sglang_configs
from spectune.tune.markdown import recommendation_markdown
from spectune.tune.recommend import Recommendation
from spectune.tune.slo_goodput import SloGoodput, goodput_markdown


def _inside(path: str, folder: Path) -> str | None:
    """``path`` relative to ``folder`` when it is an absolute path inside it, else None."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        return None
    try:
        return p.resolve().relative_to(folder.resolve()).as_posix() or "."
    except (ValueError, OSError):
        return None


def portable_head(head: str | None, out: Path) -> str | None:
    """``vllm-speculative-config.json``'s ``model`` for a file written into ``out``: a path vLLM can load that names
    no other machine's folders. A bundled head (:func:`spectune.backends.local.options.bundled_head`, also one a sweep
    recorded on another machine or checkout) is written as this machine's copy relative to ``out`` (the launch line
    in recommendation.md reads the file from ``out``, ``$(cat vllm-speculative-config.json)``, so vLLM resolves it
    from there) when the two share a folder below the file-system root (a checkout's ``docs/examples/NAME/recommend``:
    ``../../../../backends/local/heads/NAME``), else as this machine's absolute path (a relative path that climbs to
    the root is no more portable); an absolute path inside ``out`` relative to it; anything else (the user's
    ``--draft``, a hub id) as the sweep recorded it. Reads the file system only; raises nothing."""
    if not head:
        return head
    bundled = bundled_head(head)
    if bundled is not None:
        here, folder = bundled.resolve(), out.resolve()
        try:
            shared = Path(os.path.commonpath([here, folder]))
        except ValueError:  # another drive
            return str(here)
        return Path(os.path.relpath(here, folder)).as_posix() if shared != Path(shared.anchor) else str(here)
    return _inside(head, out) or head


def portable_target(target: str | None, out: Path) -> str | None:
    """The target model in recommendation.md's vLLM launch line (a shell command run from ``out``): an absolute path
    inside ``out`` relative to it, one under the home folder as ``~/...`` (the shell expands it; spectune's converted
    default-pair target lives in ``~/.cache/spectune``), anything else (a hub id, the user's own path) as the sweep
    recorded it."""
    if not target:
        return target
    inside = _inside(target, out)
    if inside is not None:
        return inside
    p = Path(target)
    try:
        return "~/" + p.relative_to(Path.home()).as_posix() if p.is_absolute() else target
    except (ValueError, RuntimeError):  # not under home, or no home folder known
        return target


def write_recommendation(rec: Recommendation, out: Path, source: str,
                         algorithm: tuple[str | None, str] = (None, "unknown"), head: str | None = None,
                         target: str | None = None, trtllm_version: str | None = None,
                         goodput: SloGoodput | None = None) -> dict[str, Path]:
    """Write every output of ``spectune recommend`` into ``out`` (created if needed): every engine format's files
    (:func:`spectune.backends.formats.engine_formats`, in registry order), each parsed back by its reader first.
    ``algorithm``: the sweep's draft-head method (``eagle``/``eagle3``, :func:`spectune.backends.draft_algorithm`)
    and how it was found, for the launch flags; ``head``: the draft head it loaded
    (:func:`spectune.backends.draft_head`) and ``target`` the target model, for vLLM's complete
    ``--speculative-config`` and its launch line, written by :func:`portable_head` and :func:`portable_target` so
    that a committed output folder names no machine's absolute folders. ``trtllm_version``: the TensorRT-LLM
    release whose ``draft_len_schedule`` form to write (None: the newest). The adaptive format's custom config then
    gets its SGLang strategy (:func:`sglang_strategy`). ``goodput``: ``recommend --slo-tpot-ms``'s ranking by goodput
    (:mod:`spectune.tune.slo_goodput`), written as recommendation.json's ``slo_goodput`` and a section of
    recommendation.md; None writes neither. Returns {file name: path}.

    Raises:
        ValueError: an emitted config fails validation (a spectune bug, never user input).
    """
    out.mkdir(parents=True, exist_ok=True)
    head, target = portable_head(head, out), portable_target(target, out)
    configs, notes = sglang_configs(rec)
    plan = engine_plan(rec, configs, algorithm, head, target, {"trtllm": trtllm_version})
    files: dict[str, str] = {}
    payload: dict[str, JsonValue] = {}
    strategy, strategy_why = "ema", "no custom config"
    for engine in engine_formats():
        for f in engine.write(plan):
            payload[f.name] = f.config
            files[f.name] = f.description
        if engine.adaptive:
            strategy, strategy_why = sglang_strategy(rec, configs.custom, payload, files)
    payload["best-static.json"] = best_static_json(rec, algorithm[0])
    files["best-static.json"] = "the best single static num_steps and its launch flags"
    payload["recommendation.json"] = {**rec.to_json(), "ladder_notes": notes,
                                      "sglang_strategy": {"strategy": strategy, "reason": strategy_why},
                                      **({"slo_goodput": goodput.to_json()} if goodput is not None else {})}
    files["recommendation.json"] = "every cell, choice, slot and score (machine-readable)"
    paths = {}
    for name, obj in payload.items():
        paths[name] = out / name
        paths[name].write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    paths["recommendation.md"] = out / "recommendation.md"
    md = recommendation_markdown(rec, files, configs, notes, source, algorithm, target, plan)
    md += f"\nSGLang strategy for `sglang-adaptive-custom.json`: **{strategy}**: {strategy_why}.\n"
    if goodput is not None:
        md += "\n".join(goodput_markdown(goodput)) + "\n"
    paths["recommendation.md"].write_text(md, encoding="utf-8")
    return paths


def sglang_strategy(rec: Recommendation, custom: dict | None, payload: dict[str, JsonValue],
                    files: dict[str, str]) -> tuple[str, str]:
    """Choose the ``custom`` config's SGLang strategy (:func:`spectune.tune.strategy.choose_strategy`); for
    ``throughput_aware`` rewrite ``sglang-adaptive-custom.json`` in ``payload`` with ``"strategy":
    "throughput_aware"`` (SGLang's default, EMA, is written without the key) and add ``sglang-cost-table.json``
    (the sweep's round times, for ``spectune simulate --cost-table``). Returns (strategy, reason)."""
    from spectune.backends.formats.sglang import sglang_initial_steps
    from spectune.tune.strategy import choose_strategy, cost_table_from_cells, throughput_aware_config

    if not custom or not rec.slots:
        return "ema", "no custom config"
    strategy, why = choose_strategy(rec, custom, sglang_initial_steps(custom, rec.slots[0].steps))
    if strategy == "throughput_aware":
        cfg = throughput_aware_config(custom)
        parse_any_config(cfg, source="sglang-adaptive-custom", strict=True)
        payload["sglang-adaptive-custom.json"] = cfg
        files["sglang-adaptive-custom.json"] += ", `\"strategy\": \"throughput_aware\"` (see below)"
        payload["sglang-cost-table.json"] = cost_table_from_cells(rec).to_json()
        files["sglang-cost-table.json"] = ("decode-round ms per (batch size, num_steps) from the sweep, for "
                                           "`spectune simulate --cost-table`")
    return strategy, why
