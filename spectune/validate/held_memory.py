"""Whether the servers ``spectune validate --servers together`` (or ``kept``) holds at once fit in this machine's
memory, checked before they start.

Why: a bake-off of five configs and static num_steps 0-2 on the bundled engine holds eight servers of about 2.8 GiB
each; on a 24 GiB machine they took all of it, the kernel dropped the servers' mapped code pages (no swap), and decode
rounds of one config took 41 s instead of 0.4 s, so that config's run failed and the others' slowed, an artifact the
verdict would have read as the policies' own cost. A run of servers that cannot fit is refused before anything is
measured; ``--servers one`` holds one server at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from spectune.backends.base import Backend
from spectune.core.errors import UserError

#: Share of the memory available now that the held servers may take (the load generator and the page cache of the
#: servers' own code need the rest).
HEADROOM = 0.85


def available_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """``MemAvailable`` of ``meminfo`` in GiB (Linux: ``proc(5)``), or None when it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20  # kB -> GiB
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_held_memory(held: Sequence[tuple[Backend, int]], mode: str, available: float | None) -> None:
    """Refuse to start ``held`` servers at once (each (backend, num_steps)) when the memory they report
    (:meth:`~spectune.backends.base.Backend.server_memory_gib`) is more than :data:`HEADROOM` of ``available`` GiB.
    Backends that report None (servers elsewhere, GPU caches) and an unknown ``available`` pass.

    Raises:
        UserError: they would not fit; names the count, the sum, what is available and ``--servers one``.
    """
    sizes = [b.server_memory_gib(k) for b, k in held]
    known = [s for s in sizes if s is not None]
    if available is None or not known:
        return
    need = sum(known)
    if need > HEADROOM * available:
        raise UserError(f"--servers {mode}: {len(known)} servers up at once need about {need:.1f} GiB and this machine "
                        f"has {available:.1f} GiB available; pass --servers one (one server at a time), or fewer "
                        "--config / --steps")
