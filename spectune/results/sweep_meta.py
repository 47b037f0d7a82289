"""sweep.json as a record: :class:`SweepMeta`, what a sweep writes about itself (its plan, backend, client, host and
versions, the order it ran in, its cost, drift check, guided plan and Ray layout) and what ``recommend`` and
``report`` read back. docs/results-format.md lists the keys.

The sweep (:mod:`spectune.sweep.run`, :mod:`spectune.sweep.distributed`, :mod:`spectune.sweep.ray_block`) keeps one
:class:`SweepMeta` up to date and writes :meth:`SweepMeta.to_json` through
:meth:`spectune.results.folder.SweepFolder.write_meta`; readers get :meth:`SweepMeta.from_json` of the file
(:class:`spectune.results.reader.Results` ``meta``). Keys this version does not know are carried through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spectune.core.json_types import JsonObject, JsonValue
from spectune.results.open_record import OpenRecord


@dataclass
class SweepMeta(OpenRecord):
    """sweep.json. Attribute names are the file's keys; :meth:`to_json` writes them in this order and leaves out
    the optional ones that are None.

    Attributes:
        spectune_version: the version that ran the sweep. created: UTC ISO 8601 start of its first run.
        plan: :meth:`spectune.sweep.plan.SweepPlan.to_json` (``steps``, ``concurrency``, ``dataset``, ``max_tokens``,
            SLOs in ms...), compared as written on ``--resume``.
        backend: :meth:`spectune.backends.base.Backend.describe` (``backend``, ``data_parallel_size``,
            ``schedule_server``...), refreshed after each server start and point.
        host, versions: :func:`spectune.measure.environment.environment`.
        resumed: UTC ISO 8601 start of the latest ``--resume``; history: the earlier runs' ``created``, ``resumed``,
            ``backend``, ``host`` and ``versions``.
        client: the load generator's timeouts (:meth:`spectune.loadgen.client.ClientTimeouts.to_json`).
        schedule_server: a ``--schedule-server`` sweep's engine schedule server (engine, pinned flag, max K, source).
        p_min: a ``--p-min`` sweep's cutoffs (:func:`spectune.sweep.p_min.p_min_summary`), or in a cutoff's own
            folder its server (:func:`spectune.sweep.p_min.p_min_server`).
        order: the order points ran in (``interleaved``, ``blocks``...). cost: s spent measuring, on drift checks
            and on server switches, and their total. guided: the guided plan's record. drift: the drift check's
            summary (:func:`spectune.sweep.drift.drift_summary`). ray: a ``--ray`` sweep's cluster address,
            resources, nodes available and server slots. calibration: its nodes' calibration check. lost_blocks: the
            blocks whose node was lost. nodes: the node each block ran on.
        extra: keys this version does not know, carried through.
    """

    spectune_version: str = ""
    created: str = ""
    plan: JsonObject = field(default_factory=dict)
    backend: JsonObject = field(default_factory=dict)
    host: JsonValue = None
    versions: JsonValue = None
    resumed: str | None = None
    history: list[JsonObject] | None = None
    client: JsonObject | None = None
    schedule_server: JsonValue = None
    p_min: JsonObject | None = None
    order: str | None = None
    cost: JsonObject | None = None
    guided: JsonObject | None = None
    drift: JsonObject | None = None
    ray: JsonObject | None = None
    calibration: JsonObject | None = None
    lost_blocks: list[JsonObject] | None = None
    nodes: JsonValue = None

    @classmethod
    def from_json(cls, obj: JsonObject) -> SweepMeta:
        """The record of a parsed sweep.json (a key it lacks takes the field's default)."""
        known, extra = cls.split(obj)
        return cls(**known, extra=extra)  # type: ignore[arg-type]

    def to_json(self) -> JsonObject:
        """sweep.json's object: the fields in order (optional ones only when set), then ``extra``."""
        out: JsonObject = {}
        for name in self.file_keys():
            v = getattr(self, name)
            if v is not None:
                out[name] = v
        return {**out, **self.extra}

    def run_record(self) -> JsonObject:
        """This run's entry of a later run's ``history``: its ``created``, ``resumed``, ``backend``, ``host`` and
        ``versions``, those it has, in that order."""
        written = self.to_json()
        return {k: written[k] for k in ("created", "resumed", "backend", "host", "versions") if k in written}

    def plan_value(self, key: str) -> JsonValue:
        """The plan's ``key`` (None when the plan has none)."""
        return self.plan.get(key)

    def plan_ints(self, key: str) -> list[int]:
        """The plan's list ``key`` as integers (``steps``, ``concurrency``; empty when absent)."""
        return [int(x) for x in self.plan.get(key) or []]  # type: ignore[union-attr, arg-type]

    def backend_value(self, key: str) -> JsonValue:
        """The backend description's ``key`` (``backend``, ``data_parallel_size``, ``schedule_server``...)."""
        return self.backend.get(key)

    @property
    def drift_summary(self) -> str:
        """The drift check's one-line summary ("" without one)."""
        return str((self.drift or {}).get("summary", ""))
