"""The nodes of a distributed sweep (``spectune sweep --ray``, docs/distributed.md) as records: :class:`PointNode`,
a point's ``node`` object in points.jsonl and calibration.jsonl, and :class:`SweepNode`, one entry of sweep.json's
``nodes``. :mod:`spectune.sweep.distributed` keeps them; the verdicts come from :mod:`spectune.results.nodes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spectune.core.json_types import JsonObject, JsonValue
from spectune.results.point_numbers import PointNumbers

__all__ = ["PointNode", "SweepNode"]


def _text(value: JsonValue) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class PointNode:
    """A point's ``node``: where it was measured (:func:`spectune.measure.ray_cluster.node_ref`).

    Attributes:
        id: the Ray node id (None while the node is not known). ip, hostname: its address and name, or None.
        alike: the node's verdict once the calibrations are in (``False`` marks an unlike node's points), or None.
    """

    id: str | None = None
    ip: str | None = None
    hostname: str | None = None
    alike: bool | None = None

    @classmethod
    def from_json(cls, obj: object) -> PointNode | None:
        """The record of a ``node`` object (:class:`spectune.measure.ray_cluster.NodeRef` and ``alike``); None
        when ``obj`` is not an object (no node: a serial sweep's point, or a point whose node was lost)."""
        if not isinstance(obj, dict):
            return None
        alike = obj.get("alike")
        return cls(_text(obj.get("id")), _text(obj.get("ip")), _text(obj.get("hostname")),
                   None if alike is None else bool(alike))

    @property
    def where(self) -> JsonObject:
        """``{"id", "ip", "hostname"}``, for :func:`spectune.measure.ray_cluster.where`."""
        return {"id": self.id, "ip": self.ip, "hostname": self.hostname}


@dataclass
class SweepNode:
    """One node of sweep.json ``nodes`` (by node id, docs/results-format.md): where it is, the blocks it ran and
    its points; with a calibration, that and its verdict (:func:`spectune.results.nodes.node_verdicts`).

    Attributes:
        id, ip, hostname: the node (:class:`PointNode`). blocks: the labels of the blocks it ran (``block K=3``).
        points: points it measured. calibration: its calibration point's cell, ``status``, output throughput
            (tokens/s) with its interval and TPOT p50 (ms), or None before it is measured.
        verdict: ``ratio``, ``low``, ``high``, ``alike`` (:class:`spectune.results.nodes.NodeVerdict`), or None.
    """

    id: str
    ip: str | None = None
    hostname: str | None = None
    blocks: list[str] = field(default_factory=list)
    points: int = 0
    calibration: JsonObject | None = None
    verdict: JsonObject | None = None

    @classmethod
    def at(cls, node: PointNode, node_id: str) -> SweepNode:
        """A new entry for ``node`` (``node_id``: its id)."""
        return cls(node_id, node.ip, node.hostname)

    @classmethod
    def from_json(cls, obj: JsonObject) -> SweepNode:
        """The record of an entry as :meth:`to_json` wrote it (a resumed sweep's)."""
        verdict = {k: obj[k] for k in ("ratio", "low", "high", "alike") if k in obj}
        calibration = obj.get("calibration")
        return cls(str(obj.get("id")), _text(obj.get("ip")), _text(obj.get("hostname")),
                   [str(b) for b in obj.get("blocks") or []],  # type: ignore[union-attr]
                   int(obj.get("points") or 0),  # type: ignore[arg-type]
                   calibration if isinstance(calibration, dict) else None, verdict or None)

    def calibrate(self, steps: int, concurrency: int, status: str, numbers: PointNumbers) -> None:
        """Set :attr:`calibration` from its calibration point's cell, status and numbers."""
        self.calibration = {"steps": steps, "concurrency": concurrency, "status": status,
                            "output_throughput_tok_s": numbers.output_throughput_tok_s,
                            "output_throughput_ci_low": numbers.output_throughput_ci_low,
                            "output_throughput_ci_high": numbers.output_throughput_ci_high,
                            "tpot_p50_ms": numbers.tpot_p50_ms}

    def to_json(self) -> JsonObject:
        """The sweep.json entry: ``id``, ``ip``, ``hostname``, ``blocks``, ``points``, then ``calibration`` and
        the verdict's keys when known."""
        out: JsonObject = {"id": self.id, "ip": self.ip, "hostname": self.hostname, "blocks": list(self.blocks),
                           "points": self.points}
        if self.calibration is not None:
            out["calibration"] = self.calibration
        return {**out, **(self.verdict or {})}
