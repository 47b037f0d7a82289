"""`spectune sweep` (placeholder until its issue lands; replaced by the real command)."""

from spectune.errors import UserError


def sweep() -> None:
    """Not available yet."""
    raise UserError("'spectune sweep' is not available yet")
