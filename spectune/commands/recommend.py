"""`spectune recommend` (placeholder until its issue lands; replaced by the real command)."""

from spectune.errors import UserError


def recommend() -> None:
    """Not available yet."""
    raise UserError("'spectune recommend' is not available yet")
