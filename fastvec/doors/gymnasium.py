"""The gymnasium door: ``fastvec.AsyncVectorEnv``, a ``gymnasium.vector.VectorEnv``.

Same results as ``gymnasium.vector.SyncVectorEnv`` (5-tuple steps, NEXT_STEP, SAME_STEP
and DISABLED autoreset, infos merged with ``_key`` masks), with the envs stepping in
worker processes over shared memory. This module turns the engine's ``StepResult``
into gymnasium's infos: from the shared info table in one compiled pass
(``_gym_infos``) on the common step, from columns or records otherwise.
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Callable, Sequence
from types import EllipsisType
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from .._core.infos import StepResult, with_quiet_ends
from ..errors import NoPendingCallError, PendingCallError
from ..options import EngineOptions
from . import _gym_infos
from .base import EngineDoor
from .batches import Batches, check_batch_size
from .threads import TorchThreads
from .vector_infos import VectorInfos, columns_to_vector_infos

_MODES = {
    AutoresetMode.NEXT_STEP: "next_step",
    AutoresetMode.SAME_STEP: "same_step",
    AutoresetMode.DISABLED: "disabled",
}


def _check_seed(seed, where: str):
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{where} must be a non-negative int or None, got {seed!r}")
    return int(seed)


def _check_observation_mode(mode):
    """gymnasium's ``observation_mode``: "same", "different" or (batched, single) spaces."""
    from gymnasium.spaces import Space

    if isinstance(mode, tuple):
        if len(mode) != 2 or not all(isinstance(s, Space) for s in mode):
            raise ValueError(
                "observation_mode as a tuple must be (batched observation space, single "
                f"observation space), got {mode!r}"
            )
        return mode
    if mode not in ("same", "different"):
        raise ValueError(
            "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and "
            f"batch observation space, actual got {mode}"
        )
    return None


def _observation_spaces(mode, given, eng):
    """(batched, single) observation spaces for ``observation_mode``."""
    from .._core.segment import layout_of

    if given is not None:
        batched, single = given
        env0 = eng.single_observation_space
        if layout_of(single) is None or layout_of(single) != layout_of(env0):
            raise ValueError(
                f"observation_mode's single space {single} does not have the layout of the "
                f"envs' observation space {env0} (leaves, shapes, dtypes)"
            )
        return batched, single
    single = eng.single_observation_space
    if mode == "different":
        from gymnasium.vector.utils import batch_differing_spaces

        per_env = getattr(eng, "env_observation_spaces", None)
        if per_env is None:
            raise ValueError(
                f"observation_mode='different' is not available on {type(eng).__name__}; pass the spaces as a tuple"
            )
        return batch_differing_spaces(per_env), single
    return batch_space(single, eng.num_envs), single


class AsyncVectorEnv(EngineDoor, VectorEnv):
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
        # gymnasium's keywords, checked before any process starts
        if not isinstance(shared_memory, bool):
            raise ValueError(f"shared_memory must be True or False, got {shared_memory!r}")
        if worker is not None:
            raise ValueError(
                "fastvec.AsyncVectorEnv cannot run a custom `worker` function: its workers speak "
                "fastvec's shared-memory protocol; pass worker=None (wrap the env instead)"
            )
        obs_spaces = _check_observation_mode(observation_mode)
        auto = isinstance(num_workers, str)
        if auto and num_workers != "auto":
            raise ValueError(f"num_workers must be a positive int, None or 'auto', got {num_workers!r}")
        if auto and max_concurrency is not None:
            raise ValueError("num_workers='auto' and max_concurrency both set the process count: give one")
        workers = None if isinstance(num_workers, str) else num_workers  # "auto": resolved below
        if max_concurrency is not None:
            if (
                isinstance(max_concurrency, bool)
                or not isinstance(max_concurrency, (int, np.integer))
                or max_concurrency < 1
            ):
                raise ValueError(f"max_concurrency must be a positive int or None, got {max_concurrency!r}")
            if workers is None:
                from ..options import available_cores

                workers = max(1, min(len(env_fns), available_cores(), int(max_concurrency)))
            elif workers > max_concurrency:
                raise ValueError(f"num_workers={workers} exceeds max_concurrency={max_concurrency}")
        batch = None
        if batch_size is not None or batch_mode != "groups":
            from ..engine import batch_workers
            from ..options import available_cores, check_env_fns

            env_fns = check_env_fns(env_fns)
            batch = check_batch_size(len(env_fns) if batch_size is None else batch_size, len(env_fns), batch_mode)
        if auto:  # time the candidate layouts on these envs (fastvec.tune)
            from ..worker_layouts import resolve_auto

            layout = resolve_auto(
                AsyncVectorEnv,
                env_fns,
                placement,
                env_costs,
                batch,
                batch_mode,
                context=context,
                observation_mode=observation_mode,
            )
            workers, placement = layout.num_workers, layout.placement
        if batch is not None:
            workers = batch_workers(workers, len(env_fns), batch, available_cores(), batch_mode)
        self.shared_memory = shared_memory
        self.daemon = daemon
        self.observation_mode = observation_mode
        torch = TorchThreads(torch_threads)
        try:
            mode = autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        except ValueError:
            raise ValueError(
                f"autoreset_mode must be one of {[m.value for m in AutoresetMode]}, got {autoreset_mode!r}"
            ) from None
        self.autoreset_mode = mode
        options = EngineOptions(
            num_slots=num_slots,
            autoreset_mode=_MODES[mode],
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
        engine = self._make_engine(env_fns, options, workers, placement, env_costs)
        self._open_door(engine, copy, torch)
        self._vector_infos = VectorInfos(engine, engine.num_envs)
        eng = engine
        self.env_fns = env_fns
        self.num_envs = eng.num_envs
        self.metadata = dict(eng.env_metadata)
        self.metadata["autoreset_mode"] = mode
        self.render_mode = eng.render_mode
        self.spec = None
        self.single_action_space = eng.single_action_space
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        try:
            self.observation_space, self.single_observation_space = _observation_spaces(
                observation_mode, obs_spaces, eng
            )
            self._batches = Batches(self, eng.num_envs if batch is None else batch, batch_mode)
            self.batch_size, self.batch_mode = self._batches.size, batch_mode
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

    # -------------------------------------------------------------- reset / step
    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

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

    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        """Send the resets (arguments as ``reset``); ``reset_wait`` returns their results."""
        self._idle("reset_async")
        n = self.num_envs
        if seed is None:
            seeds = [None] * n
        elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            first = _check_seed(seed, "seed")
            seeds = [first + i for i in range(n)]
        elif isinstance(seed, (list, tuple)):
            if len(seed) != n:
                raise ValueError(
                    f"If seeds are passed as a list the length must match num_envs={n} but got length={len(seed)}."
                )
            seeds = [_check_seed(s, f"seed[{i}]") for i, s in enumerate(seed)]
        else:
            raise ValueError(f"seed must be None, an int or a list of {n} ints, got {seed!r}")
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"options must be a dict or None, got {type(options).__name__}")

        mask = None
        if options is not None and "reset_mask" in options:
            options = dict(options)  # unlike gymnasium, leave the caller's dict intact
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray):
                raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
            if mask.shape != (n,):
                raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
            if mask.dtype != np.bool_:
                raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
            if not mask.any():
                raise ValueError(
                    f"`options['reset_mask']` must contain a boolean array with at least one True value, got reset_mask={mask}"
                )
        targets = range(n) if mask is None else np.flatnonzero(mask).tolist()
        slot = self._free_slot()
        if mask is not None and self._batches.active:
            raise ValueError(
                "a masked reset needs lock-step observations: after async_reset, reset() every env "
                "(no reset_mask) first"
            )
        if mask is not None and slot != self._slot:
            # Envs left alone keep their current observation in the new slot.
            keep = ~mask
            for buf in self._engine.obs_bufs:
                buf[slot, keep] = buf[self._slot, keep]
        self._engine.reset_async(slot, {i: {"seed": seeds[i], "options": options} for i in targets})
        self._pending = ("reset", slot, targets)

    def reset_wait(self, timeout: float | None = None):
        """The observations and infos of the resets ``reset_async`` sent. With
        ``timeout`` (seconds): ``multiprocessing.TimeoutError`` if they are not all done
        by then; the resets stay in flight (call ``reset_wait`` again)."""
        _, slot, targets = self._take("reset", timeout)
        env_infos = self._engine.reset_wait()
        self._slot = slot
        self._batches.active = False  # back to lock-step
        infos: dict[str, Any] = {}
        for i in targets:
            infos = self._vector_infos.add(infos, env_infos[i], i)
        return self._observation(slot), infos

    def step_async(self, actions) -> None:
        self._no_pending("step_async")
        self._lockstep("step_async")
        self._send_step(actions)

    def step_wait(self, timeout: float | None | EllipsisType = ...):
        """The results of the step ``step_async`` sent. With ``timeout`` (seconds, as
        gymnasium's): ``multiprocessing.TimeoutError`` if it is not done by then; the
        step stays in flight (call ``step_wait`` again)."""
        if timeout is not ... and timeout is not None and self.waiting:
            self._check_open()
            self._poll_or_raise("step_wait", timeout)
            timeout = ...
        elif timeout is None:
            timeout = ...  # gymnasium's None: no timeout of its own (step_timeout still applies)
        return self._step_result(self._receive_step(timeout))

    def step(self, actions):
        self._no_pending("step")
        self._lockstep("step")
        return self._step_result(self._step(actions))

    def _lockstep(self, what: str) -> None:
        if self._batches.active:
            self._batches.check_lockstep(what)
            raise RuntimeError(
                f"Calling `{what}` in batch mode (since `async_reset`): the envs' observations "
                "are a batch's each; call `reset()` to step every env in lock-step again"
            )

    # -------------------------------------------------------------- calls in flight
    _pending: tuple | None = None  # ("reset", slot, targets) or ("call",) sent, not waited for

    def _no_pending(self, what: str) -> None:
        if self._pending is not None:
            raise PendingCallError(
                f"Calling `{what}` while waiting for a pending call to `{self._pending[0]}` to complete.",
                self._pending[0],
            )

    def _idle(self, what: str = "this") -> None:
        """Before a command: open, and (as gymnasium) no call in flight."""
        self._check_open()
        self._no_pending(what)
        if self.waiting:
            raise PendingCallError(f"Calling `{what}` while waiting for a pending call to `step` to complete.", "step")
        self._batches.check_lockstep(what)
        self._torch.apply()  # torch may have been imported since the door opened

    def _take(self, what: str, timeout) -> tuple:
        self._check_open()
        if self._pending is None or self._pending[0] != what:
            raise NoPendingCallError(f"Calling `{what}_wait` without any prior call to `{what}_async`.", what)
        if timeout is not None:
            self._poll_or_raise(f"{what}_wait", timeout)
        pending, self._pending = self._pending, None
        return pending

    def _poll_or_raise(self, what: str, timeout) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise ValueError(f"timeout must be a non-negative number of seconds or None, got {timeout!r}")
        if not self._engine.poll(float(timeout)):
            raise multiprocessing.TimeoutError(
                f"The call to `{what}` has timed out after {timeout} second(s) (still in flight: "
                f"call `{what}` again to get its results)."
            )

    def _step_result(self, result: StepResult):
        eng = self._engine
        slot = result.slot
        same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        if same_step and (ended := eng.terminated[slot] | eng.truncated[slot]).any():
            # Envs that ended with empty infos sent no record: their final_obs and
            # (empty) final_info still belong in the infos, in env order.
            infos = self._vector_infos.merge(with_quiet_ends(result.as_records(), ended), slot, True)
        elif result.table is None and result.columns is None and not result.records:
            infos = {}  # no env reported anything (CartPole): the commonest step of all
        else:
            infos = self._infos(result, same_step)
        return (
            self._observation(slot),
            eng.rewards[slot].copy(),
            eng.terminated[slot].copy(),
            eng.truncated[slot].copy(),
            infos,
        )

    def _infos(self, result: StepResult, same_step: bool) -> dict[str, Any]:
        """gymnasium's infos of a step: from the info table in one compiled pass when
        every env set every key, else from columns or records."""
        if result.table is not None:
            info_i, info_f, mask, schema = result.table
            infos = _gym_infos.table_vector_infos(
                info_i, info_f, mask, result.slot, self._vector_infos.table_cols(schema)
            )
            if infos is not None:
                return infos
        columns, records = result.general()
        if columns is not None:
            return columns_to_vector_infos(columns, self.num_envs)
        return self._vector_infos.merge(records, result.slot, same_step)

    # -------------------------------------------------------------- env access
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Send ``call(name, *args, **kwargs)`` to every env; ``call_wait`` returns the results."""
        self._idle("call_async")
        self._engine.call_async("call", name, args, kwargs)
        self._pending = ("call",)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The results of ``call_async``, env by env; ``timeout`` as ``reset_wait``'s."""
        self._take("call", timeout)
        return tuple(self._engine.call_wait())

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        self._idle("set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values for _ in range(self.num_envs)]
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        self._engine.call("set_wrapper_attr", name, values=list(values))

    def render(self) -> tuple | None:
        self._idle("render")
        return tuple(self._engine.call("render", None))

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
