"""``EngineBase``: what every engine does on its caller's side.

An engine runs ``num_envs`` envs in ``num_workers`` groups (worker processes for
``fastvec.engine.Engine``, Ray actors for ``fastvec.ray.RayEngine``) and keeps their
results in a ring of ``num_slots`` slots of shared arrays. This class owns what does not
depend on how a group is reached: the slots, action checks, the order of a step
(check, write, dispatch, collect, failures, restarts, result), the restart bookkeeping,
views of observations and closing. A subclass implements the transport:

- ``_dispatch(slot)``: tell every group to step on the actions in ``slot``;
- ``_collect_step(slot, timeout)``: wait for them: ``({group: report}, {group: (error,
  fatal)})``, every healthy group's reply consumed even when another failed;
- ``_result(slot, reports)``: the ``StepResult`` of those reports;
- ``_replace(group, slot)``: start a fresh group for a failed one and reset its envs
  into ``slot``, returning ``{env: reset info}``;
- ``_unit(group)``: how messages name a group ("worker 1", "actor 1 (node ...)");
- ``_drain()``: let a step in flight finish before closing; ``reset`` and ``call``.
"""

from __future__ import annotations

import operator
import warnings
from types import EllipsisType

import numpy as np
from gymnasium import spaces

from ..errors import ClosedError, WorkerError
from .infos import StepResult, columns_to_records
from .placement import envs_text, whole_workers
from .segment import OBJECT, Ring, build_nested, leaf_batch, leaf_value, readonly_view


class _InSlot:
    """``IN_SLOT``: the actions of a step are already in ``act_bufs[.][slot]``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "IN_SLOT"


IN_SLOT = _InSlot()


def _index(i) -> int:
    if isinstance(i, bool):
        raise TypeError("bool is not an env index")
    return operator.index(i)


class EngineBase:
    _closed: bool = True
    _broken: str | None = None
    _pending_slot: int | None = None
    _pending_cmd: tuple | None = None  # a reset or call sent, not yet waited for
    _pending_groups: dict | None = None  # {worker: slot} of batch-group steps in flight (Engine)
    _last_slot: int = 0
    _log_prefix = "fastvec"

    # ------------------------------------------------------------------ set-up
    def _bind_ring(self, arrays: dict) -> None:
        """The ring's arrays, by the names ``plan_segment`` gives them."""
        ring = Ring.of(arrays)
        self.obs_bufs, self.final_bufs, self.act_bufs = ring.obs, ring.final, ring.act
        self.rewards, self.terminated, self.truncated = ring.rewards, ring.terminated, ring.truncated
        self._final_pytype = arrays.get("final_pytype")  # see Stepper.int_paths
        # A plain (not Dict/Tuple) observation: one leaf, handed out without rebuilding.
        self._flat_obs = (
            len(self.obs_bufs) == 1
            and self.obs_bufs[0].dtype != OBJECT
            and not isinstance(self.single_observation_space, (spaces.Dict, spaces.Tuple))
        )

    def _take_options(self, options) -> None:
        """Keep ``options`` (an ``EngineOptions``) and, as plain attributes for the step
        path, the fields read there."""
        self.options = options
        self.num_slots = options.num_slots
        self.autoreset_mode = options.autoreset_mode
        self.step_timeout = options.step_timeout
        self.restart_on_error = options.restart_on_error

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _check_usable(self, batches_ok: bool = False) -> None:
        if self._closed:
            raise ClosedError("this vector env is closed")
        if self._broken is not None:
            raise WorkerError(f"the vector env is unusable after an earlier failure: {self._broken}; close it")
        if self._pending_slot is not None:
            raise RuntimeError("a step is in flight: call step_wait() before anything else")
        if self._pending_cmd is not None:
            raise RuntimeError(
                f"a {self._pending_cmd[0]} is in flight: call {self._pending_cmd[0]}_wait() before anything else"
            )
        if self._pending_groups and not batches_ok:
            raise RuntimeError("batch steps are in flight (group_send): group_recv them before anything else")

    # ------------------------------------------------------------------ resets and calls
    def reset(self, slot: int, kwargs_per_env: dict[int, dict]) -> dict[int, dict]:
        """Reset the envs named in ``kwargs_per_env`` ({env: reset kwargs}), writing
        their observations into ``slot``. Returns {env: reset info}."""
        self.reset_async(slot, kwargs_per_env)
        return self.reset_wait()

    def call(self, kind: str, name, args=(), kwargs=None, indices=None, values=None) -> list:
        """Run ``kind`` (see ``fastvec._core.worker._do_call``: call, env_method,
        get_attr, has_attr, set_attr, set_wrapper_attr, is_wrapped, render) on the envs
        at ``indices``, in order."""
        self.call_async(kind, name, args, kwargs, indices, values)
        return self.call_wait()

    def _take_pending(self, what: str) -> tuple:
        if self._pending_cmd is None or self._pending_cmd[0] != what:
            raise RuntimeError(f"{what}_wait() called without {what}_async()")
        pending, self._pending_cmd = self._pending_cmd, None
        return pending

    def _check_step_slot(self, slot: int, batches_ok: bool = False) -> None:
        self._check_usable(batches_ok)
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot must be in [0, {self.num_slots}), got {slot}")

    # ------------------------------------------------------------------ stepping
    def step_async(self, actions, slot: int) -> None:
        """Start a step that writes its results into ``slot``: check ``actions`` (a
        ``ValueError`` before anything is sent) and write them into
        ``act_bufs[.][slot]``, or with ``actions=IN_SLOT`` take what the caller already
        wrote there (unchecked: the trainer writes valid actions in place)."""
        self._check_step_slot(slot)
        if actions is not IN_SLOT:
            self._action_writer.write(self._action_writer.validate(actions), self.act_bufs, slot)
        self._dispatch(slot)
        self._pending_slot = slot

    def step_wait(self, timeout: float | None | EllipsisType = ...) -> StepResult:
        """Finish the step in flight (``timeout`` in seconds; default ``step_timeout``).

        A failed group raises ``WorkerError`` (after every healthy group's reply is in);
        with ``restart_on_error`` it is replaced instead, its envs reset, and they report
        a truncated episode with ``info["fastvec_restarted"] = True``.
        """
        if self._pending_slot is None:
            raise RuntimeError("step_wait() called without step_async()")
        slot, self._pending_slot = self._pending_slot, None
        if timeout is ...:
            timeout = self.step_timeout
        reports, failures = self._collect_step(slot, timeout)
        return self._finish_step(slot, reports, failures)

    def step(self, actions, slot: int, timeout: float | None | EllipsisType = ...) -> StepResult:
        """``step_async`` then ``step_wait``: what a front door's ``step`` does."""
        self.step_async(actions, slot)
        return self.step_wait(timeout)

    def _finish_step(self, slot: int, reports: dict, failures: dict) -> StepResult:
        """The ``StepResult`` of a step's reports; failed groups raise or are replaced
        (their envs end truncated with the observations of ``self._last_slot``)."""
        if failures and not self.restart_on_error:
            _w, (exc, fatal) = min(failures.items())
            if fatal:
                self._broken = str(exc)
            raise exc
        result = self._result(slot, reports)
        if failures:
            columns, records = result.general()
            records = list(records) if columns is None else columns_to_records(columns)
            for w, (exc, _fatal) in sorted(failures.items()):
                records += self._restart_group(w, slot, exc)
            records.sort(key=lambda rec: rec[0])
            result = StepResult(self, slot, records=records)
        self._last_slot = slot
        return result

    def _restart_group(self, w: int, slot: int, exc: WorkerError) -> list:
        """Replace failed group ``w``; its envs end their episode in ``slot``, truncated,
        with the observation their previous slot held as the final one."""
        envs = self.envs_of(w)
        previous = [buf[self._last_slot, envs] for buf in self.obs_bufs]  # copies (fancy indexing)
        unit = self._unit(w)
        try:
            reset_infos = self._replace(w, slot)
        except BaseException as again:
            self._broken = f"restarting {unit} failed: {again}"
            if isinstance(again, WorkerError):
                raise again from exc
            raise
        warnings.warn(
            f"{self._log_prefix}: {exc}; restarted {self._unit(w)} and reset envs {envs_text(envs)}",
            RuntimeWarning,
            stacklevel=5,
        )
        self.restarts.append({**self._restart_record(w), "envs": envs.tolist(), "error": str(exc)})
        self.rewards[slot, envs] = 0.0
        self.terminated[slot, envs] = False
        self.truncated[slot, envs] = True
        for final, prev in zip(self.final_bufs, previous):
            final[slot, envs] = prev
        if self._final_pytype is not None:
            self._final_pytype[slot, envs] = 0  # their types are not known: numpy integers
        info = {"fastvec_restarted": True, "fastvec_error": str(exc)}
        return [(i, dict(info), reset_infos.get(i, {})) for i in envs.tolist()]

    def _restart_record(self, w: int) -> dict:
        return {"worker": w}

    def envs_of(self, w: int) -> np.ndarray:
        """The indices of group ``w``'s envs (a contiguous run here; ``Engine``'s workers
        may run any set, ``fastvec._core.placement``)."""
        return np.arange(*self.groups[w])

    def workers_of(self, a: int, b: int) -> np.ndarray:
        """The groups that run envs ``[a, b)`` and no others (batches step whole groups)."""
        return whole_workers([self.envs_of(w) for w in range(self.num_workers)], a, b)

    # ------------------------------------------------------------------ envs and views
    def normalize_indices(self, indices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, (int, np.integer)) and not isinstance(indices, bool):
            indices = [indices]
        try:
            out = [_index(i) for i in indices]
        except TypeError:
            raise ValueError(f"indices must be None, an int or a sequence of ints, got {indices!r}") from None
        for i in out:
            if not -self.num_envs <= i < self.num_envs:
                raise ValueError(f"env index {i} out of range for {self.num_envs} envs")
        return [i % self.num_envs for i in out]

    def obs_view(self, slot: int, space=None):
        """The batched observation of ``slot`` as views (Dict/Tuple rebuilt; a pickled
        leaf as the tuple of its values)."""
        parts = [tuple(b[slot]) if b.dtype == OBJECT else b[slot] for b in self.obs_bufs]
        return build_nested(space or self.single_observation_space, parts)[0]

    def observation(self, slot: int, copy: bool, writable: bool = False):
        """What a front door returns: fresh arrays, or views into the ring (read-only
        unless ``writable``: no worker reads them back, but the ring's other readers may)."""
        if self._flat_obs:
            arr = self.obs_bufs[0][slot]
            return arr.copy() if copy else arr if writable else readonly_view(arr)
        return build_nested(
            self.single_observation_space, [leaf_batch(b, slot, copy, writable) for b in self.obs_bufs]
        )[0]

    def final_obs_of(self, slot: int, i: int):
        """A copy of env i's final observation of the episode that ended in ``slot``."""
        bits = 0 if self._final_pytype is None else int(self._final_pytype[slot, i])
        parts, k = [], 0
        for buf, leaf in zip(self.final_bufs, self.obs_leaves_info):
            as_int = False
            if isinstance(leaf.space, spaces.Discrete) and not leaf.pickled:
                as_int, k = bool(bits >> k & 1), k + 1
            parts.append(leaf_value(buf, slot, i, leaf, as_int))
        return build_nested(self.single_observation_space, parts)[0]

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Stop every group and free the ring. Idempotent."""
        if not hasattr(self, "_finalizer"):  # __init__ failed before anything started
            return
        self._closed = True
        if self._pending_slot is not None and self._broken is None:
            try:  # let a step in flight finish so the groups are idle when told to close
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self._drain()
            except Exception:
                pass
        if self._pending_cmd is not None and self._broken is None:
            try:  # the same for a reset or call in flight
                self._drain_command()
            except Exception:
                pass
        self._pending_slot = self._pending_cmd = None
        self._drop_views()
        self._finalizer()

    def _drop_views(self) -> None:
        """Let go of every view of the segment, so that its mapping can close."""
        self.obs_bufs, self.final_bufs, self.act_bufs = [], [], []
        self.rewards = self.terminated = self.truncated = self._final_pytype = None
