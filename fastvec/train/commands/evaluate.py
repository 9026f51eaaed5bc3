"""``fastvec eval``: run a checkpoint's policy for some episodes, in-process."""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from ..algo.checkpoints import check_spaces, load_checkpoint, policy_from_checkpoint
from .filming import Reel, check_video, filmed_factory, headless_gl

__all__ = ["evaluate", "Evaluation"]


def evaluate(
    checkpoint,
    episodes: int = 10,
    seed: int = 0,
    deterministic: bool = True,
    env_id: str | None = None,
    num_envs: int | None = None,
    *,
    video_dir: str | None = None,
    video_prefix: str | None = None,
    video_settings: dict | None = None,
) -> dict:
    """Run ``episodes`` episodes of a checkpoint's policy (in-process, vectorised).

    Episodes are spread evenly over the envs (each env runs its share, as SB3's
    ``evaluate_policy``), so short episodes are not over-represented. Beside them, the
    training return the checkpoint was written at (the mean of its last
    ``return_window`` training episodes, stochastic actions; None where it kept none):
    published PPO figures are of either kind, and the two differ.

    A run on a mix of envs (``fastvec.train.config.mix``) is evaluated on envs drawn evenly from
    its groups (at least one per group), each group's mean return reported beside.
    A run on a PettingZoo env is evaluated on copies of it in ``fastvec.AgentVectorEnv``
    (``num_envs`` copies, one worker): an episode is one agent's. A run with action masks
    (its config's ``action_mask``) acts among the actions each step's mask allows, read
    from the same source as in training (``fastvec.action_masks``).

    ``video_dir``: film every episode counted into an MP4 file there
    (``episode-003-return-212.5-len-500.mp4``; ``video_prefix`` in place of
    ``episode-003``), listed in its ``videos.json`` and in the result's ``videos``
    (``fastvec.train.commands.filming``); the episodes and returns are the same as without.
    ``video_settings``: the filmed envs' own settings besides the run's (a frame's
    ``width`` and ``height``, a camera), which must not change what the env does.
    """
    ckpt = load_checkpoint(checkpoint) if isinstance(checkpoint, str) else checkpoint
    run = Evaluation(ckpt, episodes, env_id, num_envs, video_dir=video_dir, video_settings=video_settings)
    try:
        return run.play(ckpt, seed, deterministic, video_prefix=video_prefix)
    finally:
        run.close()


class Evaluation:
    """``evaluate``'s envs, made once for a checkpoint's env, and ``play``: its
    episodes for that checkpoint or a later one of the same run (the recorder of
    ``fastvec train --video-every`` films each video on the same env and renderer)."""

    def __init__(self, ckpt: dict, episodes: int, env_id=None, num_envs=None, *, video_dir=None, video_settings=None):
        self.env_id = _env_of(ckpt, env_id, episodes)
        self.episodes, self.video_dir = episodes, video_dir
        _check_filming(ckpt, self.env_id, video_dir, video_settings)
        self.venv, self.group = _eval_envs(ckpt, self.env_id, episodes, num_envs, (video_dir, video_settings))

    def play(self, ckpt: dict, seed: int = 0, deterministic: bool = True, *, video_prefix=None) -> dict:
        """``episodes`` episodes of ``ckpt``'s policy, reset with ``seed``: ``evaluate``'s result."""
        venv, reel = self.venv, None
        if self.video_dir is not None:
            reel = Reel(venv, self.video_dir, video_prefix, seed=seed, env_steps=ckpt.get("env_steps"))
        try:
            obs_space = venv.single_observation_space
            check_spaces(ckpt, obs_space[0] if _masked(ckpt) else obs_space, venv.single_action_space, self.env_id)
            torch.set_num_threads(1)
            pol = policy_from_checkpoint(ckpt)
            played = _episodes(venv, pol, self.group, self.episodes, seed, deterministic, reel=reel)
        finally:
            if reel is not None:
                reel.close()
        out = _summary(ckpt, self.env_id, played, deterministic, seed)
        if reel is not None:
            out["videos"] = [{**e, "file": os.path.join(self.video_dir, e["file"])} for e in reel.entries]
        return out

    def close(self) -> None:
        self.venv.close()


def _summary(ckpt: dict, env_id: str, played, deterministic: bool, seed: int) -> dict:
    """The result of the episodes ``played`` (returns, lengths, groups, seconds)."""
    returns, lengths, groups, wall = played
    out = {
        "env_id": env_id,
        "episodes": len(returns),
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "min_return": float(np.min(returns)),
        "max_return": float(np.max(returns)),
        "mean_length": float(np.mean(lengths)),
        "deterministic": deterministic,
        "seed": seed,
        "training_mean_return": _training_return(ckpt),
        "training_env_steps": ckpt.get("env_steps"),
        "wall_seconds": round(wall, 3),
    }
    mix = ckpt.get("mix")
    if mix:
        rets, grp = np.array(returns), np.array(groups)
        out["groups"] = [
            {
                "env_id": g["env_id"],
                "env_kwargs": g["env_kwargs"],
                "episodes": int((grp == k).sum()),
                "mean_return": float(rets[grp == k].mean()) if (grp == k).any() else None,
            }
            for k, g in enumerate(mix)
        ]
    return out


def _check_filming(ckpt: dict, env_id: str, video_dir: str | None, settings: dict | None) -> None:
    """``check_video`` where the episodes are filmed (ConfigError, one line)."""
    if video_dir is not None:
        headless_gl()
        check_video(env_id, ckpt.get("env_kwargs"), video_dir, mix=ckpt.get("mix"), settings=settings)
    elif settings:
        raise ValueError("video_settings are for the filmed envs: give video_dir too")


def _env_of(ckpt: dict, env_id: str | None, episodes: int) -> str:
    """The env id to evaluate on (the checkpoint's; one given must agree); ValueError on
    bad input: an env of your own whose module does not import here, too."""
    from ..config.presets import check_env

    ck_env = ckpt.get("env_id")
    if env_id is not None and ck_env is not None and env_id != ck_env:
        raise ValueError(f"checkpoint was trained on {ck_env}, not {env_id}")
    env_id = env_id or ck_env
    if env_id is None:
        raise ValueError("the checkpoint does not name its env; pass env_id")
    for g in ckpt.get("mix") or [{"env_id": env_id, "env_kwargs": ckpt.get("env_kwargs")}]:
        check_env(g["env_id"], g["env_kwargs"])
    if episodes < 1:
        raise ValueError(f"episodes must be a positive integer, got {episodes}")
    return env_id


def _envs(ckpt: dict, env_id: str, episodes: int, num_envs: int | None, video=(None, None)):
    """The eval envs' factories and each one's group (a mix's envs drawn evenly from its
    groups, at least one per group); with ``video = (folder, settings)``, filmed envs
    (not of a mix)."""
    from ..config.mix import group_of, mix_factories
    from ..config.presets import env_factory

    mix = ckpt.get("mix")
    if mix:
        fns = mix_factories(mix)
        n = min(episodes, num_envs or max(8, len(mix)))
        picks = [k * len(fns) // n for k in range(n)]
        return [fns[i] for i in picks], group_of(mix)[picks]
    n = min(episodes, num_envs or 8)
    kwargs = ckpt.get("env_kwargs")
    fn = env_factory(env_id, kwargs) if video[0] is None else filmed_factory(env_id, kwargs, *video)
    return [fn] * n, np.zeros(n, np.int64)


def _masked(ckpt: dict) -> bool:
    return (ckpt.get("config") or {}).get("action_mask", "none") != "none"


def _eval_envs(ckpt: dict, env_id: str, episodes: int, num_envs: int | None, video=(None, None)):
    """The vector env to evaluate on (in this process; a PettingZoo env's copies in a
    worker) and each env's group; with ``video = (folder, settings)``, its envs filmed."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from ...env_ids import is_pettingzoo

    if is_pettingzoo(env_id):
        return _agent_envs(ckpt, env_id, episodes, num_envs)
    from ...action_masks import check_action_mask, masked_factory

    fns, group = _envs(ckpt, env_id, episodes, num_envs, video)
    if _masked(ckpt):  # the source training read (checked on one env first)
        source = check_action_mask(fns[0], ckpt["config"]["action_mask"])
        fns = [masked_factory(fn, source) for fn in fns]
    mode = "different" if ckpt.get("mix") else "same"
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP, observation_mode=mode), group


def _agent_envs(ckpt: dict, env_id: str, episodes: int, num_envs: int | None):
    """Copies of a PettingZoo env, enough rows for ``episodes`` agent episodes (at most
    ``num_envs`` copies, default 8), in one worker process."""
    import functools

    from ...doors.gymnasium_agents import AgentVectorEnv
    from ...env_ids import make_parallel_env

    fn = functools.partial(make_parallel_env, env_id, dict(ckpt.get("env_kwargs") or {}))
    agents = len(ckpt.get("agents") or ()) or 1  # rows per copy
    n = max(1, min(-(-episodes // agents), num_envs or 8))
    venv = AgentVectorEnv([fn] * n, autoreset_mode="same_step", num_workers=1)
    return venv, np.zeros(venv.num_envs, np.int64)


def _episodes(venv, pol, group, episodes: int, seed: int, deterministic: bool, *, reel=None):
    """``episodes`` episodes spread evenly over the envs: their returns, lengths, groups,
    and the seconds they took (from the reset on); ``reel``: each ended episode's video
    kept where it counts, dropped where not."""
    import gymnasium as gym

    n = venv.num_envs
    targets = np.array([(episodes + i) // n for i in range(n)])
    counts = np.zeros(n, np.int64)
    ep_ret, ep_len = np.zeros(n), np.zeros(n, np.int64)
    returns, lengths, groups = [], [], []
    obs, _ = venv.reset(seed=seed)
    state = torch.zeros(n, pol.state_size) if pol.recurrent else None  # a recurrent policy's memory
    t0 = time.perf_counter()
    while (counts < targets).any():
        obs, mask = obs if pol.masked else (obs, None)  # (a masked env's observation is (obs, mask))
        act = pol.predict(obs, deterministic=deterministic, state=state, mask=mask)
        if isinstance(venv.single_action_space, gym.spaces.Box):
            act = act.astype(venv.single_action_space.dtype)
        acting = getattr(venv, "active", True)  # (agents: the rows whose action counts)
        obs, r, term, trunc, _ = venv.step(act)
        ep_ret += r
        ep_len += acting
        if state is not None:  # (agents: a row that did not act starts afresh when its copy resets)
            state[torch.from_numpy((term | trunc) | ~np.asarray(acting, bool))] = 0.0
        for i in np.flatnonzero(term | trunc):
            if reel is not None:
                reel.ended(i, float(ep_ret[i]), int(ep_len[i]), counted=bool(counts[i] < targets[i]))
            if counts[i] < targets[i]:
                returns.append(float(ep_ret[i]))
                lengths.append(int(ep_len[i]))
                groups.append(int(group[i]))
                counts[i] += 1
            ep_ret[i], ep_len[i] = 0.0, 0
    return returns, lengths, groups, time.perf_counter() - t0


def _training_return(ckpt: dict) -> float | None:
    window = ((ckpt.get("train_state") or {}).get("tracker") or {}).get("window")
    return float(np.mean(window)) if window else None
