"""Load generation: prompt datasets, arrival processes, the streaming client and per-request metrics.

Never imports ``spectune`` or ``backends``.
"""

from loadgen.errors import UserError

__all__ = ["UserError"]
