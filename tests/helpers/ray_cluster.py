"""A real multi-node Ray cluster on this machine for the ``--ray`` tests (and how they compare two folders' choices) (Ray's own ``ray.cluster_utils.Cluster``): a
head without resources for servers and worker nodes with one ``CPU`` and custom resources each, all bound to
127.0.0.1, no dashboard, small object stores.

Import this module only where Ray is installed (``pytest.importorskip("ray")`` first). Ray maps 127.0.0.1 to the
machine's "remotely reachable" address unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is ``0``
(ray._private.services get_node_ip_address / resolve_ip_for_localhost): set here before Ray is imported, so the
nodes, the driver and a CLI driver started as a child process (it inherits the variable) stay on loopback.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

STORE = 80 * 1024 * 1024  # bytes: Ray's smallest object store is 75 MiB
LOOPBACK = {"node_ip_address": "127.0.0.1", "object_store_memory": STORE}
SERVER = {"emulated_server": 1, "fast": 1}  # what a worker node offers; "fast": not slowed down
RESOURCES = {"CPU": 1.0, "fast": 1.0}  # what one task asks for


def add_worker(cluster, resources: dict | None = None, env: dict | None = None):
    """One worker node with a CPU and ``resources`` (default :data:`SERVER`); ``env``: variables its processes
    (raylet, workers, the servers they launch) inherit."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        return cluster.add_node(num_cpus=1, resources=resources or SERVER, **LOOPBACK)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class NodeKiller:
    """Removes one worker node of ``cluster`` mid-run, from a thread (the driver's loop goes on), and puts a worker
    back afterwards (:meth:`restore`), so a module's cluster keeps its size."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.thread = None

    def kill(self, node_id: str) -> None:
        """Start removing the worker node ``node_id``."""
        import threading

        victim = next(n for n in self.cluster.worker_nodes if n.node_id == node_id)
        self.thread = threading.Thread(target=self.cluster.remove_node, args=(victim, False))
        self.thread.start()

    def restore(self) -> None:
        """Wait for the removal (if one was started) and add a worker node in its place."""
        if self.thread is not None:
            self.thread.join()
        add_worker(self.cluster)


def start_cluster(workers: int = 2):
    """A started ``Cluster`` with ``workers`` worker nodes (:func:`add_worker`), its address on loopback."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **LOOPBACK})
    for _ in range(workers):
        add_worker(c)
    c.wait_for_nodes()
    assert c.address.startswith("127.0.0.1:"), c.address  # loopback only
    return c


def stop_cluster(cluster) -> None:
    """Disconnect this process (when connected) and shut the cluster down."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


def worker_ids(cluster) -> set[str]:
    """The node ids of the cluster's worker nodes."""
    return {n.node_id for n in cluster.worker_nodes}


def recommended(folder) -> dict:
    """concurrency -> ``spectune recommend``'s choice for a sweep folder (its ``steps`` and the best measured
    ``best_steps``)."""
    from spectune.results.reader import load_results
    from spectune.tune.recommend import RecommendOptions, recommend

    return {ch.concurrency: ch for ch in recommend(load_results(folder), RecommendOptions()).choices}


def agree(a, b) -> bool:
    """Two folders' choices at one concurrency agree: the same num_steps, or the same best measured num_steps where
    one of them chose a smaller one because the best was within its noise (recommend's tie rule)."""
    return a.steps == b.steps or (a.best_steps == b.best_steps and (a.steps != a.best_steps
                                                                    or b.steps != b.best_steps))
