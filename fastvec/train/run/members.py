"""Many runs at once: ``train_members``, K members of a population on one engine.

Each member is a ``fastvec.train.run.loop.Run`` of its own (its run directory, monitor,
checkpoints, stops and result), over its rows of the envs; the population
(``fastvec.train.algo.population``) steps every member's envs together and gives each
member its own random numbers. Iteration by iteration every running member passes its
safe point, then the population collects one rollout for all of them, then each member
checks its stops and learns: the phases of a run alone's ``Run.iterate``, in the same
order for each member. A member that is solved, or out of steps, ends there (its result
and final checkpoint written then); the others go on. A stop request or the clock ends
them all at the same safe point; a failure saves each member's last whole state, as a
run alone saves its own.

The population's own result (``members_result``): every member's, and how the members
compare: per group (the members of one setting) the mean, median and IQM of the final
returns with bootstrap intervals, and for a sweep the probability that one setting
beats another (``fastvec.report``).
"""

from __future__ import annotations

import contextlib
import time

from ..algo.population import Population
from ..compute.torch_state import resolve_device
from ..config.members import Member
from ..pipelines.ring import start_where_left
from ..storage.member_rows import MemberEnvs
from .loop import Run

__all__ = ["train_members", "Members"]


def train_members(
    members: list[Member],
    envs: MemberEnvs,
    monitors: list,
    *,
    env_id: str,
    env_kwargs: dict | None = None,
    resumes: list[dict | None] | None = None,
    done: list[bool] | None = None,
    pbt=None,
    stop=None,
    progress: bool = True,
    t_start: float | None = None,
) -> dict:
    """Train ``members`` on ``envs`` (their rows, member k's ``envs.rows[k]``), member k
    logging to ``monitors[k]``; returns ``{"results": each member's result (None for a
    member that was ``done`` before: a resumed population's finished members, whose envs
    only step), "one_by_one": why the members learned one by one (None: at once),
    "acted_at_once": whether they acted in one batched pass}``.
    ``resumes[k]``: member k's checkpoint to continue (None: it starts afresh). ``pbt``:
    a ``fastvec.train.run.pbt.Pbt`` the members train under (None: independently).
    Closes the envs and the monitors."""
    K = len(members)
    resumes = resumes or [None] * K
    done = done or [False] * K
    pop = Members(members, envs, monitors, env_id=env_id, env_kwargs=env_kwargs, resumes=resumes)
    pop.pbt = pbt
    t0 = time.perf_counter() if t_start is None else t_start
    try:
        pop.start(t0, done, progress)
        pop.loop(stop)
    except BaseException as exc:
        pop.fail(exc)
        raise
    finally:
        envs.close()
    return {"results": pop.results, "one_by_one": pop.one_by_one, "acted_at_once": pop.population.acts_at_once}


class Members:
    """The population's runs: ``start``, ``loop`` (until every member has ended), and
    ``fail`` (each running member's emergency checkpoint); ``results[k]`` once member k ends."""

    def __init__(self, members: list[Member], envs: MemberEnvs, monitors: list, *, env_id, env_kwargs, resumes):
        self.members, self.envs, self.monitors = members, envs, monitors
        self.env_id, self.env_kwargs, self.resumes = env_id, env_kwargs, resumes
        self.population = Population(envs)
        self.runs: list[Run | None] = [None] * len(members)
        self.results: list[dict | None] = [None] * len(members)
        self.running: list[int] = []
        self.one_by_one: str | None = None  # why the members learn one by one (None: at once)
        self.pbt = None  # population-based training (fastvec.train.run.pbt.Pbt), or None

    def start(self, t_start: float, done: list[bool], progress: bool) -> None:
        """Each member's run started (its trainer, its seeds given), in turn with its own
        random numbers; then every env reset at once. A member ``done`` gets its seeds and
        a fixed action, nothing more."""
        from ..config.seeding import env_seeds

        pop, envs = self.population, self.envs
        for k, m in enumerate(self.members):
            if done[k]:
                monitor = self.monitors[k]
                monitor.close()
                envs.rows[k].reset(env_seeds(m.cfg.seed, 0, envs.per_member))
                pop.freeze_actions(k, envs.rows[k].single_action_space.sample())
                envs.pause(k)
                continue
            run = Run(
                m.cfg,
                envs.rows[k],
                self.monitors[k],
                device=resolve_device(m.cfg.device),
                envs=(self.env_id, self.env_kwargs, None),
                resume=self.resumes[k],
                save=True,
                t_start=t_start,
                learner=None,
            )
            self.runs[k] = run
            pop.seed(k, m.cfg.seed)  # as fastvec train seeds a run alone
            with pop.as_member(k):
                run.start(self.resumes[k], progress and not self.running)
            pop.ppos[k] = run.ppo
            self.running.append(k)
        self.one_by_one = pop.stack() if self.running else None
        envs.reset_all()

    def loop(self, stop) -> None:
        pop, runs = self.population, self.runs
        while self.running:
            pbt = self.pbt  # (before the safe points: a checkpoint due there holds its event)
            if pbt is not None and pbt.due(min(runs[k].ppo.env_steps for k in self.running)):
                pbt.exploit({k: runs[k] for k in self.running})
            going = []
            for k in self.running:  # (a member that ends here is out of ``going``)
                with pop.as_member(k):
                    ok = runs[k].safe_point(stop)
                going.append(k) if ok else self._end(k)
            if not going:
                break
            pop.collect(going)
            learning = []
            for k in going:
                learning.append(k) if runs[k].collected() else self._end(k)
            pop.learn(learning)
            for k in learning:
                rows = self.envs.rows[k]
                start_where_left(rows, rows, runs[k].ppo.T)  # (what the run alone's LockStep.learn ends with)
                runs[k].learned()
            self.running = learning

    def _end(self, k: int) -> None:
        """Member k's run ends here: its result, final checkpoint and plot."""
        run = self.runs[k]
        self.envs.pause(k)
        with self.population.as_member(k):
            run.end()
            run.release()
            self.results[k] = run.finish()

    def fail(self, exc: BaseException) -> None:
        """The envs failed (or a member did): each running member keeps its last whole
        state, as a run alone does (``Run.emergency_checkpoint``); every monitor closed."""
        for k, run in enumerate(self.runs):
            if run is None or self.results[k] is not None:
                continue
            with contextlib.suppress(Exception), self.population.as_member(k):  # (its RNG state, if it saves now)
                run.emergency_checkpoint(exc)
            with contextlib.suppress(Exception):
                run.release()
            self.monitors[k].close()
