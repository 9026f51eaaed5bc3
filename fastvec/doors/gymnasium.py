"""The gymnasium door: ``fastvec.AsyncVectorEnv``, a ``gymnasium.vector.VectorEnv``.

Same results as ``gymnasium.vector.SyncVectorEnv`` (5-tuple steps, NEXT_STEP, SAME_STEP
and DISABLED autoreset, infos merged with ``_key`` masks), with the envs stepping in
worker processes over shared memory. The class is put together here from its rooms:
``gymnasium_arguments`` (the arguments, checked before any process starts),
``gymnasium_steps`` (``reset`` and ``step``, gymnasium's infos), ``gymnasium_calls``
(calls in flight, calls to the envs) and ``batches`` (EnvPool's ``send``/``recv``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from ..options import EngineOptions
from .batches import Batches
from .gymnasium_arguments import (
    ENGINE_AUTORESET,
    ProcessPlan,
    autoreset_mode_of,
    check_gymnasium_keywords,
    observation_spaces,
    plan_processes,
)
from .gymnasium_calls import EnvCalls
from .gymnasium_steps import StepsAndResets
from .threads import TorchThreads
from .vector_infos import VectorInfos


class AsyncVectorEnv(StepsAndResets, EnvCalls, VectorEnv):
    """Shared-memory multiprocess ``gymnasium.vector.VectorEnv``.

    Parameters
    ----------
    env_fns : sequence of callables
        Functions returning gymnasium envs (cloudpickled: lambdas and closures work).
    num_workers : int, "auto" or None
        Worker processes (default ``min(num_envs, cores)``); which envs each runs is
        ``placement``'s choice. "auto": time the candidate layouts on these envs at
        start-up (a few seconds; ``fastvec.worker_layouts``) and take the fastest for stepping back
        to back: the worker count and the placement (with ``batch_size``, the worker
        count for those batches). For a loop with a policy between steps,
        ``fastvec tune ENV --policy-us X`` times that loop.
    placement : "contiguous" (default), "balanced" or a list of env index lists
        Which envs each worker runs; env ``i``'s results stay at index ``i`` either way.
        "contiguous": runs of envs of equal size. "balanced": placed by cost so that
        each worker's share of a step costs about the same (envs that differ in cost:
        mixed tasks, settings, levels), the costs from ``env_costs`` or timed on
        throwaway instances at start-up (~0.2 s). A list: one list of env indices per
        worker. ``envs.placement`` reports the placement and the measured costs.
    env_costs : sequence of float, optional
        One relative cost per env for ``placement="balanced"`` (no probe).
    copy : bool, default True
        ``True`` returns observations as fresh arrays, like gymnasium. ``False`` returns
        views into shared memory (zero-copy), writable as gymnasium's are: a view stays
        valid until ``num_slots - 1`` further ``step``/``reset`` calls have returned,
        i.e. through the next step with the default ``num_slots=2``. Writing into one
        changes that slot's observation only (no worker reads it; a masked ``reset``
        carries the envs it leaves alone over from it, as gymnasium's buffer would).
        Rewards, terminated and truncated are always fresh arrays.
    autoreset_mode : AutoresetMode or str, default NEXT_STEP
        gymnasium's autoreset semantics; NEXT_STEP, SAME_STEP and DISABLED are supported.
    step_timeout : float, optional
        Seconds before a silent worker raises ``fastvec.WorkerError`` (None: wait, but a
        dead worker is still reported at once).
    context : str, optional
        Start method: "fork", "forkserver" or "spawn".
    num_slots : int, default 2
        Depth of the ring of result slots.
    restart_on_error : bool, default False
        Replace a worker that died, hung or whose env raised in ``step``; its envs are
        reset and report ``truncated`` with ``info["fastvec_restarted"] = True`` (a
        ``RuntimeWarning`` says which), so a long job survives a flaky env.
    spin_us, main_spin_us : float, optional
        None (default): waits that learn the loop; a number: a fixed spin in
        microseconds before sleeping (see ``fastvec.options.EngineOptions``).
    torch_threads : "auto", int or None, default "auto"
        If torch is loaded in this process, give it the cores the workers leave:
        ``"auto"`` lowers its intra-op threads to ``max(1, cores - num_workers)`` unless
        ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` is set; an int sets that many; None
        leaves torch alone. ``close()`` restores the count (``fastvec.doors.threads``).
    action_check : "dtype" (default) or "bounds"
        What a batch of actions must pass before it is sent. "dtype", gymnasium's
        behaviour: the right number of envs and shapes, and values the space's dtype
        holds exactly; out-of-range values reach the envs, which decide (a float for a
        Discrete space must be a whole number; floats round to a float Box's dtype).
        "bounds", fastvec's stricter rule: values of the space's kind within its bounds,
        else ``ValueError`` with nothing sent. Either way a batch that is not a batch
        (a scalar) raises ``fastvec.errors.ActionTypeError``, a ValueError and, as
        gymnasium's, a TypeError.

    batch_size : int, optional
        EnvPool's asynchronous API (``async_reset``, ``send``, ``recv``): ``recv``
        returns the results of ``batch_size`` envs while the others step
        (``fastvec.doors.batches``). Default: every env. ``step`` and ``reset`` stay
        lock-step over every env.
    batch_mode : "groups" (default) or "ready"
        "groups": ``num_envs / batch_size`` fixed groups of contiguous envs, each on
        workers of its own (``num_workers`` a multiple of the number of groups),
        returned in turn, zero-copy with ``copy=False``. "ready": EnvPool's first envs
        to finish, at the grain of a worker (``num_workers`` divides ``num_envs`` into
        workers whose share divides ``batch_size``); its batches are always copies.
    shared_memory : bool, default True
        Observations always travel through shared memory here; False is accepted and
        takes the same path (there is no faster one to fall back to).
    daemon : bool, default True
        As gymnasium's: False for envs that start processes of their own. Workers exit
        with this process either way.
    worker : None
        A custom worker function cannot run fastvec's shared-memory protocol: anything
        but None raises ``ValueError``.
    observation_mode : "same", "different" or (batched space, single space)
        As gymnasium's. "same": every env has env 0's observation space; "different":
        the spaces may differ in their bounds (leaves, shapes and dtypes must agree: the
        shared memory is laid out once), batched with ``batch_differing_spaces``; a
        tuple: the spaces given (their layout must match the envs'). Spaces that do not
        agree raise ``fastvec.errors.SpaceMismatchError`` (a ValueError and, as
        gymnasium's, a RuntimeError).
    max_concurrency : int or None
        gymnasium 1.4's limit on how many envs it steps at once. Here the number of
        processes is ``num_workers``; an int caps it (``num_workers`` defaults to
        ``min(num_envs, cores, max_concurrency)``).

    Notes
    -----
    gymnasium's own keywords (``shared_memory``, ``daemon``, ``worker``,
    ``observation_mode``, ``max_concurrency``) are accepted too, so
    ``gymnasium.vector.AsyncVectorEnv(env_fns, shared_memory=True, ...)`` works with this
    class swapped in.

    Spaces without a fixed size (Graph, Sequence, Text, OneOf, custom ``Space``
    subclasses, also inside Dict and Tuple) are carried pickled, per leaf, beside the
    shared arrays of the others; their batched value is a tuple of per-env values (as
    ``batch_space`` makes it), and so is a batch of such actions.
    """

    _writable_views = True

    def __init__(
        self,
        env_fns: Sequence[Callable],
        shared_memory: bool = True,
        copy: bool = True,
        context: str | None = None,
        daemon: bool = True,
        worker: Callable | None = None,
        observation_mode: str | tuple = "same",
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        max_concurrency: int | None = None,
        *,
        num_workers: int | str | None = None,
        step_timeout: float | None = None,
        num_slots: int = 2,
        restart_on_error: bool = False,
        spin_us: float | None = None,
        main_spin_us: float | None = None,
        torch_threads: int | str | None = "auto",
        action_check: str = "dtype",
        batch_size: int | None = None,
        batch_mode: str = "groups",
        placement: str | Sequence[Sequence[int]] = "contiguous",
        env_costs: Sequence[float] | None = None,
    ):
        self.closed = True
        obs_spaces = check_gymnasium_keywords(shared_memory, worker, observation_mode)
        plan = plan_processes(
            AsyncVectorEnv,
            env_fns,
            num_workers=num_workers,
            max_concurrency=max_concurrency,
            batch_size=batch_size,
            batch_mode=batch_mode,
            placement=placement,
            env_costs=env_costs,
            context=context,
            observation_mode=observation_mode,
        )
        self.shared_memory, self.daemon, self.observation_mode = shared_memory, daemon, observation_mode
        torch = TorchThreads(torch_threads)
        self.autoreset_mode = autoreset_mode_of(autoreset_mode)
        options = EngineOptions(
            num_slots=num_slots,
            autoreset_mode=ENGINE_AUTORESET[self.autoreset_mode],
            context=context,
            step_timeout=step_timeout,
            restart_on_error=restart_on_error,
            spin_us=spin_us,
            main_spin_us=main_spin_us,
            daemon=daemon,
            space_check="equal" if observation_mode == "same" else "layout",
            action_check=action_check,
            pickled_leaves=True,
        )
        self._open_envs(plan, options, copy, torch, obs_spaces)

    def _open_envs(
        self, plan: ProcessPlan, options: EngineOptions, copy: bool, torch: TorchThreads, obs_spaces
    ) -> None:
        """Start the engine, then take gymnasium's attributes from its envs (spaces,
        metadata) and set up the batches; a failure there closes the engine again."""
        eng = self._make_engine(plan.env_fns, options, plan.num_workers, plan.placement, plan.env_costs)
        self._open_door(eng, copy, torch)
        self._vector_infos = VectorInfos(eng, eng.num_envs)
        self.env_fns = plan.env_fns
        self.num_envs = eng.num_envs
        self.metadata = dict(eng.env_metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = eng.render_mode
        self.spec = None
        self.single_action_space = eng.single_action_space
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        try:
            self.observation_space, self.single_observation_space = observation_spaces(
                self.observation_mode, obs_spaces, eng
            )
            self._batches = Batches(self, eng.num_envs if plan.batch is None else plan.batch, plan.batch_mode)
            self.batch_size, self.batch_mode = self._batches.size, plan.batch_mode
        except BaseException:
            self._close_door()
            raise
        self.closed = False

    # -------------------------------------------------------------- properties
    # Per env, as gymnasium's AsyncVectorEnv has them (VectorEnv declares one seed and one
    # generator, settable): a deliberate deviation the checker is told about.
    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        return self.get_attr("np_random")

    # -------------------------------------------------------------- batches (EnvPool's API)
    def async_reset(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        """Reset every env and start batch mode: each ``recv`` returns ``batch_size``
        envs' results (first their reset observations; groups: the next group in turn,
        ready: the first done), each ``send`` starts those envs' next step
        (``fastvec.doors.batches``)."""
        self._batches.async_reset(seed, options)

    def send(self, actions, env_ids=None) -> None:
        """Start the next step of a batch ``recv`` returned (``env_ids``: its
        ``infos["env_id"]``, or in ready mode any ``batch_size`` envs of whole workers
        returned and not sent; None: the last batch); returns at once."""
        self._batches.send(actions, env_ids)

    def recv(self, timeout: float | None = None):
        """``(obs, rewards, terminated, truncated, infos)`` of the next batch (groups: in
        turn; ready: the first envs done); ``infos["env_id"]`` names its envs. With ``timeout`` (seconds):
        ``multiprocessing.TimeoutError`` if it is not done by then, the step still in flight."""
        return self._batches.recv(timeout)

    # -------------------------------------------------------------- closing
    def close_extras(self, **kwargs: Any) -> None:
        pending = self._pending[0] if self._pending is not None else ("step" if self.waiting else None)
        if pending is None and getattr(self, "_batches", None) is not None and self._batches.in_flight():
            pending = "send"
        if pending is not None:  # as gymnasium; the engine lets it finish, then closes
            warnings.warn(
                f"Calling `close` while waiting for a pending call to `{pending}` to complete.",
                UserWarning,
                stacklevel=3,
            )
        self._pending = None
        self._close_door()

    def __del__(self):
        # VectorEnv.__del__ would call close(); the engine has its own finalizer.
        pass
