"""Population-based training (Jaderberg et al. 2017): ``fastvec train --seeds K --pbt``.

Every ``every`` env steps (each member's) the members still running are ranked by the
mean return of their last episodes; each member of the bottom quarter takes the weights,
Adam state, learning-rate schedule, normaliser statistics and settings of a member of the
top quarter drawn at random (``fastvec.train.algo.population.copy_member``: *exploit*),
then multiplies each of its ``PBT_KEYS`` settings by 0.8 or 1.2 within their bounds
(``fastvec.train.config.members.perturbed``: *explore*). A member keeps its own envs,
episodes in progress and counters; its learning curve goes on in its own directory.

The lineage is ``pbt.jsonl`` in the population's directory, one row per event: the env
steps, each member's mean return, who copied whom (the source's settings, the member's
before, and after its perturbation), and
the state of the generator the draws come from (``numpy.random.default_rng`` of the
population's seed). Each member's checkpoint holds its settings; a resume keeps the rows
up to the steps its members resume from and draws on from the last one's generator, so a
resumed population continues its lineage as the killed one would have.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..algo.population import copy_member
from ..config.members import PBT_KEYS, perturbed

__all__ = ["Pbt", "LINEAGE"]

LINEAGE = "pbt.jsonl"


class Pbt:
    """The population's PBT: ``due(env_steps)``, then ``exploit(runs)`` (member index ->
    its ``Run``); ``labels[k]`` names member k in the lineage."""

    def __init__(self, run_dir: str, every: int, seed: int, labels: list[str], resumed_steps: int | None = None):
        if every < 1:
            raise ValueError(f"pbt_every must be a positive number of env steps, got {every}")
        self.path, self.every, self.labels = os.path.join(run_dir, LINEAGE), int(every), labels
        self.rng = np.random.default_rng(seed)
        rows = self._kept_rows(resumed_steps)
        self.next = self.every
        if rows:
            self.rng.bit_generator.state = rows[-1]["rng_after"]
            self.next = rows[-1]["env_steps"] + self.every
        with open(self.path, "w") as f:  # (the rows past a resume's steps are not its history)
            f.writelines(json.dumps(r) + "\n" for r in rows)

    def _kept_rows(self, resumed_steps: int | None) -> list[dict]:
        if resumed_steps is None or not os.path.isfile(self.path):
            return []
        rows = []
        with open(self.path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill
                if row["env_steps"] <= resumed_steps:
                    rows.append(row)
        return rows

    def due(self, env_steps: int) -> bool:
        return env_steps >= self.next

    def exploit(self, runs: dict) -> dict | None:
        """The bottom quarter of ``runs`` copy from the top quarter and perturb; the
        lineage row written (None, and no event, with fewer than 4 members running)."""
        steps = min(run.ppo.env_steps for run in runs.values())
        while self.next <= steps:
            self.next += self.every
        if len(runs) < 4:
            return None
        means = {k: run.ppo.tracker.mean() for k, run in runs.items()}
        ranked = sorted(runs, key=lambda k: -np.inf if means[k] is None else means[k])
        q = len(ranked) // 4
        events = []
        for k in ranked[:q]:
            src = ranked[len(ranked) - q + int(self.rng.integers(q))]
            dst, before = runs[k].ppo, {key: getattr(runs[k].ppo.cfg, key) for key in PBT_KEYS}
            source = {key: getattr(runs[src].ppo.cfg, key) for key in PBT_KEYS}
            copy_member(runs[src].ppo, dst, PBT_KEYS)
            after = perturbed({key: getattr(dst.cfg, key) for key in PBT_KEYS}, self.rng)
            for key, value in after.items():
                setattr(dst.cfg, key, value)
            dst.updater.retune()
            events.append(
                {"member": self.labels[k], "from": self.labels[src], "source": source, "before": before, "after": after}
            )
        row = {
            "env_steps": steps,
            "returns": {self.labels[k]: means[k] for k in ranked},
            "events": events,
            "rng_after": self.rng.bit_generator.state,
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=int) + "\n")
        return row
