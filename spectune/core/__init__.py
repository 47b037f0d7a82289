"""What every layer shares, below all of them: the one user error (:mod:`spectune.core.errors`) and the JSON
document types (:mod:`spectune.core.json_types`). It imports nothing of spectune, so ``loadgen``, ``backends``,
``presets`` and every feature package may import it (docs/architecture.md, "One import name")."""
