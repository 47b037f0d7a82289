"""`spectune serve` (placeholder until its issue lands; replaced by the real command)."""

from spectune.errors import UserError


def serve() -> None:
    """Not available yet."""
    raise UserError("'spectune serve' is not available yet")
