"""User-facing errors. ``UserError`` is defined in :mod:`loadgen.errors` (the lowest layer) and re-exported here."""

from loadgen.errors import UserError

__all__ = ["UserError"]
