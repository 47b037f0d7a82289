"""A measured window's status: ``ok``, or ``failed`` with the reason (sweep points and validate runs alike)."""

from __future__ import annotations

from typing import Sequence

from spectune.loadgen.record import RequestRecord


def point_status(records: Sequence[RequestRecord], max_failure_rate: float) -> tuple[str, str]:
    """(``"ok"``, ``""``) or (``"failed"``, why) for a measured point.

    Failed when no request finished, when failed requests / measured requests > ``max_failure_rate``, or when no
    request produced output. The reason names the counts and the first error.
    """
    n = len(records)
    if n == 0:
        return "failed", "no measured request finished"
    failed = [r for r in records if r.error is not None]
    first = f"; first error: {failed[0].error}" if failed else ""
    if len(failed) / n > max_failure_rate:
        return "failed", f"{len(failed)} of {n} requests failed (more than {max_failure_rate:.0%}){first}"
    if not any(r.ok for r in records):
        return "failed", f"no request produced output ({n} measured){first}"
    return "ok", ""
