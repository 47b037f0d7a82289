"""llama.cpp's file: ``llamacpp-settings.json`` (:mod:`spectune.backends.llamacpp.settings`), one static draft
length per ``llama-server`` (the same at every batch size, above the measured range too), with the swept
draft-confidence cutoff ``--spec-draft-p-min`` when one beat the best static num_steps (:mod:`spectune.tune.p_min`),
and recommendation.md's llama.cpp section."""

from __future__ import annotations

from spectune.backends.formats.base import ConfigFile, EngineFormat, Plan, StaticChoice, fmt, md_table
from spectune.backends.llamacpp.settings import settings_json
from spectune.core.json_types import JsonObject

FILE_NAME = "llamacpp-settings.json"


def llamacpp_settings(static: StaticChoice | None, p_min: JsonObject | None = None) -> JsonObject | None:
    """``llamacpp-settings.json``: llama.cpp takes one draft length per server, so the best single static num_steps
    over the measured concurrency range, with each concurrency's own winner and what the static choice keeps of it
    (``static_vs_best``: objective ratio, inverted for minimised objectives, 1.0 = no loss). With a cutoff decision
    (``p_min``, :func:`spectune.tune.p_min.choose_p_min`) that beats it, the cutoff's num_steps and
    ``spec_draft_p_min`` instead (``static_num_steps``: the static answer it replaced); either way ``p_min_reason``
    says why. None when no static num_steps was measured ok everywhere (``static`` None)."""
    if static is None:
        return None
    extra: JsonObject = {}
    steps, cutoff = static.steps, None
    if p_min is not None:
        if p_min.get("beats"):
            steps, cutoff = int(p_min["num_steps"]), float(p_min["p_min"])
            extra["static_num_steps"] = static.steps
        extra["p_min_reason"] = p_min.get("reason")
    return settings_json(steps, p_min=cutoff, objective=static.objective,
                         concurrency_range=list(static.concurrency_range), per_concurrency=static.per_concurrency,
                         **extra)


def llamacpp_section(settings: JsonObject | None) -> list[str]:
    """recommendation.md's llama.cpp part: one static ``--spec-draft-n-max`` (llama.cpp has no per-batch-size
    schedule), each concurrency's own winner, and what the static choice keeps of that winner's objective."""
    if settings is None:
        return []
    k = settings.get("static_num_steps", settings["spec_draft_n_max"])
    flags = " ".join(settings["llama_server_args"])
    out = ["\n## llama.cpp (one draft length per server)\n",
           f"`llama-server ... -md HEAD.gguf {flags}`" if k else "`llama-server` without `-md` (no speculation)",
           f"\nThe best single num_steps over concurrency {settings['concurrency_range'][0]}-"
           f"{settings['concurrency_range'][1]} is K={k}; where another K wins, the static choice costs:\n",
           md_table(["concurrency", "best K", f"{settings['objective']} best", f"K={k}", "static / best"],
                    [[str(r["concurrency"]), str(r["best_steps"]), fmt(r["best_objective"]),
                      fmt(r["static_objective"]), fmt(r["static_vs_best"], ".3f")]
                     for r in settings["per_concurrency"]])]
    if settings.get("p_min_reason"):
        said = ("The swept draft-confidence cutoff replaces it: `--spec-draft-p-min "
                f"{settings['spec_draft_p_min']:g}` at `--spec-draft-n-max {settings['spec_draft_n_max']}`"
                if "spec_draft_p_min" in settings else "The static draft length stays: no swept `--spec-draft-p-min` "
                "did better")
        out.append(f"\n{said}: {settings['p_min_reason']}.")
    return out


class LlamaCppFormat(EngineFormat):
    """``llamacpp-settings.json`` from :attr:`Plan.static` and its section in recommendation.md."""

    engine = "llamacpp"
    file_name = FILE_NAME

    def write(self, plan: Plan) -> list[ConfigFile]:
        llamacpp = llamacpp_settings(plan.static, plan.p_min)
        if llamacpp is None:
            return []
        return [ConfigFile(FILE_NAME, llamacpp, "llama-server flags: one static draft length for the whole "
                                                "concurrency range (llama.cpp has no per-batch-size schedule)"
                                                + (", with the draft-confidence cutoff that beat it"
                                                   if "spec_draft_p_min" in llamacpp else ""))]

    def section(self, plan: Plan) -> list[str]:
        return llamacpp_section(llamacpp_settings(plan.static, plan.p_min))
