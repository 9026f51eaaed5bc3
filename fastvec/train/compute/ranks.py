"""Ranks: the processes of a data-parallel run, and the few numbers they agree on.

A run of N ranks (``fastvec train --nproc N``, or any launcher that sets torchrun's
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``) is one run
cut in N: ``num_envs``, ``total_steps`` and ``minibatch_size`` are the run's, and rank r
steps envs ``[r E, (r + 1) E)`` of it (``E = num_envs / N``) on an engine of its own, with
a replica of the policy. The ranks stay one run by three rules:

- every random draw is the whole run's, from one generator seeded alike on every rank
  (the sampling noise of all ``num_envs`` envs, the minibatches' permutation of the whole
  batch), and each rank takes its envs' share: the draws stay in step without a message;
- a statistic over the batch (advantages, observation and reward normalisers, the
  approximate KL, the losses) is reduced over the ranks before it is used;
- a minibatch's gradient is summed over the ranks (each rank's weighted by its share of
  the minibatch's samples) before it is clipped and applied, so the replicas stay equal.

Then N ranks of E envs compute what one rank of N E envs computes, up to float rounding
(``tests/test_train_ranks.py``). ``SOLO`` is the one-rank run: every reduction is the identity
and nothing else changes. The collectives run on gloo (CPU) or NCCL (one CUDA device per
local rank); ``t_reduce`` counts the time spent in them.
"""

from __future__ import annotations

import datetime
import os
import time

import numpy as np
import torch

__all__ = [
    "Ranks",
    "SOLO",
    "RankError",
    "OTHER_RANK_FAILED",
    "ranks_from_environment",
    "learners_spec",
    "join",
    "launched_world",
    "check_world",
    "moments",
]

# How long a collective may wait for a rank before it fails: a rank that died mid-run
# ends the others' waits far sooner (gloo sees its sockets close; the launcher kills).
_TIMEOUT_S = float(os.environ.get("FASTVEC_RANK_TIMEOUT_S", "300"))


class RankError(RuntimeError):
    """A collective failed: another rank of the run died or stopped answering."""


OTHER_RANK_FAILED = 3
"""The exit code of a rank that failed only because another one did (``fastvec train``):
a launcher names the rank that failed first."""


class Ranks:
    """This process's place in the run (``rank`` of ``world``) and its collectives.

    ``sum_`` sums a tensor over the ranks in place; ``floats`` sums a few numbers;
    ``gather`` collects a picklable object from every rank (rank order). With one rank
    each is the identity."""

    def __init__(
        self, world: int = 1, rank: int = 0, local_rank: int = 0, backend: str | None = None, local_world: int = 1
    ):
        self.world, self.rank, self.local_rank, self.backend = world, rank, local_rank, backend
        self.local_world = local_world  # the ranks on this machine (they share its cores)
        self.t_reduce = 0.0  # seconds in collectives, summed
        self.n_reduce = 0

    @property
    def solo(self) -> bool:
        return self.world == 1

    def share(self, n: int) -> slice:
        """This rank's share of ``n`` items cut in ``world`` equal parts (the envs)."""
        k = n // self.world
        return slice(self.rank * k, (self.rank + 1) * k)

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            self._collective(torch.distributed.all_reduce, t)
        return t

    def floats(self, values) -> np.ndarray:
        """``values`` (numbers) summed over the ranks, as float64."""
        v = np.asarray(values, dtype=np.float64)
        if self.world == 1:
            return v
        t = torch.from_numpy(v.copy())
        if self.backend == "nccl":
            t = t.to(f"cuda:{self.local_rank}")
        self._collective(torch.distributed.all_reduce, t)
        return t.cpu().numpy()

    def gather(self, obj) -> list:
        if self.world == 1:
            return [obj]
        out: list = [None] * self.world
        self._collective(torch.distributed.all_gather_object, out, obj)
        return out

    def _collective(self, fn, *args) -> None:
        t0 = time.perf_counter()
        try:
            fn(*args)
        except RuntimeError as exc:  # gloo / NCCL: a peer closed its sockets or timed out
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RankError(f"rank {self.rank} of {self.world}: another rank is gone ({first})") from None
        self.t_reduce += time.perf_counter() - t0
        self.n_reduce += 1

    def close(self) -> None:
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


SOLO = Ranks()


def launched_world() -> int:
    """The ``WORLD_SIZE`` a launcher set for this process (1: none)."""
    text = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"WORLD_SIZE must be an integer, got {text!r}") from None


def ranks_from_environment(device: torch.device) -> Ranks:
    """Join the run a launcher set up in this process's environment (torchrun's
    variables), or ``SOLO`` where there is none. gloo on the CPU; NCCL where this process
    learns on CUDA (``device``), with device ``LOCAL_RANK`` made its own."""
    world = launched_world()
    if world <= 1:
        return SOLO
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    spec = {
        "world": world,
        "rank": rank,
        "local_rank": local,
        "local_world": int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "address": os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "port": int(os.environ["MASTER_PORT"]),
    }
    return join(spec)


def learners_spec(ranks: Ranks, device: torch.device) -> dict | None:
    """How this rank's async learner process, learning on ``device``, joins the group of
    the ranks' learners (a group of its own, on ``FASTVEC_LEARNER_PORT``, default the
    port after ``MASTER_PORT``); None with one rank."""
    if ranks.solo:
        return None
    port = os.environ.get("FASTVEC_LEARNER_PORT") or int(os.environ["MASTER_PORT"]) + 1
    return {
        "world": ranks.world,
        "rank": ranks.rank,
        "local_rank": ranks.local_rank,
        "local_world": ranks.local_world,
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "address": os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "port": int(port),
    }


def join(spec: dict | None) -> Ranks:
    """Join the group ``spec`` describes (``ranks_from_environment``'s, ``learners_spec``'s)."""
    if spec is None:
        return SOLO
    if spec["backend"] == "nccl":
        local = spec["local_rank"]
        if local >= torch.cuda.device_count():
            raise ValueError(
                f"rank {spec['rank']}: LOCAL_RANK {local} has no CUDA device ({torch.cuda.device_count()} here)"
            )
        torch.cuda.set_device(local)
    torch.distributed.init_process_group(
        spec["backend"],
        init_method=f"tcp://{spec['address']}:{spec['port']}",
        rank=spec["rank"],
        world_size=spec["world"],
        timeout=datetime.timedelta(seconds=_TIMEOUT_S),
    )
    return Ranks(spec["world"], spec["rank"], spec["local_rank"], spec["backend"], spec["local_world"])


def moments(x: torch.Tensor, ranks: Ranks) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-column mean and (population) variance of ``x`` ``[n, d]`` (float64) over the
    rows of every rank, and the rows' count: the normalisers' batch statistics."""
    if ranks.world == 1:
        return x.mean(0), x.var(0, unbiased=False), x.shape[0]
    n_and_sum = torch.cat([x.new_tensor([x.shape[0]]), x.sum(0)])
    ranks.sum_(n_and_sum)
    n = int(n_and_sum[0].item())
    mean = n_and_sum[1:] / n
    sq = ranks.sum_((x - mean).square().sum(0))
    return mean, sq / n, n


def check_world(cfg, world: int, *, venv=None, backend: str = "engine", mix=None, resume=None) -> None:
    """ValueError (before any process starts) where a run of ``world`` data-parallel
    ranks (``fastvec.train.compute.ranks``) cannot serve ``cfg``: each rank steps its share of
    ``num_envs`` on fastvec's engine, in lock-step, and a resumed run keeps its ranks."""
    if world < 1:
        raise ValueError(f"the number of ranks must be at least 1, got {world}")
    was = None if resume is None else int(resume["train_state"].get("ranks", {}).get("world", 1))
    if was is not None and was != world:
        raise ValueError(f"the checkpoint is of a run on {was} rank(s); resume it with --nproc {was}, not {world}")
    if world == 1:
        return
    if cfg.num_envs % world:
        raise ValueError(f"num_envs={cfg.num_envs} must split evenly over {world} ranks")
    if venv is not None or backend != "engine":
        where = f"a vector env of your own ({type(venv).__name__})" if venv is not None else f"backend={backend!r}"
        raise ValueError(f"{world} ranks each start fastvec's engine on their share of the envs, not {where}")
    if mix is not None:
        raise ValueError(f"a mix of envs runs on one rank, not {world}")
    if cfg.policy_core != "none":
        raise ValueError(f"policy_core={cfg.policy_core} trains on one rank, not {world} (not built yet)")


def rank_figures(ranks: Ranks, local_steps: int, wall: float, restarts: int) -> dict:
    """Every rank's env steps/s, share of the wall time in collectives and worker
    restarts (a collective)."""
    wall = max(wall, 1e-9)
    each = ranks.gather((local_steps / wall, ranks.t_reduce / wall, restarts))
    return {
        "world": ranks.world,
        "backend": ranks.backend,
        "rank_sps": [round(sps, 1) for sps, _, _ in each],
        "reduce_share": [round(share, 4) for _, share, _ in each],
        "restarts": [n for _, _, n in each],
    }
