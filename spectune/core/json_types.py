"""JSON types for documents spectune reads and writes whole (sweep.json, validate.json, points.jsonl and
requests.jsonl lines, engine responses): what ``json.loads`` returns and ``json.dumps`` accepts (RFC 8259 values).

A record whose keys are known is a ``TypedDict`` or a dataclass beside its module; :data:`JsonObject` is for a
document as a whole, where spectune reads some keys and carries the rest through unchanged.
"""

from __future__ import annotations

from typing import Union

JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]
"""One JSON value: null, a boolean, a number, a string, an array or an object."""

JsonObject = dict[str, JsonValue]
"""A JSON object (a document, or a part of one spectune carries through)."""
