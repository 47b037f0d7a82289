"""What ``spectune sweep --ray`` and ``spectune validate --ray`` share (docs/distributed.md): importing Ray, the
resources of one server, connecting to the cluster, the nodes that can host a server, and one measuring task on
both of its sides.

- The task side (:func:`task_events`): a Ray task's body runs an async measurement (``measure(emit)``) on an
  event loop in a thread of the task and yields what it emits, one event (a plain dict) at a time, after a first
  ``{"kind": "node", ...}`` event saying where it runs (a Ray streaming generator: every ``yield`` reaches the
  driver before the task ends). A cancelled task (``ray.cancel``: KeyboardInterrupt in the task) or a closed
  generator cancels the measurement, whose ``finally`` stops its server, and waits for that before it returns.
- The driver side (:func:`stream_task`): submit one task, hand each event to a callback, and classify how it
  ended: normally; lost (its node or worker died: a Ray system error, so the caller may submit it again); a
  :class:`UserError` inside it (re-raised naming the node); or cancelled (the task is cancelled, waited for up to
  :data:`CANCEL_WAIT_S`, then force-killed; Ray then kills the worker's child processes, docs.ray.io "Lifetimes of
  a User-Spawn Process").

Ray (``pip install -e ".[ray]"``) is imported only by :func:`import_ray`, called only for ``--ray``. Sources: Ray's
generator and cancellation documentation (docs.ray.io ray-core/ray-generator.html, api/doc/ray.cancel.html,
fault_tolerance/tasks.html).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import socket
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Awaitable, Callable, Iterator, Mapping, Protocol, Sequence, TypedDict, TypeVar

from spectune.core.errors import UserError
from spectune.results.durable import writing

if TYPE_CHECKING:
    from ray import ObjectRefGenerator
    from typing_extensions import Required

__all__ = ["RAY_EXTRA", "CANCEL_WAIT_S", "STOP_GRACE_S", "import_ray", "parse_resources", "task_options",
           "fits", "connect", "hosts", "node_identity", "node_ref", "where", "task_events", "stream_task",
           "cancel_task", "server_slots", "run_together", "append_node_log"]

RAY_EXTRA = 'pip install -e ".[ray]"'
#: s a cancelled task gets to stop its server before it is force-killed
CANCEL_WAIT_S = 60.0
#: s a task waits for its measurement's ``finally`` (the server's stop) after a cancel, before it returns anyway
STOP_GRACE_S = 90.0


class NodeIdentity(TypedDict):
    """Where a task runs (:func:`node_identity`): the Ray node id and IP address (None outside a Ray worker), the
    host name and the process id."""

    node_id: str | None
    ip: str | None
    hostname: str
    pid: int


class Event(TypedDict, total=False):
    """One event of a measuring task (module docstring): its ``kind`` and that kind's keys. Here the kinds both
    sides share: ``node`` (:class:`NodeIdentity`'s keys), ``log`` (``name``, ``text``) and ``warning``
    (``message``); a sweep's block and a validate run add their own (:class:`spectune.sweep.ray_block.BlockEvent`,
    :class:`spectune.validate.distributed.RunEvent`)."""

    kind: Required[str]
    node_id: str | None
    ip: str | None
    hostname: str
    pid: int
    name: str
    text: str
    message: str


EventT = TypeVar("EventT", bound=Event)
"""The events of one kind of task (a sweep's block, a validate run), for the driver's callback."""


class NodeRef(TypedDict, total=False):
    """A result's ``node`` object (:func:`node_ref` sets all three keys; ``{}`` while the node is not known)."""

    id: str | None
    ip: str | None
    hostname: str | None


class LostTask(TypedDict):
    """What :func:`stream_task` returns for a lost task: its node (None before its ``node`` event), that node for
    messages (:func:`where`) and the error."""

    node: NodeRef | None
    where: str
    error: str


class RayNode(TypedDict, total=False):
    """A ``ray.nodes()`` entry: the keys spectune reads (Ray's entries have more)."""

    Alive: bool
    Resources: dict[str, float]


class TaskOptions(TypedDict, total=False):
    """Keyword arguments of a Ray task's ``.options(...)`` (:func:`task_options`; ``num_cpus`` is always set)."""

    num_cpus: float
    num_gpus: float
    memory: float
    resources: dict[str, float]


class TaskSubmitter(Protocol):
    """A Ray remote function with its options (``ray.remote(fn).options(num_returns="streaming", ...)``):
    ``remote(payload)`` submits one task and returns its streaming generator."""

    def remote(self, payload: object, /) -> ObjectRefGenerator: ...


def import_ray() -> ModuleType:
    """The ``ray`` module.

    Raises:
        UserError: Ray is not installed (names the extra to install).
    """
    try:
        import ray
    except ImportError:
        raise UserError(f'--ray needs Ray, an optional extra: {RAY_EXTRA} (or pip install "spectune[ray]")') from None
    return ray


def parse_resources(text: str | None) -> dict[str, float]:
    """``--ray-resources JSON``: what one server needs, e.g. ``{"GPU": 1}`` or ``{"CPU": 4, "GPU": 2}``, as Ray
    resource names (``CPU``, ``GPU``, ``memory`` in bytes, or a custom resource) -> amounts; ``CPU`` defaults to 1.

    Raises:
        UserError: not a JSON object of non-negative numbers.
    """
    out: dict[str, float] = {"CPU": 1.0}
    if text is None or not str(text).strip():
        return out
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                            and not isinstance(v, bool) and v >= 0 for k, v in obj.items()):
        raise UserError(f"bad --ray-resources {text!r}: give a JSON object of resource amounts, e.g. "
                        "'{\"GPU\": 1}' or '{\"CPU\": 8, \"GPU\": 2}'")
    out.update({k: float(v) for k, v in obj.items()})
    return out


def task_options(resources: dict[str, float]) -> TaskOptions:
    """``.options(...)`` of a task needing ``resources`` (:func:`parse_resources`): ``num_cpus``, ``num_gpus``,
    ``memory`` and custom ``resources``."""
    res = dict(resources)
    opts: TaskOptions = {"num_cpus": res.pop("CPU", 1.0)}
    if "GPU" in res:
        opts["num_gpus"] = res.pop("GPU")
    if "memory" in res:
        opts["memory"] = res.pop("memory")
    if res:
        opts["resources"] = res
    return opts


def fits(resources: dict[str, float], node_resources: dict[str, float]) -> bool:
    """Whether a node with these total resources can host one server needing ``resources``."""
    return all(float(node_resources.get(k, 0.0)) >= v for k, v in resources.items() if v > 0)


def connect(ray: ModuleType, address: str) -> bool:
    """Connect this process to Ray: an existing connection is used as it is; ``auto`` is ``ray.init()``
    (``RAY_ADDRESS``, else a local instance), anything else ``ray.init(address=...)``. Returns whether this call
    connected (so the caller disconnects).

    Raises:
        UserError: the cluster cannot be reached.
    """
    if ray.is_initialized():
        return False
    kwargs: dict[str, str | bool] = {"log_to_driver": False}
    target = os.environ.get("RAY_ADDRESS") if address == "auto" else address
    if address != "auto":
        kwargs["address"] = address
    if target and _host(target) in ("127.0.0.1", "localhost"):  # a cluster on this machine bound to loopback
        kwargs["_node_ip_address"] = "127.0.0.1"
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"cannot connect to the Ray cluster at {address}: {first} (check --ray, or RAY_ADDRESS for "
                        "auto)") from None
    return True


def _host(address: str) -> str:
    """The host of a Ray address (``ray://host:10001``, ``host:6379``)."""
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


def hosts(ray: ModuleType, resources: dict[str, float]) -> list[RayNode]:
    """The live nodes (``ray.nodes()`` entries) that can host one server needing ``resources``.

    Raises:
        UserError: none can (names ``--ray-resources`` and ``ray status``).
    """
    found = [n for n in ray.nodes() if n.get("Alive") and fits(resources, n.get("Resources") or {})]
    if not found:
        raise UserError(f"no node of the Ray cluster has the resources of one server ({resources}): set "
                        "--ray-resources to what a node offers (`ray status` lists them)")
    return found


def server_slots(nodes: Sequence[RayNode], resources: dict[str, float]) -> int:
    """How many servers needing ``resources`` the ``nodes`` (:func:`hosts`) can run side by side: per node the
    fewest times each resource fits (``{"GPU": 1}`` on an 8-GPU node: 8), summed; at least 1."""
    total = 0
    for node in nodes:
        have = node.get("Resources") or {}
        total += int(min((have.get(k, 0.0) / v for k, v in resources.items() if v > 0), default=1.0))
    return max(total, 1)


def node_identity() -> NodeIdentity:
    """Where this task runs: ``{"node_id", "ip", "hostname", "pid"}`` (the Ray node id and IP address when inside
    a Ray worker, else None)."""
    node_id = ip = None
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():  # never start Ray just to ask
        try:
            node_id = ray.get_runtime_context().get_node_id()
            ip = ray.util.get_node_ip_address()
        except Exception:  # noqa: BLE001 - not a worker of a cluster: no node id
            pass
    return {"node_id": node_id, "ip": ip, "hostname": socket.gethostname(), "pid": os.getpid()}


def node_ref(event: Event) -> NodeRef:
    """A result's ``node`` object (``{"id", "ip", "hostname"}``) from a task's ``node`` event."""
    return {"id": event.get("node_id"), "ip": event.get("ip"), "hostname": event.get("hostname")}


def where(node: Mapping[str, object] | None) -> str:
    """A node for messages: ``node 1a2b3c4d (hostname)``."""
    if not node:
        return "a node"
    ident = str(node.get("id") or "")[:8]
    host = node.get("hostname") or node.get("ip") or "?"
    return f"node {ident} ({host})" if ident else str(host)


def append_node_log(logs: Path, event: Event, node: NodeRef | None, resume_hint: Path | None = None) -> None:
    """A server's log from a task's ``log`` event (``name``, ``text``), appended to ``logs``/<name> with the node id
    before the suffix (``server-steps3@1a2b3c4d.log``): a run or block measured again on the same node adds to it.

    Raises:
        UserError: the file cannot be written (:func:`spectune.results.durable.writing`, with ``resume_hint``).
    """
    name = os.path.basename(str(event.get("name") or "server.log"))
    stem, dot, suffix = name.rpartition(".")
    ident = str((node or {}).get("id") or "node")[:8]
    path = logs / (f"{stem}@{ident}.{suffix}" if dot else f"{name}@{ident}")
    with writing(path, resume_hint):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(event.get("text") or "")


_END = object()


def task_events(measure: Callable[[Callable[[Event], None]], Awaitable[None]]) -> Iterator[Event]:
    """The body of a measuring Ray task (module docstring): ``{"kind": "node", **node_identity()}`` first, then
    every event ``measure(emit)`` emits, as it emits it (``emit`` is thread-safe).

    Raises:
        whatever ``measure`` raised (a :class:`UserError` for a configuration problem), except its cancellation.
        KeyboardInterrupt: the task was cancelled (after ``measure`` ended: its server stopped).
    """
    out: queue.Queue = queue.Queue()
    loop = asyncio.new_event_loop()
    failure: list[BaseException] = []
    main: list[asyncio.Task] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            main.append(loop.create_task(measure(out.put)))
            loop.run_until_complete(main[0])
        except BaseException as err:  # noqa: BLE001 - handed to the task's thread
            failure.append(err)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
                out.put(_END)

    thread = threading.Thread(target=run, name="spectune-task", daemon=True)
    yield {"kind": "node", **node_identity()}
    thread.start()
    try:
        while True:
            try:
                event = out.get(timeout=0.2)  # a timeout, so a cancel's KeyboardInterrupt is seen at once
            except queue.Empty:
                continue
            if event is _END:
                break
            yield event
    finally:
        if thread.is_alive():  # cancelled (KeyboardInterrupt) or the generator was closed: stop the server first
            def cancel() -> None:
                if main:
                    main[0].cancel()
            try:
                loop.call_soon_threadsafe(cancel)
            except RuntimeError:  # the loop already closed
                pass
            thread.join(STOP_GRACE_S)
    if failure and not isinstance(failure[0], asyncio.CancelledError):
        raise failure[0]


async def stream_task(ray: ModuleType, remote: TaskSubmitter, payload: object,
                      on_event: Callable[[EventT, NodeRef | None], None], label: str) -> LostTask | None:
    """Submit one task (``remote.remote(payload)``, a streaming generator of :func:`task_events`) and hand each of
    its events to ``on_event(event, node)`` (``node``: :func:`node_ref` of its ``node`` event, None before it)
    until it ends.

    Returns:
        None when it ended normally, or what was lost (``{"node", "where", "error"}``) when Ray reports a system
        failure (its node or worker died) or the task was interrupted from outside.

    Raises:
        UserError: the task raised one (``label`` and the node named). RuntimeError: the task failed with another
            error (a bug). asyncio.CancelledError: cancelled (the task is cancelled and waited for,
            :func:`cancel_task`).
    """
    from ray.exceptions import RayError, RayTaskError

    gen = remote.remote(payload)
    node: NodeRef | None = None
    try:
        async for ref in gen:
            event = await ref
            if event.get("kind") == "node":
                node = node_ref(event)
            on_event(event, node)
    except asyncio.CancelledError:
        await cancel_task(ray, gen)
        raise
    except RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, UserError) or isinstance(err, UserError):
            raise UserError(f"{label} on {where(node)}: {cause if cause is not None else err}") from None
        if isinstance(cause, (KeyboardInterrupt, asyncio.CancelledError)):
            return {"node": node, "where": where(node), "error": "the task was interrupted"}
        raise RuntimeError(f"{label} on {where(node)} failed: {err}") from None
    except RayError as err:  # the node or the worker died: a system failure
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return {"node": node, "where": where(node), "error": f"{type(err).__name__}: {first[:200]}"}
    return None


async def run_together(coros: Sequence[Awaitable[None]]) -> None:
    """Run ``coros`` (the driver's per-task streams) concurrently until all end; when one raises, or the caller is
    cancelled (Ctrl-C), cancel the others and wait for them (each stops its task and server) before raising."""
    jobs = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*jobs)
    except BaseException:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise


async def cancel_task(ray: ModuleType, gen: ObjectRefGenerator) -> None:
    """Cancel a running task (KeyboardInterrupt inside it: its measurement stops the server), wait up to
    :data:`CANCEL_WAIT_S` for it to end, then force-kill it."""
    try:
        ray.cancel(gen)
    except Exception:  # noqa: BLE001 - already finished
        return
    done = await asyncio.to_thread(lambda: ray.wait([gen.completed()], timeout=CANCEL_WAIT_S)[0])
    if not done:
        try:
            ray.cancel(gen, force=True)
        except Exception:  # noqa: BLE001 - finished meanwhile
            pass
