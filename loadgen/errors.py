"""The old home of :class:`~spectune.core.errors.UserError`, kept as a name only: ``spectune.core.errors`` defines
it. Import it from there; this module goes once ``backends/local/weights/compute_paths.py`` does."""

from spectune.core.errors import UserError

__all__ = ["UserError"]
