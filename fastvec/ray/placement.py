"""Where the actors go and which envs each runs: ``RayPlacement`` and ``plan``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import WorkerError
from ..options import check_positive_int

__all__ = ["RayPlacement", "plan", "split_weighted"]


@dataclass
class RayPlacement:
    """How a ``RayEngine`` spreads its envs over a Ray cluster.

    ray_address : str, optional
        Address of a running cluster (``"auto"``, ``"host:port"``, ``"ray://..."``).
        None: use this process's Ray connection if there is one, else start a local
        instance listening on 127.0.0.1 only (stopped when the last user closes).
    num_actors : int, optional
        Actors to start. Default: ``actors_per_node`` on every node with CPUs (at most
        one per env).
    actors_per_node : int, optional
        Actors per node (default 1); nodes are filled in order, the driver's first.
    envs_per_actor : int, optional
        Envs per actor (the last actor may get fewer); sets ``num_actors``. Default:
        envs in proportion to the actors' CPUs.
    workers_per_actor : int, optional
        Worker processes of each actor's engine. Default: the actor's CPUs (at most one
        per env).
    num_cpus_per_actor : float, optional
        CPUs each actor reserves in Ray. Default: the node's CPUs shared among its
        actors, so the defaults fill the CPUs Ray reports.
    local_fast_path : bool, default True
        Actors on the driver's node exchange steps through the driver's shared memory
        and a Unix-socket doorbell instead of Ray tasks.
    ray_init_kwargs : dict, optional
        Extra keyword arguments for ``ray.init`` when fastvec connects or starts Ray.
    """

    ray_address: str | None = None
    num_actors: int | None = None
    actors_per_node: int | None = None
    envs_per_actor: int | None = None
    workers_per_actor: int | None = None
    num_cpus_per_actor: float | None = None
    local_fast_path: bool = True
    ray_init_kwargs: dict | None = None

    def __post_init__(self) -> None:
        for name in ("num_actors", "actors_per_node", "envs_per_actor", "workers_per_actor"):
            setattr(self, name, check_positive_int(getattr(self, name), name, allow_none=True))
        c = self.num_cpus_per_actor
        if c is not None:
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < float("inf"):
                raise ValueError(f"num_cpus_per_actor must be a number >= 0 or None, got {c!r}")
            if c > 1 and float(c) != int(c):
                raise ValueError(f"num_cpus_per_actor above 1 must be a whole number (Ray's rule), got {c!r}")
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address):
            raise ValueError(f"ray_address must be a non-empty string or None, got {self.ray_address!r}")
        if self.ray_init_kwargs is not None and not isinstance(self.ray_init_kwargs, dict):
            raise ValueError(f"ray_init_kwargs must be a dict or None, got {type(self.ray_init_kwargs).__name__}")
        self.local_fast_path = bool(self.local_fast_path)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def check_envs(self, num_envs: int) -> int | None:
        """The number of actors asked for, checked against ``num_envs`` (None: the default)."""
        num_actors = self.num_actors
        if num_actors is not None and num_actors > num_envs:
            raise ValueError(f"num_actors={num_actors} exceeds num_envs={num_envs}")
        if self.envs_per_actor is not None:
            needed = -(-num_envs // self.envs_per_actor)
            if num_actors is not None and num_actors != needed:
                raise ValueError(
                    f"num_actors={num_actors} does not match envs_per_actor={self.envs_per_actor} "
                    f"for {num_envs} envs (that needs {needed} actors)"
                )
            num_actors = needed
        return num_actors


def split_weighted(total: int, weights: Sequence[float]) -> list[tuple[int, int]]:
    """Contiguous [start, stop) groups of ``total`` items, sizes in proportion to
    ``weights`` (largest remainder), each at least 1."""
    n = len(weights)
    if total < n:
        raise ValueError(f"cannot split {total} envs over {n} actors")
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum() if w.sum() > 0 else np.full(n, 1.0 / n)
    raw = w * total
    sizes = np.maximum(np.floor(raw).astype(int), 1)
    while sizes.sum() < total:  # the largest remainders get one more
        sizes[int(np.argmax(raw - sizes))] += 1
    while sizes.sum() > total:  # the minimum of 1 overshot: take from the most over their share
        over = np.where(sizes > 1, sizes - raw, -np.inf)
        sizes[int(np.argmax(over))] -= 1
    groups, start = [], 0
    for size in sizes.tolist():
        groups.append((start, start + size))
        start += size
    return groups


def plan(p: RayPlacement, num_envs: int, nodes: list, driver_node: str) -> tuple[list, list]:
    """``(groups, placement)``: each actor's ``[start, stop)`` of envs, and per actor a
    dict (node id, envs, CPUs to reserve, worker processes) for ``nodes``, Ray's
    ``ray.nodes()``, filled in order with the driver's node first."""
    nodes = [(n["NodeID"], float(n.get("Resources", {}).get("CPU", 0.0))) for n in nodes if n.get("Alive")]
    nodes = [n for n in nodes if n[1] > 0] or nodes
    if not nodes:
        raise WorkerError("the Ray cluster has no live node")
    nodes.sort(key=lambda n: (n[0] != driver_node, n[0]))
    num_actors = p.check_envs(num_envs)
    per_node = p.actors_per_node or 1
    if num_actors is None:
        num_actors = min(num_envs, per_node * len(nodes))
    if p.actors_per_node is not None:
        if num_actors > p.actors_per_node * len(nodes):
            raise ValueError(
                f"{num_actors} actors at actors_per_node={p.actors_per_node} need "
                f"{-(-num_actors // p.actors_per_node)} nodes; the cluster has {len(nodes)}"
            )
        counts = [min(p.actors_per_node, max(0, num_actors - i * p.actors_per_node)) for i in range(len(nodes))]
    else:
        base, extra = divmod(num_actors, len(nodes))
        counts = [base + (1 if i < extra else 0) for i in range(len(nodes))]
    node_of, cpus = [], []
    for (node_id, node_cpus), count in zip(nodes, counts):
        if count == 0:
            continue
        if p.num_cpus_per_actor is not None:
            share = float(p.num_cpus_per_actor)
            if share * count > node_cpus + 1e-9:
                raise ValueError(
                    f"{count} actors of {share:g} CPUs do not fit on node {node_id[:8]}, which has {node_cpus:g} CPUs"
                )
        else:
            share = node_cpus / count
            share = float(math.floor(share)) if share >= 1 else math.floor(share * 1e4) / 1e4
        node_of += [node_id] * count
        cpus += [share] * count
    if p.envs_per_actor is not None:
        groups = [(a, min(a + p.envs_per_actor, num_envs)) for a in range(0, num_envs, p.envs_per_actor)]
    else:
        groups = split_weighted(num_envs, [max(c, 1e-3) for c in cpus])
    placement = []
    for k, ((a, b), node_id, c) in enumerate(zip(groups, node_of, cpus)):
        workers = p.workers_per_actor if p.workers_per_actor is not None else max(1, int(c))
        placement.append(
            {
                "actor": k,
                "node_id": node_id,
                "envs": (a, b),
                "num_cpus": c,
                "num_workers": min(workers, b - a),
                "pid": None,
                "fast_path": False,
            }
        )
    return groups, placement
