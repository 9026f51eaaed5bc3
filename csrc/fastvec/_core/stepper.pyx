# cython: language_level=3
"""The worker's step loop: every env of a worker, results straight into shared memory.

``Stepper.serve`` answers STEP commands until another command arrives: it steps each
env on its action in the slot, writes observations, rewards and flags into that slot,
handles autoreset, and puts flat numeric infos into the shared info table, all without
leaving C for anything but the envs' own Python code. Infos that do not fit the table
are pickled by a function the worker passes in (``dump_records``), which also decides
their encoding: this module knows nothing of the front doors' formats.
"""
import pickle

cimport cython
cimport numpy as cnp
from libc.string cimport memcpy

from fastvec._core.sync cimport fv_now_ns
from fastvec._core.worker_channel cimport WorkerChannel
from fastvec._core.protocol cimport (
    AUTORESET_NEXT_STEP, AUTORESET_SAME_STEP, HAS_PAYLOAD, IN_TABLE, INFO_COLS, NO_PAYLOAD, REPLY_DONE,
)

from fastvec._core.framing import send_header

import numpy as np

cnp.import_array()


cdef inline bint _fast_copy(object dest, Py_ssize_t row, object value):
    """memcpy ``value`` into row ``row`` of the 2-D-indexed leaf array ``dest`` when
    it is a C-contiguous array of exactly the leaf's dtype and size."""
    cdef cnp.ndarray d = <cnp.ndarray>dest
    cdef cnp.ndarray v
    cdef Py_ssize_t nbytes
    if not cnp.PyArray_CheckExact(value) or cnp.PyArray_TYPE(d) == cnp.NPY_OBJECT:
        return False  # a pickled leaf holds references, never bytes
    v = <cnp.ndarray>value
    if not cnp.PyArray_IS_C_CONTIGUOUS(v):
        return False
    if cnp.PyArray_TYPE(v) != cnp.PyArray_TYPE(d) or not cnp.PyArray_ISNOTSWAPPED(v):
        return False
    # bytes per (slot, env) row of the leaf
    nbytes = cnp.PyArray_STRIDES(d)[1]
    if cnp.PyArray_NBYTES(v) != nbytes:
        return False
    memcpy(<char *>cnp.PyArray_DATA(d) + row * nbytes, cnp.PyArray_DATA(v), nbytes)
    return True


@cython.dataclasses.dataclass(frozen=True, kw_only=True)
cdef class StepperSetup:
    """What a ``Stepper`` is built from, read once by its constructor into typed fields
    (the step loop never looks anything up here).

    ``envs`` and ``rows``: the worker's envs and the global index of each (the row its
    results go to). ``obs_leaves``/``final_leaves``/``act_leaves``: the ring's arrays
    (``[num_slots, num_envs, *leaf_shape]``, ``fastvec._core.segment.Ring``), with
    ``rewards``, ``terminated`` and ``truncated``; ``obs_paths``: each observation leaf's
    path in a Dict/Tuple observation. ``build_nested`` rebuilds a nested action,
    ``kind_of`` sorts info values into table columns and ``dump_records`` pickles the
    infos that do not fit (``fastvec._core.infos``). The rest are the segment's optional
    arrays: the info table and its mask, the final observations' int marks
    (``final_pytype``, with the Discrete leaves' ``int_paths``), each env's cost, and
    which envs are paused (``Engine.pause``).
    """
    envs: list
    rows: object
    num_envs: int
    mode: int
    obs_leaves: list
    final_leaves: list
    obs_paths: list
    act_leaves: list
    act_space: object
    rewards: object
    terminated: object
    truncated: object
    build_nested: object
    kind_of: object
    dump_records: object
    info_table: object = None
    info_mask: object = None
    int_paths: list = None
    final_pytype: object = None
    cost: object = None
    paused: object = None


cdef class Stepper:
    """A worker's envs and its views of the shared arrays, built from a ``StepperSetup``.

    ``obs_leaves``/``final_leaves``/``act_leaves`` are lists of arrays shaped
    ``[num_slots, num_envs, *leaf_shape]``; ``obs_paths`` gives each observation leaf's
    path inside a Dict/Tuple observation (empty for a plain Box etc.). ``rows[j]`` is
    the global index of local env ``j``: the row its results go to (the worker's envs
    need not be contiguous, ``fastvec._core.placement``).
    """
    cdef public list envs
    cdef int n_local, num_envs, mode
    cdef int[::1] rows
    # Per env, [nanoseconds, steps] spent in its step (and autoreset): the placement's
    # measured costs (``env_cost`` in the segment), None without that array.
    cdef long long[:, ::1] cost
    cdef bint timed
    # Per env, 1 while paused (``Engine.pause``): not stepped; its rows read no reward, no end.
    cdef cnp.uint8_t[::1] paused
    cdef bint can_pause
    cdef list obs_leaves, final_leaves, obs_paths, act_leaves
    cdef object act_space, build_nested, kind_of, dump_records
    # Pickled leaves (``fastvec._core.pickled``): a step's reply is made by this
    # callable, ``(slot, records, ended local envs) -> bytes``; None without them.
    cdef public object report_pickled
    # same_step: which Discrete leaves of a final observation the env gave as Python
    # ints (bit k: the k-th Discrete leaf, ``int_paths[k]``), so that ``final_obs`` keeps
    # the env's type as SyncVectorEnv's does; None without Discrete leaves.
    cdef list int_paths
    cdef cnp.uint32_t[:, ::1] final_pytype
    cdef bint single_obs, act_simple, act_scalar
    cdef double[:, ::1] rewards
    cdef cnp.uint8_t[:, ::1] terminated, truncated
    cdef public object needs_reset
    cdef cnp.uint8_t[::1] _needs_reset
    cdef public int current  # global index of the env being called, for error reports
    # The info table: per slot and env, INFO_COLS 8-byte cells (float64 or int64 by
    # column) and a bit mask of the cells set this step. ``schema`` maps key -> (column,
    # type, is_int); the parent learns new columns from ``schema_list`` sent once.
    cdef double[:, :, ::1] info_f
    cdef long long[:, :, ::1] info_i
    cdef cnp.uint16_t[:, ::1] info_mask
    cdef dict schema
    cdef public list schema_list
    cdef public bint schema_dirty

    def __init__(self, StepperSetup setup):
        self.envs = setup.envs
        self.n_local = len(setup.envs)
        self.rows = np.ascontiguousarray(setup.rows, dtype=np.intc)
        if self.rows.shape[0] != self.n_local:
            raise ValueError(f"{self.n_local} envs but {self.rows.shape[0]} rows")
        self.timed = setup.cost is not None
        self.can_pause = setup.paused is not None
        if self.can_pause:
            self.paused = setup.paused
        if self.timed:
            self.cost = setup.cost
        self.num_envs = setup.num_envs
        self.mode = setup.mode
        self.obs_leaves = setup.obs_leaves
        self.final_leaves = setup.final_leaves
        self.obs_paths = setup.obs_paths
        self.single_obs = len(self.obs_leaves) == 1 and len(self.obs_paths[0]) == 0
        self.act_leaves = setup.act_leaves
        self.act_space = setup.act_space
        self.build_nested = setup.build_nested
        self.kind_of = setup.kind_of  # type -> True (int64 cell), False (float64 cell), None (not a column)
        self.dump_records = setup.dump_records  # records -> the pickled report of a step
        # A single non-nested action leaf: hand the env a scalar (Discrete) or a row copy.
        self.act_simple = len(self.act_leaves) == 1 and (<cnp.ndarray>self.act_leaves[0]).ndim >= 2 \
            and not hasattr(self.act_space, "spaces")
        self.act_scalar = self.act_simple and (<cnp.ndarray>self.act_leaves[0]).ndim == 2
        self.rewards = setup.rewards
        self.terminated = setup.terminated.view(np.uint8)
        self.truncated = setup.truncated.view(np.uint8)
        self.needs_reset = np.zeros(self.n_local, dtype=np.uint8)
        self._needs_reset = self.needs_reset
        self.current = -1
        self.report_pickled = None
        int_paths = setup.int_paths
        self.int_paths = int_paths[:32] if int_paths and setup.final_pytype is not None else None
        if self.int_paths is not None:
            self.final_pytype = setup.final_pytype
        self.schema = {}
        self.schema_list = []
        self.schema_dirty = False
        if setup.info_table is not None:
            self.info_f = setup.info_table
            self.info_i = setup.info_table.view(np.int64)
            self.info_mask = setup.info_mask

    cdef int _table(self, list records, int slot) except -1:
        """Write flat numeric step infos into the info table; 1 if every record fit,
        0 if this step's infos must travel pickled (nested, non-numeric, reset infos,
        more than INFO_COLS keys, ints beyond int64)."""
        cdef int j, i, col
        cdef cnp.uint16_t bits
        cdef tuple entry
        if self.info_mask is None:
            return 0
        for j in range(self.n_local):
            self.info_mask[slot, self.rows[j]] = 0
        for rec in records:
            j = <int>rec[0]
            info = rec[1]
            if rec[2] is not None or type(info) is not dict:
                return 0
            i = self.rows[j]
            bits = 0
            for key, value in (<dict>info).items():
                kind = type(value)
                entry = self.schema.get(key)
                if entry is None or entry[1] is not kind:
                    entry = self._new_column(key, kind)
                    if entry is None:
                        return 0
                col = <int>entry[0]
                if entry[2]:
                    try:
                        self.info_i[slot, i, col] = <long long>value
                    except OverflowError:
                        return 0
                else:
                    self.info_f[slot, i, col] = <double>value
                bits |= <cnp.uint16_t>(1 << col)
            self.info_mask[slot, i] = bits
        return 1

    cdef object _new_column(self, object key, object kind):
        if key in self.schema:  # same key, another type this time: not a column
            return None
        if len(self.schema_list) >= INFO_COLS:
            return None
        is_int = self.kind_of(kind)
        if is_int is None:
            return None
        entry = (len(self.schema_list), kind, is_int)
        self.schema[key] = entry
        self.schema_list.append((key, kind))
        self.schema_dirty = True
        return entry

    cdef object _action(self, int slot, int i):
        cdef cnp.ndarray a
        if self.act_scalar:
            return (<cnp.ndarray>self.act_leaves[0])[slot, i]
        if self.act_simple:
            return (<cnp.ndarray>self.act_leaves[0])[slot, i].copy()
        parts = [np.array(leaf[slot, i]) if (<cnp.ndarray>leaf).ndim > 2 else leaf[slot, i]
                 for leaf in self.act_leaves]
        return self.build_nested(self.act_space, parts)[0]

    cdef int _write_obs(self, list leaves, int slot, int i, object obs) except -1:
        cdef Py_ssize_t row = <Py_ssize_t>slot * self.num_envs + i
        cdef Py_ssize_t k
        if self.single_obs:
            dest = leaves[0]
            if not _fast_copy(dest, row, obs):
                dest[slot, i] = obs
            return 0
        for k in range(len(leaves)):
            value = obs
            for key in <tuple>self.obs_paths[k]:
                value = value[key]
            dest = leaves[k]
            if not _fast_copy(dest, row, value):
                dest[slot, i] = value
        return 0

    cdef int _mark_ints(self, int slot, int i, object obs) except -1:
        cdef cnp.uint32_t bits = 0
        cdef int k = 0
        for path in self.int_paths:
            value = obs
            for key in <tuple>path:
                value = value[key]
            if type(value) is int:
                bits |= <cnp.uint32_t>1 << k
            k += 1
        self.final_pytype[slot, i] = bits
        return 0

    def write_reset_obs(self, int slot, int j, object obs):
        """Write a reset observation of local env ``j`` (used by the Python reset path)."""
        self._write_obs(self.obs_leaves, slot, self.rows[j], obs)

    cpdef list step(self, int slot):
        """Step every env of this worker on the actions in ``slot``; write results there.

        Returns a list of ``(local_index, step_info, reset_info)`` for envs that produced
        a non-empty info or reset, or None when there is nothing to report.
        """
        cdef int j, i
        cdef list records = None
        cdef bint term, trunc
        # One clock reading per env (its end is the next one's start): ~25 ns each.
        cdef long long t0 = fv_now_ns() if self.timed else 0, t1
        for j in range(self.n_local):
            i = self.rows[j]
            if self.can_pause and self.paused[i]:
                self.rewards[slot, i] = 0.0
                self.terminated[slot, i] = 0
                self.truncated[slot, i] = 0
                continue
            self.current = i
            env = self.envs[j]
            if self.mode == AUTORESET_NEXT_STEP and self._needs_reset[j]:
                # gymnasium's NEXT_STEP: the step after an episode ended resets instead.
                obs, reset_info = env.reset()
                self._needs_reset[j] = 0
                self.rewards[slot, i] = 0.0
                self.terminated[slot, i] = 0
                self.truncated[slot, i] = 0
                if reset_info:
                    if records is None:
                        records = []
                    records.append((j, None, reset_info))
            else:
                obs, rew, term_obj, trunc_obj, info = env.step(self._action(slot, i))
                term = True if term_obj else False
                trunc = True if trunc_obj else False
                self.rewards[slot, i] = rew
                self.terminated[slot, i] = term
                self.truncated[slot, i] = trunc
                if term or trunc:
                    if self.mode == AUTORESET_SAME_STEP:
                        self._write_obs(self.final_leaves, slot, i, obs)
                        if self.int_paths is not None:
                            self._mark_ints(slot, i, obs)
                        obs, reset_info = env.reset()
                        # An end with empty infos on both sides sends nothing: the flags
                        # and the final observation in the segment say it all, and the
                        # step stays on the payload-less path (CartPole ends every ~20 steps).
                        if not (type(info) is dict and not info and type(reset_info) is dict and not reset_info):
                            if records is None:
                                records = []
                            records.append((j, info, reset_info))
                    else:
                        if self.mode == AUTORESET_NEXT_STEP:
                            self._needs_reset[j] = 1
                        if info:
                            if records is None:
                                records = []
                            records.append((j, info, None))
                elif info:
                    if records is None:
                        records = []
                    records.append((j, info, None))
            self._write_obs(self.obs_leaves, slot, i, obs)
            if self.timed:
                t1 = fv_now_ns()
                self.cost[i, 0] += t1 - t0
                self.cost[i, 1] += 1
                t0 = t1
        self.current = -1
        return records

    def serve(self, WorkerChannel chan):
        """Answer STEP commands until another command arrives; then return None and
        leave that command to ``chan.current_command()``.

        Exceptions from envs propagate to the caller (the worker's Python loop), which
        reports them; ``self.current`` then names the env that raised.
        """
        cdef int slot
        while True:
            chan._wait()
            slot = chan._step_slot()
            if slot < 0:
                return None  # the caller reads it with chan.current_command()
            self._answer(chan, slot)

    def answer(self, WorkerChannel chan, int slot):
        """Step on the actions in ``slot`` and reply: a step whose command carried a
        payload (pickled actions), which the worker's Python loop has unpacked."""
        self._answer(chan, slot)

    cdef int _answer(self, WorkerChannel chan, int slot) except -1:
        cdef list records = self.step(slot)
        cdef int j
        if self.report_pickled is not None:
            ended = []
            if self.mode == AUTORESET_SAME_STEP:
                ended = [j for j in range(self.n_local)
                         if self.terminated[slot, self.rows[j]] or self.truncated[slot, self.rows[j]]]
            chan.reply(REPLY_DONE, slot, self.report_pickled(slot, records, ended))
        elif records is None:
            chan._publish(REPLY_DONE, slot, NO_PAYLOAD)
        elif self._table(records, slot):
            if self.schema_dirty:
                self.schema_dirty = False
                send_header(chan.fd, REPLY_DONE, slot, 0,
                            pickle.dumps(("schema", self.schema_list), protocol=pickle.HIGHEST_PROTOCOL))
                chan._publish(REPLY_DONE, slot, IN_TABLE | HAS_PAYLOAD)
            else:
                chan._publish(REPLY_DONE, slot, IN_TABLE)
        else:
            chan.reply(REPLY_DONE, slot, self.dump_records(records))
        return 0
