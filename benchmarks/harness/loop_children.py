"""The real loops' measurements, one per fresh process: ``python -m harness.loop_children
'<json spec>'`` prints one JSON line (run by :func:`harness.loops.run_loops`; the cases and
the method are in ``harness/loops.py``)."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time

import numpy as np

from .loops import FIXED_SPINS


# ------------------------------------------------------------------ in the child process
def _env_fn(env_id: str):
    if env_id == "pong":
        from .envs import make_pong

        return make_pong
    import functools

    import gymnasium as gym

    return functools.partial(gym.make, env_id)


def _gym_vec(cand: str, fns, **kw):
    if cand == "sync":
        import gymnasium as gym

        return gym.vector.SyncVectorEnv(fns, **kw)
    import fastvec

    return fastvec.AsyncVectorEnv(fns, **_fastvec_kwargs(cand), **kw)


def _fastvec_kwargs(cand: str) -> dict:
    """The ablations: ``*_fixed`` the fixed spins, ``*_torch`` torch's threads left alone."""
    if cand.endswith("_fixed"):
        return dict(FIXED_SPINS)
    if cand.endswith("_torch"):
        return {"torch_threads": None}
    return {}


def _wait_counts(venv):
    """fastvec's ``Engine.wait_counts`` for a fastvec vector env (None for the others)."""
    engine = getattr(venv, "engine", None)
    return engine.wait_counts() if engine is not None and hasattr(engine, "wait_counts") else None


def _waits_per_step(before, after, steps: int):
    """What fastvec's waits did per step between two ``wait_counts``: the parent's naps
    and sleeps, the workers' naps and sleeps (mean over workers); None for others."""
    if before is None or after is None or steps <= 0:
        return None
    n = len(after["workers"])
    return {
        "parent_naps": (after["parent"]["naps"] - before["parent"]["naps"]) / steps,
        "parent_sleeps": (after["parent"]["sleeps"] - before["parent"]["sleeps"]) / steps,
        "worker_naps": sum(a["naps"] - b["naps"] for a, b in zip(after["workers"], before["workers"])) / n / steps,
        "worker_sleeps": sum(a["sleeps"] - b["sleeps"] for a, b in zip(after["workers"], before["workers"]))
        / n
        / steps,
        # a count, not per step: sleeps no doorbell ended (``Engine.wait_counts``); 0 unless something is wrong
        "lost": (
            after["parent"]["lost"]
            - before["parent"]["lost"]
            + sum(a["lost"] - b["lost"] for a, b in zip(after["workers"], before["workers"]))
        ),
    }


def _fixed_work(ms_list):
    """Calibrated single-core work standing in for a caller's compute: ``work(reps)``."""
    x = np.random.default_rng(0).random(2000)

    def work(reps):
        y = x
        for _ in range(reps):
            y = np.sin(y)
        return y

    work(200)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        work(400)
        best = min(best, time.perf_counter() - t)
    per_ms = 400 / (best * 1e3)
    return work, {ms: int(round(ms * per_ms)) for ms in ms_list}


def child_gap(spec: dict) -> dict:
    work, reps = _fixed_work(spec["gaps"])
    env = _gym_vec(spec["cand"], [_env_fn(spec["env"])] * spec["num_envs"])
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        acts = [env.action_space.sample() for _ in range(64)]
        clock = time.perf_counter
        out = {}
        for ms in spec["gaps"]:
            r = reps[ms]
            for k in range(20):
                work(r)
                env.step(acts[k % 64])
            lat = np.empty(spec["steps"])
            counts = _wait_counts(env)
            t0 = clock()
            for k in range(spec["steps"]):
                work(r)
                s = clock()
                env.step(acts[k % 64])
                lat[k] = clock() - s
            out[f"{ms:g}"] = {
                "step_us": float(np.median(lat)) * 1e6,
                "iter_us": (clock() - t0) / spec["steps"] * 1e6,
                "waits": _waits_per_step(counts, _wait_counts(env), spec["steps"]),
            }
        return {"gaps": out}
    finally:
        env.close()


def _policy(env, torch):
    """A policy for the env's spaces: an MLP (64x64, tanh) or the Nature CNN."""
    nn = torch.nn
    obs_shape = env.single_observation_space.shape
    space = env.single_action_space
    out = space.n if hasattr(space, "n") else space.shape[0]
    if len(obs_shape) == 3:
        body = nn.Sequential(
            nn.Conv2d(obs_shape[0], 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512),
            nn.ReLU(),
            nn.Linear(512, out),
        )
    else:
        body = nn.Sequential(
            nn.Linear(int(np.prod(obs_shape)), 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out)
        )
    return body, hasattr(space, "n")


def child_policy(spec: dict) -> dict:
    import torch

    torch.manual_seed(0)
    env = _gym_vec(spec["cand"], [_env_fn(spec["env"])] * spec["num_envs"])
    try:
        net, discrete = _policy(env, torch)
        low = env.single_action_space.low if not discrete else None
        high = env.single_action_space.high if not discrete else None
        obs, _ = env.reset(seed=0)

        def act(obs):
            with torch.no_grad():
                x = torch.as_tensor(np.asarray(obs, dtype=np.float32))
                if x.ndim == 4:
                    x = x / 255.0
                y = net(x)
                if discrete:
                    return torch.distributions.Categorical(logits=y).sample().numpy()
                return np.clip((y + torch.randn_like(y)).numpy(), low, high)

        for _ in range(20):
            obs = env.step(act(obs))[0]
        counts = _wait_counts(env)
        t0 = time.perf_counter()
        for _ in range(spec["steps"]):
            obs = env.step(act(obs))[0]
        wall = time.perf_counter() - t0
        return {
            "sps": spec["steps"] * spec["num_envs"] / wall,
            "torch_threads": torch.get_num_threads(),
            "waits": _waits_per_step(counts, _wait_counts(env), spec["steps"]),
        }
    finally:
        env.close()


def child_sb3(spec: dict) -> dict:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    fns = [_env_fn(spec["env"])] * spec["num_envs"]
    cand = spec["cand"]
    t0 = time.perf_counter()
    if cand == "dummy":
        venv = DummyVecEnv(fns)
    elif cand == "sb3_subproc":
        venv = SubprocVecEnv(fns, start_method="fork")
    else:
        import fastvec

        venv = fastvec.SubprocVecEnv(fns, **_fastvec_kwargs(cand))
    startup = time.perf_counter() - t0
    try:
        model = PPO("MlpPolicy", venv, n_steps=256, batch_size=256, n_epochs=4, seed=0, device="cpu", verbose=0)
        counts = _wait_counts(venv)
        t0 = time.perf_counter()
        model.learn(spec["steps"])
        wall = time.perf_counter() - t0
        waits = _waits_per_step(counts, _wait_counts(venv), spec["steps"] // spec["num_envs"])
    finally:
        venv.close()
    return {
        "wall_s": wall,
        "sps": spec["steps"] / wall,
        "startup_s": startup,
        "torch_threads": torch.get_num_threads(),
        "waits": waits,
    }


def child_cleanrl(spec: dict) -> dict:
    """A PPO loop the way CleanRL's ppo.py writes one (our own code): rollout of 128
    steps into torch buffers, GAE, 4 epochs of 4 minibatches, Adam, clipped losses."""
    import torch

    nn = torch.nn
    torch.manual_seed(0)
    n, T = spec["num_envs"], 128
    envs = _gym_vec(spec["cand"], [_env_fn(spec["env"])] * n)
    try:
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        n_act = envs.single_action_space.n

        def mlp(out, std):
            layers = [nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out)]
            nn.init.orthogonal_(layers[-1].weight, std)
            return nn.Sequential(*layers)

        actor, critic = mlp(n_act, 0.01), mlp(1, 1.0)
        opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=2.5e-4, eps=1e-5)
        obs_b = torch.zeros((T, n, obs_dim))
        act_b = torch.zeros((T, n), dtype=torch.long)
        logp_b, rew_b, done_b, val_b = (torch.zeros((T, n)) for _ in range(4))
        next_obs = torch.as_tensor(envs.reset(seed=0)[0], dtype=torch.float32)
        next_done = torch.zeros(n)
        iters = max(1, spec["steps"] // (T * n))
        counts = _wait_counts(envs)
        t0 = time.perf_counter()
        for _ in range(iters):
            for t in range(T):
                obs_b[t], done_b[t] = next_obs, next_done
                with torch.no_grad():
                    dist = torch.distributions.Categorical(logits=actor(next_obs))
                    a = dist.sample()
                    logp_b[t], val_b[t] = dist.log_prob(a), critic(next_obs).squeeze(-1)
                act_b[t] = a
                o, r, term, trunc, _ = envs.step(a.numpy())
                rew_b[t] = torch.as_tensor(r, dtype=torch.float32)
                next_obs = torch.as_tensor(o, dtype=torch.float32)
                next_done = torch.as_tensor(np.logical_or(term, trunc), dtype=torch.float32)
            with torch.no_grad():
                next_val = critic(next_obs).squeeze(-1)
                adv = torch.zeros((T, n))
                last = torch.zeros(n)
                for t in reversed(range(T)):
                    nonterminal = 1.0 - (next_done if t == T - 1 else done_b[t + 1])
                    nv = next_val if t == T - 1 else val_b[t + 1]
                    delta = rew_b[t] + 0.99 * nv * nonterminal - val_b[t]
                    last = delta + 0.99 * 0.95 * nonterminal * last
                    adv[t] = last
                ret = adv + val_b
            b_obs, b_act, b_logp = obs_b.reshape(-1, obs_dim), act_b.reshape(-1), logp_b.reshape(-1)
            b_adv, b_ret = adv.reshape(-1), ret.reshape(-1)
            size = T * n
            for _ in range(4):
                perm = torch.randperm(size)
                for mb in perm.split(size // 4):
                    dist = torch.distributions.Categorical(logits=actor(b_obs[mb]))
                    ratio = (dist.log_prob(b_act[mb]) - b_logp[mb]).exp()
                    a_mb = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                    pg = torch.max(-a_mb * ratio, -a_mb * ratio.clamp(0.8, 1.2)).mean()
                    v = 0.5 * ((critic(b_obs[mb]).squeeze(-1) - b_ret[mb]) ** 2).mean()
                    loss = pg + 0.5 * v - 0.01 * dist.entropy().mean()
                    opt.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_([*actor.parameters(), *critic.parameters()], 0.5)
                    opt.step()
        wall = time.perf_counter() - t0
        return {
            "sps": iters * T * n / wall,
            "wall_s": wall,
            "torch_threads": torch.get_num_threads(),
            "waits": _waits_per_step(counts, _wait_counts(envs), iters * T),
        }
    finally:
        envs.close()


def child_train(spec: dict) -> dict:
    from fastvec.train import PPOConfig, apply_overrides, env_factory, preset_for, run_training

    env_id = spec["env"]
    cfg = apply_overrides(PPOConfig(), preset_for(env_id))
    cfg.seed = 0
    cfg.total_steps = spec["steps"]
    cfg.stop_at_return = None
    # A hung step is waited out and its stacks printed (``_dump_stacks``), not turned
    # into a worker restart that would only make this run slower.
    cfg.step_timeout = None
    cand = spec["cand"]
    if cand.endswith("_autograd"):  # the ablation: torch's autograd where the numpy learner applies
        cfg.learner = "torch"
        cand = cand[: -len("_autograd")]
    if cand in ("sync", "engine_lockstep"):
        cfg.env_groups = 1  # as ``fastvec train --backend sync`` does with a preset's groups
    t0 = time.perf_counter()
    if cand == "sync":
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        venv = SyncVectorEnv([env_factory(env_id)] * cfg.num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
        try:
            res = run_training(None, cfg, venv=venv, progress=False, tensorboard=False, save=False)
        finally:
            venv.close()
    else:
        if cand == "engine_spin":  # the ablation: learned waits where the trainer sleeps
            res = _train_with_learned_waits(env_id, cfg)
        else:
            res = run_training(env_id, cfg, progress=False, tensorboard=False, save=False)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "sps": res["env_steps"] / wall,
        "times": res["time_breakdown"],
        "env_groups": res["env_groups"],
        "learner": res["learner"],
        "lost_wakeups": res["lost_wakeups"],
    }


def _train_with_learned_waits(env_id: str, cfg) -> dict:
    """``fastvec train``'s run on an engine of the same envs and workers whose trainer
    waits for the step with the engine's learned waits (``main_spin_us=None``), where
    ``run_training`` would have it sleep: ``fastvec.train.train`` on a storage built here."""
    import fastvec
    from fastvec.train import EngineStorage, Monitor, env_factory, train

    engine = fastvec.Engine(
        [env_factory(env_id)] * cfg.num_envs,
        num_workers=cfg.num_workers,
        num_slots=cfg.n_steps + 1,
        autoreset_mode="same_step",
        context=cfg.context,
        spin_us=cfg.spin_us,
        restart_on_error=cfg.restart_on_error,
        step_timeout=cfg.step_timeout,
        main_spin_us=None,
    )
    return train(cfg, EngineStorage(engine), Monitor(None, tensorboard=False), env_id=env_id, progress=False)


CHILDREN = {"gap": child_gap, "policy": child_policy, "sb3": child_sb3, "cleanrl": child_cleanrl, "train": child_train}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(
            "usage: python -m harness.loop_children '<json spec>' (run by benchmarks/bench_loops.py)", file=sys.stderr
        )
        return 2
    spec = json.loads(argv[0])
    # A run past its time is asked for its stacks (``_dump_stacks``) before it is killed.
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    res = CHILDREN[spec["loop"]](spec)
    import fastvec  # which build ran (ab_builds.py checks it is the one asked for)

    res["fastvec_path"] = os.path.dirname(os.path.abspath(fastvec.__file__))
    sys.stdout.flush()
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
