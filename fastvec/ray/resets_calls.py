"""``RayEngine``'s resets and calls: sent to the actors that run the envs named, their
replies gathered (``reset_async``/``reset_wait``, ``call_async``/``call_wait``, and
``poll`` for either in flight)."""

from __future__ import annotations

import pickle

import ray

from .._core.pickled import pickle_payloads
from .calls import CLOSE_GRACE_S

__all__ = ["ActorResetsAndCalls"]


class ActorResetsAndCalls:
    """``RayEngine``'s commands other than a step (uses ``_actors``; ``_env_actor``,
    which actor runs each env; ``ActorCalls._gather``)."""

    def reset_async(self, slot: int, kwargs_per_env: dict[int, dict]) -> None:
        """Send the resets of ``reset`` (``reset_wait`` collects them)."""
        self._check_usable()
        targets: dict[int, dict] = {}
        for i, kwargs in kwargs_per_env.items():
            k = int(self._env_actor[i])
            targets.setdefault(k, {})[i - self.groups[k][0]] = kwargs
        self._pending_cmd = ("reset", slot, sorted(targets), self._send_resets(targets))

    def reset_wait(self, timeout: float | None = ...) -> dict[int, dict]:
        _, slot, _actors, refs = self._take_pending("reset")
        infos = self._collect_resets(slot, refs, "resetting", timeout)
        self._last_slot = slot
        return infos

    def _reset_actors(self, slot: int, targets: dict, doing: str) -> dict:
        return self._collect_resets(slot, self._send_resets(targets), doing)

    def _send_resets(self, targets: dict) -> dict:
        blobs = pickle_payloads(targets, "reset arguments for the actors")
        return {k: self._actors[k].reset.remote(blob) for k, blob in blobs.items()}

    def _collect_resets(self, slot: int, refs: dict, doing: str, timeout=...) -> dict:
        timeout = self.step_timeout if timeout is ... else timeout
        replies = self._gather(refs, self._outer_timeout(timeout), doing, raise_first=True)
        infos = {}
        for k in sorted(replies):
            _, recs, idx, obs = replies[k]
            a = self.groups[k][0]
            rows = idx + a
            for dst, src in zip(self.obs_bufs, obs):
                dst[slot, rows] = src
            for j, info in recs.items():
                infos[a + j] = info
        return infos

    def call_async(self, kind: str, name, args=(), kwargs=None, indices=None, values=None) -> None:
        """Send the calls of ``call`` (``call_wait`` collects them)."""
        self._check_usable()
        indices = self.normalize_indices(indices)
        targets: dict[int, tuple[list, list]] = {}
        for n, i in enumerate(indices):
            k = int(self._env_actor[i])
            idx, vals = targets.setdefault(k, ([], []))
            idx.append(i - self.groups[k][0])
            vals.append(None if values is None else values[n])
        blobs = pickle_payloads(
            {
                k: (kind, name, tuple(args), dict(kwargs or {}), idx, None if values is None else vals)
                for k, (idx, vals) in targets.items()
            },
            "arguments for the actors",
        )
        refs = {k: self._actors[k].call.remote(blob) for k, blob in blobs.items()}
        self._pending_cmd = ("call", indices, sorted(targets), refs, f"{kind}({name!r})")

    def call_wait(self, timeout: float | None = ...) -> list:
        _, indices, _actors, refs, doing = self._take_pending("call")
        timeout = self.step_timeout if timeout is ... else timeout
        replies = self._gather(refs, self._outer_timeout(timeout), doing, raise_first=True)
        cursor = {k: iter(pickle.loads(blob)) for k, blob in replies.items()}
        return [next(cursor[int(self._env_actor[i])]) for i in indices]

    def poll(self, timeout: float) -> bool:
        """As ``Engine.poll``, for a reset or call in flight (a step's replies come
        through two transports here: not polled, a ValueError)."""
        if self._pending_cmd is None:
            if self._pending_slot is not None:
                raise ValueError("RayEngine cannot poll a step in flight; wait for it")
            raise RuntimeError("poll() called with nothing in flight")
        refs = list(self._pending_cmd[3].values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, float(timeout)))
        return len(ready) == len(refs)

    def _drain_command(self) -> None:
        pending, self._pending_cmd = self._pending_cmd, None
        self._gather(pending[3], CLOSE_GRACE_S, "closing")
