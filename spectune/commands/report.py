"""`spectune report` (placeholder until its issue lands; replaced by the real command)."""

from spectune.errors import UserError


def report() -> None:
    """Not available yet."""
    raise UserError("'spectune report' is not available yet")
