"""`spectune validate` (placeholder until its issue lands; replaced by the real command)."""

from spectune.errors import UserError


def validate() -> None:
    """Not available yet."""
    raise UserError("'spectune validate' is not available yet")
