"""`spectune gate` (placeholder until its issue lands; replaced by the real command)."""

from spectune.errors import UserError


def gate() -> None:
    """Not available yet."""
    raise UserError("'spectune gate' is not available yet")
