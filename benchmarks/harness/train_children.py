"""The measurements of ``bench_train.py``, each run in a fresh process
(``bench_train.py --_child <job>``): SB3's PPO, fastvec's trainer on a chosen vector
env, and Pong's training loop against the engine's random-action steps/s.

Every child warms torch up before its clock starts (``_warm_torch``), so neither
candidate pays for torch's first-use imports inside its measured time.
"""

from __future__ import annotations

import collections
import time

import numpy as np
from peers.baselines_subproc import SubprocVecEnv as PipeSubprocVecEnv


def _warm_torch():
    import torch

    torch.set_num_threads(1)
    p = torch.nn.Parameter(torch.zeros(4))
    (p * 2).sum().backward()
    torch.optim.Adam([p]).step()  # imports torch._dynamo (seconds)


# =============================================================================== SB3
def _sb3_kwargs(hp: dict) -> tuple[int, dict]:
    """(n_envs, PPO keyword arguments) from one of ``bench_train``'s SB3 hyperparameter
    dicts; ``("lin", x)`` stands for a schedule falling linearly from x to 0."""

    def sched(v):
        if isinstance(v, (tuple, list)) and v[0] == "lin":
            return lambda frac, x=v[1]: frac * x
        return v

    hp = dict(hp)
    n_envs = hp.pop("n_envs")
    kw = dict(n_steps=hp.pop("n_steps"), batch_size=hp.pop("batch_size"), n_epochs=hp.pop("n_epochs"))
    if "lr" in hp:
        kw["learning_rate"] = sched(hp.pop("lr"))
    if "clip_range" in hp:
        kw["clip_range"] = sched(hp.pop("clip_range"))
    kw.update(hp)
    return n_envs, kw


def child_sb3(env_id: str, seed: int, hp: dict, threshold: float, max_steps: int) -> dict:
    """SB3's PPO until the mean return of the last 20 episodes reaches ``threshold``."""
    _warm_torch()
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    n_envs, kw = _sb3_kwargs(hp)
    stop = _stop_at(threshold)
    t0 = time.perf_counter()
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kw)
    model.learn(max_steps, callback=stop)
    wall = time.perf_counter() - t0
    env.close()
    return _sb3_result(model, stop, wall)


def child_sb3_recurrent(env_id: str, seed: int, hp: dict, threshold: float, max_steps: int) -> dict:
    """sb3-contrib's RecurrentPPO (``MlpLstmPolicy`` as RL Zoo configures it for
    CartPoleNoVel-v1: an LSTM of 64 units for the actor and one for the critic, then a
    64-unit ReLU layer each, observations normalised by ``VecNormalize``) with the
    hyperparameters ``hp`` until the mean return of the last 20 episodes reaches
    ``threshold``; its linear schedules over ``max_steps``."""
    _warm_torch()
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    import fastvec.train  # noqa: F401  (registers CartPoleNoVel-v1, RL Zoo's definition)

    n_envs, kw = _sb3_kwargs(hp)
    policy_kwargs = dict(
        ortho_init=False,
        activation_fn=torch.nn.ReLU,
        lstm_hidden_size=64,
        enable_critic_lstm=True,
        net_arch=dict(pi=[64], vf=[64]),
    )
    stop = _stop_at(threshold)
    t0 = time.perf_counter()
    env = VecNormalize(make_vec_env(env_id, n_envs=n_envs, seed=seed), norm_obs=True, norm_reward=False)
    model = RecurrentPPO("MlpLstmPolicy", env, seed=seed, device="cpu", verbose=0, policy_kwargs=policy_kwargs, **kw)
    model.learn(max_steps, callback=stop)
    wall = time.perf_counter() - t0
    env.close()
    return _sb3_result(model, stop, wall)


def _sb3_result(model, stop, wall: float) -> dict:
    import torch

    return {
        "solved": stop.solved,
        "env_steps": int(model.num_timesteps),
        "wall_seconds": wall,
        "sps": model.num_timesteps / wall,
        "final_mean_return": float(np.mean(stop.rets)) if stop.rets else None,
        "threads": torch.get_num_threads(),
    }


def _stop_at(threshold: float):
    """An SB3 callback that stops once the mean return of the last 20 episodes reaches
    ``threshold`` (``solved``; ``rets``: those returns)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Stop(BaseCallback):
        def __init__(self):
            super().__init__()
            self.rets = collections.deque(maxlen=20)
            self.solved = False

        def _on_step(self):
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    self.rets.append(ep["r"])
            if len(self.rets) == 20 and np.mean(self.rets) >= threshold:
                self.solved = True
                return False
            return True

    return Stop()


# =============================================================================== fastvec's trainer
def child_fastvec(
    env_id: str,
    seed: int,
    overrides: list,
    threshold: float | None,
    venv_kind: str = "fastvec",
    total_steps: int | None = None,
    zoo: bool = False,
) -> dict:
    """``fastvec train`` on the engine (``venv_kind="fastvec"``) or on another vector env
    (``"sync"``: gymnasium's SyncVectorEnv, ``"subproc"``: one Pipe per env)."""
    _warm_torch()
    from fastvec.train import PPOConfig, apply_overrides, env_factory, preset_for
    from fastvec.train import run_training as train

    cfg = apply_overrides(PPOConfig(), preset_for(env_id, zoo=zoo))
    cfg.seed = seed
    if threshold is not None:
        cfg.stop_at_return = threshold
    if total_steps is not None:
        cfg.total_steps = total_steps
    apply_overrides(cfg, overrides)
    if venv_kind == "fastvec":
        return train(env_id, cfg, progress=False, tensorboard=False)
    # Other transports: the clock must include their start-up too.
    t0 = time.perf_counter()
    fns = [env_factory(env_id)] * cfg.num_envs
    if venv_kind == "sync":
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        venv = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    elif venv_kind == "subproc":
        venv = PipeSubprocVecEnv(fns, context="fork", terminal_observation=True)
    else:
        raise ValueError(venv_kind)
    startup = time.perf_counter() - t0
    try:
        res = train(None, cfg, venv=venv, progress=False, tensorboard=False)
    finally:
        venv.close()
    res["wall_seconds"] = res["wall_seconds"] + startup
    res["sps"] = res["env_steps"] / res["wall_seconds"]
    res["venv_startup_seconds"] = startup
    return res


# =============================================================================== Pong
def _pong_random_sps(fns: list, workers: int, T: int, steps: int) -> float:
    """Random actions through the engine, with the trainer's slot layout (T + 1 slots)."""
    from fastvec.engine import IN_SLOT, Engine

    num_envs = len(fns)
    with Engine(fns, num_workers=workers, num_slots=T + 1, context="fork") as eng:
        eng.reset(0, {i: {"seed": i} for i in range(num_envs)})
        rng = np.random.default_rng(0)
        n_act = eng.single_action_space.n
        acts = rng.integers(0, n_act, size=(T + 1, num_envs))
        a = eng.act_bufs[0]
        for t in range(20):
            a[t % T + 1] = acts[t % T + 1]
            eng.step_async(IN_SLOT, t % T + 1)
            eng.step_wait()
        t0 = time.perf_counter()
        n = 0
        while n < steps:
            for t in range(T):
                a[t + 1] = acts[t + 1]
                eng.step_async(IN_SLOT, t + 1)
                eng.step_wait()
            n += T * num_envs
        return n / (time.perf_counter() - t0)


def _pong_train(env_id: str, cfg, train_rollouts: int, out: dict) -> None:
    """``fastvec train``'s loop for ``train_rollouts`` rollouts (``run_training``, no files):
    its steps/s from the end of start-up (the first rollout's warm-up included), and
    collection's alone, into ``out``."""
    from fastvec.train import run_training

    cfg.total_steps = train_rollouts * cfg.n_steps * cfg.num_envs
    cfg.stop_at_return = None
    res = run_training(env_id, cfg, progress=False, tensorboard=False, save=False)
    tb = res["time_breakdown"]
    out["torch_threads"] = [cfg.torch_threads, cfg.learn_threads]  # as set (None: the trainer's default)
    out["device"] = res["device"]
    out["train_sps"] = res["env_steps"] / (res["wall_seconds"] - res["startup_seconds"])
    out["collect_sps"] = res["env_steps"] / (tb["act"] + tb["env"])
    out["time_breakdown"] = tb


def child_pong(num_envs: int, num_workers: int | None, steps: int, train_rollouts: int, overrides: list) -> dict:
    """Engine random-action steps/s vs the PPO loop's steps/s on the same envs/workers."""
    _warm_torch()
    from fastvec.options import available_cores
    from fastvec.train import PPOConfig, apply_overrides, env_factory, preset_for

    env_id = "ALE/Pong-v5"
    cfg = apply_overrides(PPOConfig(), preset_for(env_id))
    cfg.num_envs = num_envs
    cfg.num_workers = num_workers
    apply_overrides(cfg, overrides)
    workers = cfg.num_workers = cfg.num_workers or min(num_envs, available_cores())
    fns = [env_factory(env_id)] * num_envs
    out = {"num_envs": num_envs, "num_workers": workers, "torch_threads": None}
    out["random_sps"] = _pong_random_sps(fns, workers, cfg.n_steps, steps)
    _pong_train(env_id, cfg, train_rollouts, out)
    out["ratio_train_vs_random"] = out["train_sps"] / out["random_sps"]
    out["ratio_collect_vs_random"] = out["collect_sps"] / out["random_sps"]
    return out


CHILDREN = {"sb3": child_sb3, "sb3_recurrent": child_sb3_recurrent, "fastvec": child_fastvec, "pong": child_pong}
