"""Pickling what crosses a process boundary: payloads of commands and replies
(``dumps``, ``pickle_payloads``), and the rows of object arrays that cross with a command.

A pickled leaf (``fastvec._core.segment``) has an object array ``[num_slots, num_envs]``
in the parent and in every worker. What one side wrote, the other needs:

- a step's actions, parent -> worker: the step command carries the worker's rows of
  every pickled action leaf (the fixed-size leaves are in the segment as always);
- a step's observations, worker -> parent: the reply carries ``("objs", rows, finals,
  records)``: the worker's rows of every pickled observation leaf, the final
  observations of same_step episode ends ``[(local env, [value per leaf])]``, and the
  step's info records (or None) in place of the usual report;
- a reset's observations: the reply carries ``("objs", [(local env, [value per
  leaf])], infos)``.

Only spaces with pickled leaves take these paths: the zero-copy step stays as it is.
"""

from __future__ import annotations

import pickle

import cloudpickle

from .infos import InfoPicklingError

TAG = "objs"


class PickledRows:
    """The pickled leaves of one process's ring: ``obs``/``final``/``act`` are the
    ring's lists of arrays, ``obs_leaves``/``act_leaves`` their ``Leaf`` lists."""

    def __init__(self, obs, final, act, obs_leaves, act_leaves):
        self.obs = [obs[k] for k, leaf in enumerate(obs_leaves) if leaf.pickled]
        self.final = [final[k] for k, leaf in enumerate(obs_leaves) if leaf.pickled]
        self.act = [act[k] for k, leaf in enumerate(act_leaves) if leaf.pickled]

    @classmethod
    def of(cls, ring, obs_leaves, act_leaves) -> PickledRows | None:
        """None when neither space has a pickled leaf."""
        if not any(leaf.pickled for leaf in obs_leaves + act_leaves):
            return None
        return cls(ring.obs, ring.final, ring.act, obs_leaves, act_leaves)

    # ``envs`` below: a worker's env indices (``fastvec._core.placement``); local env
    # ``j`` is env ``envs[j]``.
    # ------------------------------------------------------------ actions
    def action_rows(self, slot: int, envs) -> list:
        """Those envs' values of every pickled action leaf in ``slot``."""
        return [buf[slot, envs].tolist() for buf in self.act]

    def put_actions(self, slot: int, envs, rows: list) -> None:
        for buf, row in zip(self.act, rows):
            for j, value in enumerate(row):
                buf[slot, envs[j]] = value

    # ------------------------------------------------------------ observations (worker)
    def step_report(self, slot: int, envs, records, ended) -> bytes:
        """A step's reply; ``ended``: local indices whose final observation was kept."""
        rows = [buf[slot, envs].tolist() for buf in self.obs]
        finals = [(j, [buf[slot, envs[j]] for buf in self.final]) for j in ended]
        try:
            return dumps((TAG, rows, finals, records))
        except Exception as exc:
            raise InfoPicklingError(f"the observations or infos of this step could not be pickled: {exc}") from exc

    def reset_report(self, slot: int, envs, js, infos):
        """What a reset replies (pickled by the caller)."""
        return (TAG, [(j, [buf[slot, envs[j]] for buf in self.obs]) for j in js], infos)

    # ------------------------------------------------------------ observations (parent)
    def take_step(self, slot: int, envs, report):
        """Write a step reply's pickled rows; return its records (or None)."""
        _tag, rows, finals, records = report
        for buf, row in zip(self.obs, rows):
            for j, value in enumerate(row):
                buf[slot, envs[j]] = value
        for j, values in finals:
            for buf, value in zip(self.final, values):
                buf[slot, envs[j]] = value
        return records

    def take_reset(self, slot: int, envs, reply):
        """Write a reset reply's pickled rows; return its infos."""
        _tag, rows, infos = reply
        for j, values in rows:
            for buf, value in zip(self.obs, values):
                buf[slot, envs[j]] = value
        return infos


def dumps(obj) -> bytes:
    """``pickle`` (fast) where it can, ``cloudpickle`` (lambdas, local classes) where not."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return cloudpickle.dumps(obj)


def pickle_payloads(targets: dict, what: str) -> dict:
    """``{key: cloudpickled payload}``, all or nothing: a payload that cannot be pickled
    raises ValueError before anything is sent, so no worker is left with a command."""
    blobs = {}
    for key, payload in targets.items():
        try:
            blobs[key] = cloudpickle.dumps(payload)
        except Exception as exc:
            raise ValueError(f"could not pickle the {what}: {exc}") from None
    return blobs
