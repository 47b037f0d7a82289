"""The old home of the JSON document types, kept as names only: ``spectune.core.json_types`` defines them. Import
them from there; this module goes once ``backends/local/weights/compute_paths.py`` does."""

from spectune.core.json_types import JsonObject, JsonValue

__all__ = ["JsonObject", "JsonValue"]
