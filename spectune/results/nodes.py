"""Whether the nodes of a distributed sweep are alike (docs/distributed.md "Calibration"), and the check
``spectune recommend`` makes before comparing num_steps measured on different nodes.

A distributed sweep measures a calibration cell on every node it used: num_steps 0 (no speculation) at the plan's
lowest concurrency, with the plan's request settings. Its output throughput (tokens/s) and percentile-bootstrap
interval (:func:`spectune.results.confidence.point_intervals`) say how fast that node serves the same work.

Rule (:func:`node_verdicts`): node n's ratio is its throughput over the median of every node's calibration
throughput (the fleet's typical node; a median, so one odd node does not move it), with the interval [low_n /
median of the highs, high_n / median of the lows]. Node n is *unlike* when that whole interval lies outside the
noise band [1 - band, 1 + band] (band: the plan's ``noise_band``, 2% by default, as ``spectune recommend
--noise-band``): it differs from the others by more than the band, beyond what the noise explains. With two nodes
that differ, both are unlike (the median is their mean: neither is the odd one). A node whose calibration failed is
unknown (``alike`` None), never compared; so is a node with no other to compare with.

sweep.json ``nodes`` holds one entry per node id (:func:`node_entry`); a point's ``node`` object names its node, and
points of an unlike node carry ``"alike": false`` there.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Mapping, TypedDict

from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject

__all__ = ["node_verdicts", "unlike_nodes", "check_mixed_nodes", "calibration_numbers", "NodeVerdict"]


class NodeVerdict(TypedDict):
    """One node's verdict (:func:`node_verdicts`): its calibration throughput over the median node's (``ratio``),
    that ratio's interval (``low``, ``high``) and ``alike`` (True / False / None: unknown); all None when unknown."""

    ratio: float | None
    low: float | None
    high: float | None
    alike: bool | None


def calibration_numbers(point: JsonObject | None) -> tuple[float, float, float] | None:
    """(throughput, interval low, interval high) in tokens/s of an ok calibration point, the point's value for a
    missing bound; None when the point is missing, failed or lacks its throughput."""
    if not point or point.get("status") != "ok":
        return None
    m = point.get("metrics") or {}
    x = m.get("output_throughput_tok_s")
    if not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        return None
    lo, hi = m.get("output_throughput_ci_low"), m.get("output_throughput_ci_high")
    lo = float(lo) if isinstance(lo, (int, float)) and math.isfinite(lo) else float(x)
    hi = float(hi) if isinstance(hi, (int, float)) and math.isfinite(hi) else float(x)
    return float(x), min(lo, float(x)), max(hi, float(x))


def node_verdicts(calibrations: Mapping[str, JsonObject | None], band: float) -> dict[str, NodeVerdict]:
    """The verdict of every node from its calibration point (module docstring's rule).

    Args:
        calibrations: node id -> its calibration point (points.jsonl form), or None when it has none.
        band: the noise band, a fraction (0.02 = 2%).

    Returns:
        node id -> ``{"ratio", "low", "high", "alike"}``: the node's throughput over the median of every node's,
        the ratio's interval, and True / False / None (unknown: no usable calibration, or no other node to compare).
    """
    nums = {n: calibration_numbers(p) for n, p in calibrations.items()}
    known = {n: v for n, v in nums.items() if v is not None}
    out: dict[str, NodeVerdict] = {}
    for node, v in nums.items():
        if v is None or len(known) < 2:
            out[node] = {"ratio": None, "low": None, "high": None, "alike": None}
            continue
        ref = statistics.median(w[0] for w in known.values())
        ref_lo = statistics.median(w[1] for w in known.values())
        ref_hi = statistics.median(w[2] for w in known.values())
        ratio, low, high = v[0] / ref, v[1] / ref_hi, v[2] / ref_lo
        unlike = low > 1 + band or high < 1 - band
        out[node] = {"ratio": ratio, "low": low, "high": high, "alike": not unlike}
    return out


def unlike_nodes(meta: JsonObject | None) -> dict[str, JsonObject]:
    """The nodes sweep.json's ``nodes`` marks unlike (``alike`` false): node id -> its entry."""
    nodes = (meta or {}).get("nodes") or {}
    return {n: e for n, e in nodes.items() if isinstance(e, dict) and e.get("alike") is False}


def _node_ids(points: Iterable[JsonObject]) -> set[str]:
    return {str((p.get("node") or {}).get("id")) for p in points if isinstance(p.get("node"), dict)}


def check_mixed_nodes(meta: JsonObject | None, points: Iterable[JsonObject], allow: bool) -> list[str]:
    """Before comparing num_steps: refuse when the points come from two or more nodes and one of them is unlike.

    Returns:
        warnings to show (the unlike nodes, when ``allow``); empty when the points are comparable.

    Raises:
        UserError: unlike nodes among the points' nodes and not ``allow`` (names them and ``--allow-mixed-nodes``).
    """
    used = _node_ids(points)
    bad = {n: e for n, e in unlike_nodes(meta).items() if n in used}
    if len(used) < 2 or not bad:
        return []
    named = ", ".join(f"{e.get('hostname') or e.get('ip') or n[:8]} ({n[:8]}, calibration "
                      f"{e.get('ratio'):.3f}x the median node)" if isinstance(e.get("ratio"), (int, float)) else n[:8]
                      for n, e in sorted(bad.items()))
    if not allow:
        raise UserError(f"the sweep's points come from {len(used)} nodes and {named} is outside the nodes' noise "
                        "band: num_steps measured on unlike nodes are not comparable; re-run its blocks on alike "
                        "nodes, or pass --allow-mixed-nodes to compare anyway")
    return [f"comparing points from unlike nodes (--allow-mixed-nodes): {named}"]
