"""``Engine``'s start-up: spawning the workers, placing envs, laying out the segment.

Start-up runs in phases over the workers' sockets, before any doorbell exists: with a
probe, the workers time their envs and the engine places them by cost; every worker
builds its envs and reports their spaces; the engine lays out one segment for
everything and tells each worker where it is. Replacing a failed worker replays the
same phases for that worker alone.
"""

from __future__ import annotations

import pickle

import numpy as np

from ..errors import SpaceMismatchError
from . import channel
from . import protocol as P
from .actions import ActionWriter
from .infos import InfoTable
from .pickled import PickledRows
from .placement import as_ranges, balance
from .segment import Ring, create_segment, layout_of, leaves_of, pickled_arrays, plan_segment

__all__ = ["PROBE_S", "WorkerStartup"]

# How long each worker times its envs at start-up with placement="balanced" (seconds;
# at least PROBE_ROUNDS steps of each env, fastvec._core.worker).
PROBE_S = 0.2


class WorkerStartup:
    """``Engine``'s start-up and worker replacement (uses ``_sup``, the processes, and
    ``WorkerReplies``' decoding)."""

    def _place(self, worker_envs: list[np.ndarray]) -> None:
        """Worker w runs envs ``worker_envs[w]`` (sorted); ``groups``: their ``[start,
        stop)`` runs when each worker's envs are one run in worker order (batches need
        that), else None."""
        self.worker_envs = worker_envs
        self.groups = as_ranges(worker_envs)
        self._env_worker = np.empty(self.num_envs, dtype=np.intp)
        self._env_local = np.empty(self.num_envs, dtype=np.intp)
        for w, envs in enumerate(worker_envs):
            self._env_worker[envs] = w
            self._env_local[envs] = np.arange(envs.size)

    def _start(self, probe: bool) -> None:
        self._all_workers = np.arange(self.num_workers, dtype=np.intc)
        for w in range(self.num_workers):
            self._sup.spawn(w, PROBE_S if probe else 0.0)
        if probe:
            self._place_by_probe()
        # Every worker builds its envs and reports their spaces.
        replies = self._read_replies(range(self.num_workers), "starting")
        per_env: list = [None] * self.num_envs
        for w, envs in enumerate(self.worker_envs):
            for i, entry in zip(envs, replies[w]):
                per_env[i] = entry
        self._take_spaces(per_env)
        self._lay_out_segment()
        self._attach(range(self.num_workers))

    def _place_by_probe(self) -> None:
        """The probe's costs in: place the envs by them, then have the workers build."""
        costs = self._read_replies(range(self.num_workers), "timing the envs (placement probe)")
        env_ns = np.empty(self.num_envs)
        for w, envs in enumerate(self.worker_envs):
            env_ns[envs] = costs[w]
        self._placed_by = env_ns / 1e3
        self._place(balance(self._placed_by, self.num_workers))
        self._sup.place(self.worker_envs)
        for w in range(self.num_workers):
            self._sup.build(w)

    def _take_spaces(self, per_env: list) -> None:
        """Every env's ``(observation space, action space, metadata, render mode,
        spec)``: checked alike, env 0's kept as the vector env's."""
        obs_space, act_space, metadata, render_mode, spec = per_env[0]
        self._check_spaces(per_env, obs_space, act_space, range(self.num_envs))
        self.env_observation_spaces = [entry[0] for entry in per_env]
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.env_metadata = metadata
        self.render_mode = render_mode
        self.spec = spec
        allow = self.options.pickled_leaves
        self.obs_leaves_info = leaves_of(obs_space, pickled=allow)
        self.act_leaves_info = leaves_of(act_space, pickled=allow)
        self._action_writer = ActionWriter(act_space, self.num_envs, self.options.action_check)

    def _lay_out_segment(self) -> None:
        """One segment for everything, laid out once; the views, doorbells and info
        table over it, and the payload that tells a worker where it is."""
        obs_space, act_space = self.single_observation_space, self.single_action_space
        plan = plan_segment(
            obs_space,
            act_space,
            self.num_slots,
            self.num_envs,
            num_workers=self.num_workers,
            ctl_cols=P.CTL_COLS,
            info_cols=P.INFO_COLS,
        )
        segment = create_segment(plan.size)
        self._sup.segment_box.append(segment)
        self.shm_name = segment.name
        # where each array lies in the segment: another process maps the same arrays with
        # SegmentPlan.from_entries(segment_entries).arrays(attach_segment(shm_name))
        self.segment_entries = list(plan.entries)
        arrays = plan.arrays(segment.buf)
        arrays.update(pickled_arrays(obs_space, act_space, self.num_slots, self.num_envs))
        self._bind_ring(arrays)
        self._pickled = PickledRows.of(Ring.of(arrays), self.obs_leaves_info, self.act_leaves_info)
        self._pickled_actions = self._pickled is not None and bool(self._pickled.act)
        self._table = InfoTable(arrays["info_table"], arrays["info_mask"], self.worker_envs, P.INFO_COLS)
        self._env_cost = arrays["env_cost"]
        self._paused = arrays["paused"]
        # step()'s action fast path: one plain leaf with a compiled bounds check.
        writer = self._action_writer
        self._fast_action = None if writer.nested or writer.checks[0].fast is None else writer.checks[0]
        self._ctl = channel.Controller(arrays["ctl"], self._sup.fds, _spin_arg(self.main_spin_us))
        self._attach_payload = pickle.dumps((segment.name, plan.entries, obs_space, act_space, _spin_arg(self.spin_us)))

    def _attach(self, workers) -> None:
        for w in workers:
            channel.send_header(int(self._sup.fds[w]), P.CMD_SPACES, 0, 0, self._attach_payload)
        self._read_replies(workers, "attaching shared memory")

    def _read_replies(self, workers, doing: str) -> dict:
        return self._decode(self._sup.read_replies(workers, self.options.start_timeout, doing, self._fail), doing)

    def _check_spaces(self, per_env, obs_space, act_space, indices) -> None:
        """Every env's spaces (``per_env``, those of envs ``indices``) against env 0's."""
        layout = self.options.space_check == "layout"
        for i, (o, a, *_rest) in zip(indices, per_env):
            for what, mine, want in (("observation", o, obs_space), ("action", a, act_space)):
                lax = layout and what == "observation"
                if lax and (mine_layout := layout_of(mine)) is not None and mine_layout == layout_of(want):
                    continue
                if mine != want:
                    if lax:
                        rule = f"share the leaves, shapes and dtypes of their {what} spaces"
                    else:
                        rule = f"share their {what} spaces"
                        if what == "observation":  # gymnasium's words, for its users
                            rule += (
                                " (the sub-environments observation spaces are not equivalent. If this "
                                "is intentional, use `observation_mode='different'` instead.)"
                            )
                    raise SpaceMismatchError(
                        f"env {i} has {what} space {mine}, but env 0 has {want}: all envs of a vector env must {rule}"
                    )

    def _replace(self, w: int, slot: int) -> dict[int, dict]:
        """Replace worker w by a fresh process, reset its envs into ``slot``.

        Returns {env_index: reset info}. Raises WorkerError if the new worker fails too.
        """
        self._sup.stop(w)
        self._sup.spawn(w)
        self._ctl.forget(w)
        self._table.forget(w)
        replies = self._read_replies([w], "restarting")
        envs = self.worker_envs[w]
        self._check_spaces(replies[w], self.single_observation_space, self.single_action_space, envs)
        self._attach([w])
        self._send_commands(P.CMD_RESET, slot, {w: [(j, {}) for j in range(envs.size)]})
        recs = self._reset_infos(w, slot, self._gather([w], self.step_timeout, "resetting restarted envs")[w])
        return {int(envs[j]): info for j, info in recs}

    def _reset_infos(self, w: int, slot: int, reply) -> list:
        """A reset reply's ``[(local env, info)]``, its pickled rows written into ``slot``."""
        if self._pickled is None:
            return reply
        return self._pickled.take_reset(slot, self.worker_envs[w], reply)


def _spin_arg(spin_us: float | None) -> float:
    """The channel's spin argument: < 0 asks for waits that learn the loop."""
    return -1.0 if spin_us is None else float(spin_us)
