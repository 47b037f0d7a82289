"""The driver of a distributed sweep: ``spectune sweep --ray ADDRESS|auto`` (docs/distributed.md).

Each num_steps block of the grid (server start, its concurrencies and repeats, the block's drift check, server
stop) runs as one Ray task (:func:`spectune.sweep.ray_block.block_events`) on a node that has the resources one
server needs (``--ray-resources``, default ``{"CPU": 1}``); the load generator runs in that task, beside its server.
The tasks stream their points back (a Ray streaming generator) and this driver writes the one results folder as they
arrive: the same files as a serial sweep (:class:`spectune.results.folder.SweepFolder`), each point with the
``node`` it was measured on, plus ``calibration.jsonl`` and sweep.json's ``nodes``.

Failures and cancelling:

- a block whose task is lost (its node died, its worker crashed: a Ray system error) is submitted again with only
  its points not yet received, and Ray places it on a node that is alive; after ``max_attempts`` submissions its
  remaining points are written as failed (``stop_reason`` ``node_lost``; ``--resume --retry-failed`` measures them);
- a :class:`UserError` inside a task (a missing program on that node, a bad template) stops the sweep with that
  error, naming the node;
- cancelling (Ctrl-C, SIGTERM: the driver's asyncio task is cancelled) cancels every Ray task
  (``ray.cancel``: KeyboardInterrupt inside the task, whose sweep then stops its server), waits up to
  :data:`spectune.measure.ray_cluster.CANCEL_WAIT_S` for them to end, then force-kills what is left (Ray then
  kills the worker's child processes, docs.ray.io "Lifetimes of a User-Spawn Process").

Progress: each task's node, label, points done / total and current point go to the listener's ``node_progress``
(:class:`spectune.measure.node_progress.NodeBoard`; the display draws one bar per running task).

Calibration (:mod:`spectune.results.nodes`): every node that runs a block measures the calibration cell, num_steps 0
at the plan's lowest concurrency: one extra task pinned there (``NodeAffinitySchedulingStrategy(soft=False)``),
submitted when its first block starts there, so it runs after that block (the node that runs num_steps 0's block
uses that block's own point instead). At the end every node gets its verdict and the points of unlike nodes are
marked. Blocks are submitted largest num_steps first (the slowest blocks start first).

Ray (``pip install -e ".[ray]"``) is imported only for ``--ray`` (the pieces this driver shares with
``spectune validate --ray`` are in :mod:`spectune.measure.ray_cluster`). Sources: Ray's generator and
cancellation documentation (docs.ray.io ray-core/ray-generator.html, api/doc/ray.cancel.html,
fault_tolerance/tasks.html).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Sequence

from spectune.backends.base import Backend
from spectune.backends.options import BackendOptions
from spectune.loadgen.datasets import Prompt
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.measure.load_settings import ClientTimeouts
from spectune.measure.node_progress import NodeBoard, NodeTask
from spectune.measure.ray_cluster import (RAY_EXTRA, LostTask, NodeRef, TaskOptions, TaskSubmitter, connect, fits,
                                          hosts, import_ray, parse_resources, run_together, append_node_log,
                                          server_slots, stream_task, task_options, where)
from spectune.results.durable import atomic_write, writing
from spectune.results.folder import SweepFolder
from spectune.results.nodes import node_verdicts
from spectune.results.point import SweepPoint
from spectune.results.schema import Key, PointKey
from spectune.results.sweep_meta import SweepMeta
from spectune.results.sweep_nodes import PointNode, SweepNode
from spectune.sweep.drift import DriftCheck, drift_summary
from spectune.sweep.plan import SweepListener, SweepPlan

if TYPE_CHECKING:
    from ray.remote_function import RemoteFunction

    from spectune.sweep.guided import GuidedPlanner
    from spectune.sweep.ray_block import BlockEvent, BlockPayload

__all__ = ["RayOptions", "RaySweep", "parse_resources", "RAY_EXTRA"]

_COST_KEYS = ("points", "drift_points", "launches", "measure_s", "drift_s", "switch_s")


def _calibration_line(point: SweepPoint) -> JsonObject:
    """A calibration.jsonl line: the point's object with its ``node`` first."""
    obj = point.to_dict()
    return {"node": obj.pop("node"), **obj}


class BlockTaskOptions(TaskOptions, total=False):
    """``.options(...)`` of a block task: a streaming generator without automatic retries, and the resources of
    one server (:class:`spectune.measure.ray_cluster.TaskOptions`)."""

    num_returns: str
    max_retries: int


@dataclass(frozen=True)
class RayOptions:
    """How a sweep uses a Ray cluster.

    Attributes:
        address: ``auto`` (``RAY_ADDRESS`` when set, else a Ray instance started on this machine) or a cluster
            address (``ray://host:10001``, ``host:6379``).
        resources: what one server (one block task) needs: Ray resource name -> amount (:func:`parse_resources`).
        max_attempts: submissions of one block (the first + re-runs after its task was lost).
        calibrate: measure the calibration cell on every node used.
    """

    address: str = "auto"
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    max_attempts: int = 3
    calibrate: bool = True

    def sweep(self, plan: SweepPlan, backend_name: str, options: BackendOptions, folder: SweepFolder,
              prompts: list[Prompt], meta: SweepMeta, listener: SweepListener,
              timeouts: ClientTimeouts) -> "RaySweep":
        """The distributed sweep :func:`spectune.sweep.run.execute` runs instead of a serial one (run.py asks this
        object for it, so the serial sweep's module never imports this one)."""
        return RaySweep(plan, backend_name, options, folder, prompts, meta, listener, timeouts, self)

    def check_backend(self, backend: Backend | None) -> None:
        """Ray is installed and ``backend`` launches its servers.

        Raises:
            UserError: Ray missing (names the extra); a backend that launches no server (the ``openai`` backend's
                running endpoints: a task would measure them across the network).
        """
        import_ray()
        from spectune.backends.launch import LaunchingBackend

        if backend is not None and not isinstance(backend, LaunchingBackend):
            raise UserError(f"--ray needs a backend that launches its servers (launch, sglang, vllm, llamacpp, local), "
                            f"not {getattr(backend, 'name', backend)!r}: each task starts its server beside its load "
                            "generator")

    def check(self, plan: SweepPlan, backend: Backend | None = None) -> None:
        """What a distributed sweep cannot do with this plan and backend, before anything is written.

        Raises:
            UserError: Ray missing; ``--order interleaved``; a backend that launches no server
                (:meth:`check_backend`).
        """
        self.check_backend(backend)
        if plan.order == "interleaved":
            raise UserError("--ray measures one num_steps block per task: use --order blocks or auto with --ray")

    def task_options(self) -> TaskOptions:
        """``.options(...)`` of a block task: ``num_cpus``, ``num_gpus``, ``memory`` and custom ``resources``."""
        return task_options(self.resources)

    def fits(self, node_resources: dict[str, float]) -> bool:
        """Whether a node with these total resources can host one server."""
        return fits(self.resources, node_resources)


class RaySweep:
    """Runs a grid sweep's missing points as one Ray task per num_steps block (module docstring); the same surface
    as :class:`spectune.sweep.run.Sweep` for :func:`spectune.sweep.run.execute` (``run``, ``ran``, ``predicted``,
    ``meta``).

    Args:
        plan, backend_name, options, folder, prompts, meta, listener, timeouts: as for the serial sweep (the backend
            is built inside each task, from ``backend_name`` and ``options``).
        ray_options: the cluster and the resources of one server.
    """

    def __init__(self, plan: SweepPlan, backend_name: str, options: BackendOptions, folder: SweepFolder,
                 prompts: list[Prompt], meta: SweepMeta, listener: SweepListener | None,
                 timeouts: ClientTimeouts, ray_options: RayOptions) -> None:
        self.plan, self.backend_name, self.options, self.folder = plan, backend_name, options, folder
        self.prompts, self.meta, self.timeouts, self.ray_options = prompts, meta, timeouts, ray_options
        self.listener = listener or SweepListener()
        self.ran = 0
        self.predicted: list[JsonObject] = []
        self.cost: dict[str, float] = {k: 0 if k in ("points", "drift_points", "launches") else 0.0 for k in _COST_KEYS}
        self.drift_checks: list[DriftCheck] = []
        old = meta.nodes
        self.nodes: dict[str, SweepNode] = ({str(n): SweepNode.from_json(e) for n, e in old.items()
                                             if isinstance(e, dict)} if isinstance(old, dict) else {})
        self.calibrating: set[str] = set()
        self.calibrations: dict[str, SweepPoint] = {}  # node id -> its calibration.jsonl line
        self.backend_description: JsonObject | None = None
        self._ray: ModuleType | None = None
        self._remote: TaskSubmitter | None = None
        self.slots = 1  # servers the cluster runs side by side (set once connected): a guided round's width
        self._fn: RemoteFunction | None = None  # ray.remote(block_events)
        self._opts: BlockTaskOptions = {}  # its task options
        self._aux: list[asyncio.Future] = []  # calibration tasks started on the way
        self.board = NodeBoard()  # what each node runs now (the per-node progress)
        self.planner: GuidedPlanner | None = None  # the guided plan's GuidedPlanner, while it runs

    # -- the run ----------------------------------------------------------------------------------------------------
    async def run(self, todo: Sequence[Key]) -> None:
        """Measure the points ``todo``: one task per num_steps block, every block at once (Ray queues what the
        cluster cannot place yet), plus the calibration tasks; then the nodes' verdicts.

        Raises:
            UserError: no node has the resources of one server; a task's configuration problem.
            asyncio.CancelledError: cancelled (every task cancelled and waited for first).
        """
        todo = [PointKey(*k) for k in todo]
        ray = self._ray = import_ray()
        from spectune.sweep.ray_block import block_events

        self.meta.order = "blocks"
        self.meta.ray = {"address": self.ray_options.address, "resources": self.ray_options.resources}
        connected = connect(ray, self.ray_options.address)  # before any task; ray.init wants the main thread
        t0 = time.perf_counter()
        try:
            # a streaming generator (every point reaches the driver as it is yielded); no automatic retries: a lost
            # block is submitted again by _block with only its unfinished points
            self._fn = ray.remote(block_events)
            self._opts = {"num_returns": "streaming", "max_retries": 0, **self.ray_options.task_options()}
            self._remote = self._fn.options(**self._opts)
            nodes = hosts(ray, self.ray_options.resources)
            self.meta.ray["nodes_available"] = len(nodes)
            self.slots = self.meta.ray["server_slots"] = server_slots(nodes, self.ray_options.resources)
            self._load_calibrations()
            try:
                if self.plan.design == "guided":
                    await self._guided()
                else:
                    await self._run_blocks(todo)
                while any(not f.done() for f in self._aux):
                    await asyncio.gather(*self._aux)
                for f in self._aux:
                    f.result()
            except BaseException:
                for job in self._aux:
                    job.cancel()
                await asyncio.gather(*self._aux, return_exceptions=True)
                raise
            self._verdicts()
        finally:
            self.cost["wall_s"] = time.perf_counter() - t0
            self._save_meta()
            if connected:
                ray.shutdown()

    async def _run_blocks(self, keys: Sequence[Key]) -> None:
        """Measure ``keys``: one task per num_steps block, every block at once (Ray queues what the cluster cannot
        place yet), the longest blocks (largest num_steps: the slowest verify steps) first, so they are not the
        last to start; a node is calibrated once its first block runs there (:meth:`_node_seen`)."""
        blocks: dict[int, list[Key]] = {}
        for key in sorted(keys):
            blocks.setdefault(key.steps, []).append(key)
        await run_together([self._block(steps, ks) for steps, ks in sorted(blocks.items(), reverse=True)])

    async def _guided(self) -> None:
        """The guided plan (:mod:`spectune.sweep.guided`) round by round: each round's cells (the planner's
        ``next_round`` with a width of the cluster's server slots: as many cells, or num_steps where a restart costs
        more than a point, as servers can run side by side; or its settle step's re-runs) measured as one task per num_steps block, all at once; the
        planner sees every result of a round before it chooses the next. Rounds stop when settled or when the next
        would pass the budget (points: the round is cut to what fits; time: the blocks' summed measuring time, as
        a serial sweep counts it). Then every unmeasured cell is predicted into summary.csv, as
        :meth:`spectune.sweep.run.Sweep._guided` does."""
        from spectune.results.confidence import requests_by_point
        from spectune.sweep.guided import GuidedPlanner

        planner = self.planner = GuidedPlanner.for_plan(self.plan)
        tried = {p.key.cell for p in self.folder.points}
        stop = ""
        while not stop:
            keys = planner.next_keys(self.folder.points, tried, self.cost,
                                     lambda: requests_by_point(self.folder.read_requests()), width=self.slots)
            if not keys:
                break
            batch: list[Key] = []
            for key in keys:
                stop = self._over_budget(len(batch))
                if stop:
                    break
                batch.append(key)
            if not batch:
                break
            tried |= {key.cell for key in batch}
            await self._run_blocks(batch)
        self.predicted, guided = planner.finish(self.folder.points, stop)
        self.folder.predicted = self.predicted
        self.folder.write_summary()
        self.meta.guided = {**guided, "parallel_rounds": True, "width": self.slots}

    def _over_budget(self, queued: int) -> str:
        """Why the guided plan must not measure one more cell's runs (``queued`` points already in this round):
        its budget is spent, or ""."""
        plan, cost = self.plan, self.cost
        if plan.budget_points is not None and cost["points"] + queued + plan.repeats > plan.budget_points:
            return f"budget of {plan.budget_points} points"
        if plan.budget_s is not None and cost["measure_s"] + cost["drift_s"] + cost["switch_s"] >= plan.budget_s:
            return f"budget of {plan.budget_s:g} s"
        return ""

    def _payload(self, keys: Sequence[Key], plan: SweepPlan | None = None) -> BlockPayload:
        """A block task's payload (:func:`spectune.sweep.ray_block.block_events`). A guided round's block carries
        no drift check (a round's block is a few cells) and the planner's window goals of its keys."""
        plan = plan or self.plan
        goals: dict[Key, str] = {}
        if self.planner is not None:
            plan = replace(plan, drift_check=False)
            goals = {k: g for k in keys if (g := self.planner.window_goal(k)) is not None}
        return {"plan": plan, "backend": self.backend_name, "options": replace(self.options),
                "keys": [list(k) for k in keys], "prompts": self.prompts, "timeouts": self.timeouts,
                "points": list(self.folder.points), "goals": goals}

    async def _block(self, steps: int, keys: list[Key]) -> None:
        """Measure one block, submitting it again (its points not yet received) when its task is lost."""
        remaining = list(keys)
        for attempt in range(1, self.ray_options.max_attempts + 1):
            lost = await self._stream(self._remote, self._payload(remaining), remaining, f"block K={steps}")
            if lost is None:
                return
            if not remaining:
                return
            again = attempt < self.ray_options.max_attempts
            self.listener.warning(f"block K={steps} lost on {lost['where']} ({lost['error']}); "
                                  + (f"re-running its {len(remaining)} unfinished point(s) on another node"
                                     if again else f"{len(remaining)} point(s) left failed after "
                                     f"{attempt} attempts (--resume --retry-failed measures them)"))
            self.meta.lost_blocks = (self.meta.lost_blocks or []) + [{"steps": steps, "node": lost["node"],
                                                                      "error": lost["error"],
                                                                      "points_left": len(remaining)}]
        for key in list(remaining):
            point = SweepPoint.failed(key, "its node was lost", self.plan.requests_for(key.concurrency),
                                      stop_reason="node_lost")
            point.extra["node"] = None
            self._record(point, [], None)

    async def _stream(self, remote: TaskSubmitter, payload: BlockPayload, remaining: list[Key] | None, label: str,
                      on_point: Callable[[SweepPoint, list[JsonObject]], None] | None = None) -> LostTask | None:
        """Submit one task and handle its events until it ends (:func:`spectune.measure.ray_cluster.stream_task`).
        Returns None when it ended normally, or what was lost (``{"node", "where", "error"}``) when Ray reports a
        system failure (node or worker died).

        Raises:
            UserError: the task raised one (named with its node). RuntimeError: the task failed with another
                error (a bug). asyncio.CancelledError: cancelled (the task is cancelled and waited for).
        """
        keys = [PointKey(*k) for k in payload["keys"]]
        bar: list[NodeTask] = []  # this task's row of the per-node progress, once its node is known

        def on_event(event: BlockEvent, ref: NodeRef | None) -> None:
            kind, node = event["kind"], PointNode.from_json(ref)
            if kind == "node":
                self._node_seen(node or PointNode(), label, keys)
                bar.append(self.board.start(ref or {}, label, len(keys), "points"))
                self.listener.node_progress(bar[0])
            elif kind == "point":
                point = SweepPoint.from_dict({**event["point"], "node": ref})
                if on_point is not None:
                    on_point(point, event["requests"])
                else:
                    self._record(point, event["requests"], node)
                    key = point.key
                    node_id = node.id if node is not None else None
                    if (key == self._calibration_key() and node_id and self.ray_options.calibrate
                            and node_id not in self.calibrations):
                        self._save_calibration(node_id, point)  # the K=0 block's point: this node's calibration
                    if remaining is not None and key in remaining:
                        remaining.remove(key)
                if bar:
                    self.listener.node_progress(self.board.advance(bar[0]))
            elif kind == "drift":
                self._drift(event, ref)
            elif kind == "log":
                self._log(event, ref)
            elif kind == "done":
                self._done(event)
            elif kind == "server_starting":
                self.listener.server_starting(int(event["steps"]))
                if bar:
                    self.listener.node_progress(self.board.update(bar[0], current="starting the server"))
            elif kind == "server_failed":
                self.listener.server_failed(int(event["steps"]), f"{where(ref)}: {event['message']}",
                                            event["log_tail"])
            elif kind == "point_started":
                key = PointKey(*event["key"])
                self.listener.point_started(key, int(event["planned"]))
                if bar:
                    self.listener.node_progress(self.board.update(
                        bar[0], current=f"K={key.steps} c={key.concurrency} r={key.repeat}"))
            elif kind == "warning":
                self.listener.warning(f"{where(ref)}: {event['message']}")

        try:
            return await stream_task(self._ray, remote, payload, on_event, label)
        finally:
            if bar:
                self.listener.node_progress(self.board.end(bar[0]))

    # -- calibration ------------------------------------------------------------------------------------------------
    def _load_calibrations(self) -> None:
        """calibration.jsonl of a resumed sweep: the calibrations of the nodes that measured its earlier points."""
        from spectune.results.durable import iter_jsonl

        for _, obj in iter_jsonl(self.folder.path / "calibration.jsonl"):
            point = SweepPoint.from_dict(obj) if isinstance(obj, dict) else None
            if point is not None and point.node is not None and point.node.id:
                self.calibrations[point.node.id] = point

    def _calibrate_later(self, node_id: str) -> None:
        """Start the calibration task of ``node_id`` unless it has one (done or running)."""
        if not self.ray_options.calibrate or node_id in self.calibrations or node_id in self.calibrating:
            return
        self.calibrating.add(node_id)
        self._aux.append(asyncio.ensure_future(self._calibrate(node_id)))

    def _calibration_key(self) -> Key:
        """The calibration cell: num_steps 0 at the plan's lowest concurrency, first repeat."""
        return PointKey(0, min(self.plan.concurrency), 0)

    def _save_calibration(self, node_id: str, point: SweepPoint) -> None:
        """Record ``point`` (measured on ``node_id``) as its calibration: calibration.jsonl rewritten atomically
        (each line its point's object, ``node`` first)."""
        if point.node in (None, PointNode()):
            point.extra["node"] = {"id": node_id}
        self.calibrations[node_id] = point
        path = self.folder.path / "calibration.jsonl"
        lines = [json.dumps(_calibration_line(p)) + "\n" for p in self.calibrations.values()]
        with writing(path, self.folder.path):
            atomic_write(path, lambda fh: fh.writelines(lines))
        tput = point.numbers.output_throughput_tok_s
        node = point.node
        self.listener.note(f"calibration on {where(node.where if node else None)}: K=0 c={point.concurrency} "
                           + (f"{tput:,.1f} tok/s" if tput is not None else point.status))

    async def _calibrate(self, node_id: str) -> None:
        """Measure num_steps 0 at the lowest concurrency on ``node_id`` (one task pinned there) into
        calibration.jsonl; a failed or lost calibration leaves the node unknown."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        plan = replace(self.plan, steps=(0,), drift_check=False)
        key = self._calibration_key()
        remote = self._fn.options(**self._opts,
                                  scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
        got: list[tuple[SweepPoint, list[JsonObject]]] = []
        label = f"calibration (K=0 c={key.concurrency})"
        lost = await self._stream(remote, self._payload([key], plan) | {"points": [], "goals": {}}, None, label,
                                  on_point=lambda p, r: got.append((p, r)))
        if lost is not None or not got:
            self.listener.warning(f"{label} on node {node_id[:8]} did not finish"
                                  + (f": {lost['error']}" if lost else ""))
            return
        self._save_calibration(node_id, got[-1][0])

    def _verdicts(self) -> None:
        """Every node's verdict from the calibrations (:func:`spectune.results.nodes.node_verdicts`) into
        sweep.json ``nodes``; the points of unlike nodes get ``"alike": false`` in their ``node`` (points.jsonl
        rewritten) and a warning names each unlike node."""
        if not self.calibrations:
            return
        verdicts = node_verdicts({n: p.to_dict() for n, p in self.calibrations.items()}, self.plan.noise_band)
        for node_id, v in verdicts.items():
            cal = self.calibrations[node_id]
            entry = self.nodes.setdefault(node_id, SweepNode.at(cal.node or PointNode(), node_id))
            entry.calibrate(cal.steps, cal.concurrency, cal.status, cal.numbers)
            entry.verdict = {**(entry.verdict or {}), **v}
            if v["alike"] is False:
                self.listener.warning(f"node {where(entry.to_json())} is outside the nodes' noise band: its "
                                      f"calibration is {v['ratio']:.3f}x the median node's [{v['low']:.3f}, "
                                      f"{v['high']:.3f}] (band {self.plan.noise_band:.0%}); its points are marked "
                                      "and spectune recommend refuses to compare across it without "
                                      "--allow-mixed-nodes")
        unlike = {n for n, v in verdicts.items() if v["alike"] is False}
        self.meta.calibration = {"noise_band": self.plan.noise_band, "unlike": sorted(unlike),
                                    "nodes": len(verdicts)}
        changed = False
        for p in self.folder.points:
            node = p.node
            if node is not None and node.id in verdicts and node.alike != verdicts[node.id]["alike"]:
                p.extra["node"] = {**p.extra["node"], "alike": verdicts[node.id]["alike"]}  # type: ignore[dict-item]
                changed = True
        if changed:
            self.folder.rewrite_points()

    # -- events -----------------------------------------------------------------------------------------------------
    def _node_seen(self, node: PointNode, label: str, keys: Sequence[Key] = ()) -> None:
        node_id = node.id
        if not node_id:
            return
        entry = self.nodes.setdefault(node_id, SweepNode.at(node, node_id))
        if label.startswith("block"):
            entry.blocks.append(label)
            self.listener.note(f"{label} started on {where(node.where)}")
            if self._calibration_key() not in keys:  # else the block's own point is the node's calibration
                self._calibrate_later(node_id)
        self._save_meta()

    def _record(self, point: SweepPoint, requests: list[JsonObject], node: PointNode | None) -> None:
        """Write a finished point and its request objects into the folder (durable, summary.csv rewritten)."""
        for obj in requests:
            self.folder.append_request(obj)
        self.folder.append_point(point)
        self.ran += 1
        if node is not None and node.id in self.nodes:
            self.nodes[node.id].points += 1
        self.listener.point_finished(point)

    def _drift(self, event: BlockEvent, node: NodeRef | None) -> None:
        for obj in event["requests"]:
            self.folder.append_drift_request(obj)
        check = replace(event["check"], extra={"node": node})  # type: ignore[dict-item]
        self.drift_checks.append(check)
        self.meta.drift = drift_summary(self.drift_checks, "blocks")
        self.listener.drift_checked(check)

    def _log(self, event: BlockEvent, node: NodeRef | None) -> None:
        """A server's log from a task, appended to logs/ (:func:`spectune.measure.ray_cluster.append_node_log`)."""
        append_node_log(self.folder.logs, event, node, self.folder.path)

    def _done(self, event: BlockEvent) -> None:
        for k in _COST_KEYS:
            self.cost[k] += (event.get("cost") or {}).get(k) or 0
        desc = event.get("backend")
        if isinstance(desc, dict):  # every block's server launches, in the order the blocks ended
            launches = list((self.backend_description or {}).get("launches") or []) + list(desc.get("launches") or [])
            self.backend_description = {**desc, **({"launches": launches} if launches else {})}

    def _save_meta(self) -> None:
        c = self.cost
        self.meta.cost = {**c, "total_s": c["measure_s"] + c["drift_s"] + c["switch_s"]}
        self.meta.nodes = {n: e.to_json() for n, e in self.nodes.items()}
        if self.backend_description is not None:
            self.meta.backend = self.backend_description
        self.folder.write_meta(self.meta)
