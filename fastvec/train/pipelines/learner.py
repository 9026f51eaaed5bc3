"""The async pipeline's learner process: ``main(fd)``, in a fork of the collector or a
fresh interpreter (``fastvec.train.pipelines.handoff.learner_command``).

It maps the engine's ring (``fastvec.train.pipelines.ring``) and the pipeline's segment
(``fastvec.train.pipelines.handoff``), builds
a ``PPO`` that never acts, and for each rollout handed over on the socket ``FD``
computes the targets, updates and publishes the weights; told to stop, it exits. It
ignores SIGINT (the collector decides when the run stops) and, should the collector
die, writes a checkpoint of its last safe point into the run directory and exits.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from types import SimpleNamespace

import numpy as np
import torch

from ..._core.segment import SegmentPlan, attach_segment
from ..compute.ranks import RankError, join
from ..config.settings import PPOConfig
from ..storage.rollout import Rollout
from .handoff import POLL_S, Handoff, dumps, learner_command, merge_state, published_tensors
from .ring import RingSection


def main(fd: int, forked: bool = False) -> None:
    """Learn on each rollout handed over and publish the weights, until told to stop or
    the collector is gone. ``forked``: a fork of the collector (``LearnerProcess``), which
    keeps to one torch thread and may be told to become a fresh interpreter instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if forked:
        torch.set_num_threads(1)  # the parent's thread pool did not survive the fork
    conn = Connection(fd)
    learner = None
    try:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the collector went before it needed a learner
            return
        if msg[0] == "exec":  # CUDA or more threads: a fresh interpreter on the same socket
            os.set_inheritable(fd, True)
            os.execve(sys.executable, learner_command(fd), msg[1])
        if msg[0] == "stop":  # started early, not needed after all
            return
        spec = msg[1]
        parent = spec["parent"]
        learner = _Learner(spec)  # the collector published the starting weights
        conn.send_bytes(dumps(("ready",)))
        while True:
            msg = _next_message(conn, parent, learner)
            if msg is not None and msg[0] == "stop":
                break
            if msg is not None:
                _, k, r, snapshot, rng = msg
                done = learner.learn(k, r, snapshot, rng)
                try:
                    conn.send_bytes(dumps(("done", r, done)))
                    continue
                except OSError:  # the collector went while this update ran
                    pass
            learner.checkpoint_on_orphan()  # the collector is gone: keep the last safe point
            os._exit(3)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        try:
            because = ("rank",) if isinstance(exc, RankError) else ()  # (another rank's learner is gone)
            conn.send_bytes(dumps(("error", f"the learner failed: {text}", *because)))
        except OSError:
            pass
        _say(f"fastvec learner: {text}" if isinstance(exc, RankError) else f"fastvec learner: {traceback.format_exc()}")
        sys.exit(1)
    finally:
        if learner is not None:
            learner.release()


def _say(text: str) -> None:
    """To stderr, where there is one (a forked learner closed what it inherited besides fd 2)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        try:
            os.write(2, (text + "\n").encode())
        except OSError:
            pass


def _next_message(conn, parent: int, learner):
    t0 = time.perf_counter()
    try:
        while not conn.poll(POLL_S):
            if os.getppid() != parent:
                return None
        return pickle.loads(conn.recv_bytes())
    except (EOFError, ConnectionResetError, OSError):
        return None
    finally:
        learner.t_wait += time.perf_counter() - t0


def _ring_views(ring: dict, spec: dict) -> dict:
    """The storage protocol's arrays over the mapped ring: the engine's own, or a
    PettingZoo env's copies seen as agent rows (as the collector's ``AgentStorage``)."""
    leaves = spec.get("agent_leaves")
    if leaves is None:
        names = ("obs0", "final0", "act0", "rewards", "terminated", "truncated")
        return dict(zip(("obs", "final_obs", "act", "rewards", "terminated", "truncated"), (ring[n] for n in names)))
    from ..storage.agent_rows import agent_views

    n = range(len(leaves))
    obs, final = [ring[f"obs{i}"] for i in n], [ring[f"final{i}"] for i in n]
    return agent_views(leaves, obs, final, ring["act0"], spec["num_envs"])


class _Learner:
    """The learner process's state: a ``PPO`` over the mapped sections (it never acts),
    the weights versions it published, its safe point."""

    def __init__(self, spec: dict):
        from ..algo.ppo import PPO
        from ..compute.torch_state import resolve_device

        cfg = PPOConfig.from_dict(spec["cfg"])
        self.cfg, self.spec = cfg, spec
        self.t_start = time.perf_counter()
        self.t_wait = 0.0
        name, entries = spec["engine"]
        self._engine_map = attach_segment(name)
        ring = SegmentPlan.from_entries(entries).arrays(self._engine_map)
        name, entries = spec["pipeline"]
        self._pipe_map = attach_segment(name)
        arrays = SegmentPlan.from_entries(entries).arrays(self._pipe_map)
        obs_space, act_space = spec["spaces"]
        full = SimpleNamespace(
            kind="fastvec",
            num_envs=spec["num_envs"],
            num_workers=None,
            single_observation_space=obs_space,
            single_action_space=act_space,
            groups=[(0, spec["num_envs"])],
            **_ring_views(ring, spec),
        )
        T = cfg.n_steps
        self.sections = [RingSection(full, k, T) for k in range(cfg.rollout_buffers)]
        self.ranks = join(spec.get("ranks"))  # with several ranks: the group of their learners
        device = resolve_device(spec["device"])
        self.ppo = ppo = PPO(cfg, self.sections[0], device, separate_buffers=spec["separate_buffers"], ranks=self.ranks)
        ppo.policy.load_state_dict(spec["policy"])  # the collector's weights, copied into the flat views
        self.pin = None
        if device.type == "cuda":  # page-locked once: the rollouts' copies to the GPU are asynchronous
            from ..compute.pinned import HostPin

            torch.backends.cudnn.benchmark = True
            held = [full.obs, full.final_obs, full.act, arrays["raw"], arrays["logp"], arrays["values"]]
            self.pin = HostPin(held)
        ppo.load_train_state(spec["state"])
        if cfg.max_policy_lag > 0:  # a stream of its own (lag 0: the collector's, handed over)
            torch.manual_seed(cfg.seed + 0x5EED)
        self.published = published_tensors(ppo.policy, ppo.flat_param)
        self.handoff = Handoff(arrays, len(self.published))
        self.rollouts = [
            Rollout(sec, ppo.policy, T, device, copies=ppo.rollout.copies, shared=self.handoff.section(k))
            for k, sec in enumerate(self.sections)
        ]
        self.history = {ppo.updates: ppo.flat_param.detach().clone()}
        ppo.busy.start()  # the learner's device: CUDA events on a GPU, this process's CPU time on the CPU
        self.cpu_last = time.process_time()
        self.snapshot: dict | None = None

    def learn(self, k: int, r: int, snapshot: dict, rng) -> dict:
        ppo, cfg = self.ppo, self.cfg
        if rng is not None:
            torch.set_rng_state(rng)
        ppo.use_rollout(self.sections[k], self.rollouts[k])
        self.rollouts[k].acted_to_device()
        versions = self.handoff.versions(k).copy()
        lags = np.bincount(ppo.updates - versions)
        ppo.prepare(None if (versions == ppo.updates).all() else (versions, self.history))
        ppo.update()
        cpu = time.process_time()
        ppo.busy.take(cpu - self.cpu_last)
        self.cpu_last = cpu
        self.history[ppo.updates] = ppo.flat_param.detach().clone()
        for v in [v for v in self.history if v < ppo.updates - cfg.max_policy_lag - cfg.rollout_buffers]:
            del self.history[v]
        self.snapshot = snapshot
        self.publish()
        return {
            "summary": ppo.summarize(),
            "lags": lags,
            "updates": ppo.updates,
            "grad_steps": ppo.grad_steps,
            "learn_samples": ppo.learn_samples,
            "t_prep": ppo.t_prep,
            "t_learn": ppo.t_learn,
            "stats": {
                "busy_s": ppo.busy.total_busy_s,
                "wall_s": time.perf_counter() - self.t_start,
                "wait_s": self.t_wait,
            },
        }

    def publish(self) -> None:
        """The safe point after an update: weights, optimiser moments and train state."""
        self.handoff.publish(self.published, self.ppo)

    def checkpoint_on_orphan(self) -> None:
        """The collector died: keep this safe point in the run directory and say so."""
        run_dir, env_id, env_kwargs, mix = self.spec["checkpoint"]
        if not run_dir or self.snapshot is None or not self.ranks.solo:  # (ranks: the periodic one stays)
            return
        from ..algo.checkpoints import save_checkpoint

        ppo = self.ppo
        st = merge_state(ppo.train_state(), self.snapshot)
        ppo.env_steps = st["env_steps"]
        path = save_checkpoint(os.path.join(run_dir, "checkpoint.pt"), ppo, env_id, env_kwargs, train_state=st, mix=mix)
        _say(
            f"fastvec learner: the collector process is gone; the last safe point "
            f"({st['env_steps']} env steps) is in {path}: resume with --resume {run_dir}"
        )

    def release(self) -> None:
        self.ranks.close()
        if self.pin is not None:
            self.pin.release()
        self.ppo.busy.close()
        self.handoff = None  # type: ignore[assignment]  # its views into the segment go before it closes
        self.rollouts = []
        self.sections = []


if __name__ == "__main__":
    main(int(sys.argv[1]))
