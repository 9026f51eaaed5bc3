"""The classic one-Pipe-per-env ``SubprocVecEnv`` (OpenAI baselines / easy-rl), as a peer.

This is the vector env that most PPO seeds copy: ``multiprocessing_env.py`` from
easy-rl and ``baselines/common/vec_env/subproc_vec_env.py`` before ``in_series``. One
process per env, one duplex ``multiprocessing.Pipe`` per process, every step is
``remote.send(("step", action))`` per env followed by ``remote.recv()`` per env (each a
pickled tuple), and the worker resets the env itself when an episode ends.

Kept faithful on purpose: no batching of several envs per process, no shared memory,
no terminal observation in the infos. The only changes are for gymnasium's API:

- the worker unpacks the 5-tuple ``(obs, reward, terminated, truncated, info)`` and
  resets when ``terminated or truncated`` (the observation returned is the reset one,
  like gymnasium's SAME_STEP autoreset);
- ``reset(seed=...)`` forwards seeds (``int``: ``seed + i`` for env ``i``, as gymnasium
  does; or a list) and returns ``(obs, infos)``;
- ``step_wait`` returns ``(obs, rewards, terminated, truncated, infos)``.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle

import numpy as np

__all__ = ["SubprocVecEnv", "CloudpickleWrapper", "worker"]


def worker(remote, parent_remote, env_fn_wrapper, keep_final=False):
    parent_remote.close()
    env = env_fn_wrapper.x()
    try:
        while True:
            cmd, data = remote.recv()
            if cmd == "step":
                ob, reward, terminated, truncated, info = env.step(data)
                if terminated or truncated:
                    if keep_final:  # later baselines and SB3: bootstrap truncations
                        info = dict(info)
                        info["terminal_observation"] = ob
                    ob, _ = env.reset()
                remote.send((ob, reward, terminated, truncated, info))
            elif cmd == "reset":
                ob, info = env.reset(seed=data)
                remote.send((ob, info))
            elif cmd == "close":
                remote.close()
                break
            elif cmd == "get_spaces":
                remote.send((env.observation_space, env.action_space))
            else:
                raise NotImplementedError(cmd)
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        env.close()


class CloudpickleWrapper:
    """Uses cloudpickle to serialize contents (otherwise multiprocessing tries to use pickle)."""

    def __init__(self, x):
        self.x = x

    def __getstate__(self):
        import cloudpickle

        return cloudpickle.dumps(self.x)

    def __setstate__(self, ob):
        self.x = pickle.loads(ob)


class SubprocVecEnv:
    """One process and one Pipe per env (baselines / easy-rl), gymnasium 5-tuple steps.

    Parameters
    ----------
    env_fns : list of callables returning gymnasium envs
    context : str, optional
        multiprocessing start method; default: multiprocessing's default (fork on Linux,
        what the original code used).
    terminal_observation : bool, default False
        Put an ended episode's final observation in ``info["terminal_observation"]`` (as
        later baselines and SB3 do; the seeds' code drops it), so a trainer can bootstrap
        truncated episodes.
    """

    def __init__(self, env_fns, context: str | None = None, terminal_observation: bool = False):
        self.waiting = False
        self.closed = False
        nenvs = len(env_fns)
        self.num_envs = nenvs
        ctx = mp.get_context(context)
        self.remotes, self.work_remotes = zip(*[ctx.Pipe() for _ in range(nenvs)])
        self.ps = [
            ctx.Process(target=worker, args=(work_remote, remote, CloudpickleWrapper(env_fn), terminal_observation))
            for (work_remote, remote, env_fn) in zip(self.work_remotes, self.remotes, env_fns)
        ]
        for p in self.ps:
            p.daemon = True  # if the main process crashes, we should not cause things to hang
            p.start()
        for remote in self.work_remotes:
            remote.close()
        self.remotes[0].send(("get_spaces", None))
        self.observation_space, self.action_space = self.remotes[0].recv()

    def step_async(self, actions):
        for remote, action in zip(self.remotes, actions):
            remote.send(("step", action))
        self.waiting = True

    def step_wait(self):
        results = [remote.recv() for remote in self.remotes]
        self.waiting = False
        obs, rews, terms, truncs, infos = zip(*results)
        return np.stack(obs), np.stack(rews), np.stack(terms), np.stack(truncs), infos

    def step(self, actions):
        self.step_async(actions)
        return self.step_wait()

    def reset(self, seed=None):
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds = [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        for remote, s in zip(self.remotes, seeds):
            remote.send(("reset", s))
        results = [remote.recv() for remote in self.remotes]
        obs, infos = zip(*results)
        return np.stack(obs), infos

    def close(self):
        if self.closed:
            return
        if self.waiting:
            for remote in self.remotes:
                remote.recv()
        for remote in self.remotes:
            try:
                remote.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        for p in self.ps:
            p.join(5.0)
            if p.is_alive():
                p.terminate()
                p.join(1.0)
        self.closed = True

    def __len__(self):
        return self.num_envs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
