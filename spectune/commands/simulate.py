"""`spectune simulate` (placeholder until its issue lands; replaced by the real command)."""

from spectune.errors import UserError


def simulate() -> None:
    """Not available yet."""
    raise UserError("'spectune simulate' is not available yet")
