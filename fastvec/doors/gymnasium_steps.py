"""The gymnasium door's lock-step commands over every env: ``reset`` (seeds, options,
``reset_mask``) and ``step``, each also as an ``*_async``/``*_wait`` pair, and the
engine's ``StepResult`` turned into gymnasium's 5-tuple: the infos from the shared info
table in one compiled pass (``_gym_infos``) on the common step, from columns or records
otherwise. A mixin of ``fastvec.AsyncVectorEnv``.
"""

from __future__ import annotations

from types import EllipsisType
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from .._core.infos import StepResult, with_quiet_ends
from . import _gym_infos
from .base import check_seed
from .gymnasium_calls import PendingCalls
from .vector_infos import VectorInfos, columns_to_vector_infos

__all__ = ["StepsAndResets", "reset_seeds", "reset_mask"]


def reset_seeds(seed, n: int) -> list[int | None]:
    """Each of ``n`` envs' seed for ``reset(seed=...)``: None, ``seed + i``, or a list's."""
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        first = check_seed(seed, "seed")
        return [first + i for i in range(n)]
    if isinstance(seed, (list, tuple)):
        if len(seed) != n:
            raise ValueError(
                f"If seeds are passed as a list the length must match num_envs={n} but got length={len(seed)}."
            )
        return [check_seed(s, f"seed[{i}]") for i, s in enumerate(seed)]
    raise ValueError(f"seed must be None, an int or a list of {n} ints, got {seed!r}")


def reset_mask(options, n: int) -> tuple[dict[str, Any] | None, np.ndarray | None]:
    """``reset``'s options without ``reset_mask``, and the mask (checked as gymnasium
    checks it; None: every env)."""
    if options is not None and not isinstance(options, dict):
        raise ValueError(f"options must be a dict or None, got {type(options).__name__}")
    if options is None or "reset_mask" not in options:
        return options, None
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
    return options, mask


class StepsAndResets(PendingCalls):
    """gymnasium's ``reset`` and ``step`` over every env in lock-step."""

    autoreset_mode: AutoresetMode
    _vector_infos: VectorInfos

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        """Send the resets (arguments as ``reset``); ``reset_wait`` returns their results."""
        self._idle("reset_async")
        n = self.num_envs
        seeds = reset_seeds(seed, n)
        options, mask = reset_mask(options, n)
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
