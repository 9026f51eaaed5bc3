"""Real loops: fastvec where users train, against the serial vector env in the same run.

Back-to-back random steps (``vecenv_bench``) show the engine's ceiling; nobody trains
like that. Each loop here runs what a user runs, with the policy's (or a stand-in's)
compute between two steps, at torch's default thread count:

- ``gap``: the step time after the caller computed for 0-4 ms (fixed work, calibrated
  once per process on an idle core; the whole iteration is timed too, so a candidate
  that steals the caller's core shows it);
- ``policy``: a torch policy between steps (an MLP for HalfCheetah, the Nature CNN for
  Pong), env steps/s of the whole loop;
- ``sb3``: Stable-Baselines3 PPO end to end (``model.learn``) on DummyVecEnv, SB3's
  SubprocVecEnv and ``fastvec.SubprocVecEnv``;
- ``cleanrl``: a CleanRL-style PPO script (gymnasium vector env, torch) on
  SyncVectorEnv and ``fastvec.AsyncVectorEnv``;
- ``train``: ``fastvec train`` on its Sync backend (gymnasium's SyncVectorEnv) and on
  its engine.

Every measurement runs in a fresh process (``python -m fastvec.bench.loops JSON``),
candidates interleaved over rounds in a rotating order, with the same seeds and the
same work; the report gives medians with ranges and each candidate's ratio to the
serial baseline of the same round. Two ablations show what each default buys:
``*_fixed`` is fastvec with the fixed spins that were the defaults before waits learned
the loop (``spin_us=200, main_spin_us=20``), ``*_torch`` fastvec with torch's threads
left alone (``torch_threads=None``; see ``fastvec.doors.threads``); for ``train``,
``engine_spin`` is the trainer spinning through its workers' step where it would sleep
(``fastvec.train.cli.main_spin_for``), ``engine_lockstep`` Pong without its preset's
batch groups, ``*_autograd`` the trainer with torch's autograd
where its numpy learner applies (``PPOConfig.learner``; the ratios stay against the
default Sync run). For fastvec's candidates (not ``train``, whose
engine is inside the trainer) the report also counts what its waits did per step
(``Engine.wait_counts``): how often the parent slept until a worker rang, and how often
a worker napped towards its forecast or slept until the parent rang.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

FIXED_SPINS = {"spin_us": 200.0, "main_spin_us": 20.0}
GAPS_MS = (0.0, 0.1, 0.4, 1.0, 4.0)

# (loop, case) -> what to run; ``base`` is the serial baseline the ratios are against.
CASES = {
    "gap": [
        dict(case="HalfCheetah-v5 x8", env="HalfCheetah-v5", num_envs=8, gaps=GAPS_MS, steps=300,
             cands=("sync", "fastvec", "fastvec_fixed")),
        dict(case="Pong x8", env="pong", num_envs=8, gaps=(0.0, 2.0), steps=150,
             cands=("sync", "fastvec", "fastvec_fixed")),
    ],
    "policy": [
        dict(case="HalfCheetah-v5 x8, MLP 64x64", env="HalfCheetah-v5", num_envs=8, steps=600,
             cands=("sync", "fastvec", "fastvec_fixed", "fastvec_torch")),
        dict(case="Pong x8, Nature CNN", env="pong", num_envs=8, steps=150,
             cands=("sync", "fastvec", "fastvec_fixed", "fastvec_torch")),
    ],
    "sb3": [
        dict(case="SB3 PPO HalfCheetah-v5 x16", env="HalfCheetah-v5", num_envs=16, steps=16384,
             cands=("dummy", "sb3_subproc", "fastvec_sb3", "fastvec_sb3_fixed", "fastvec_sb3_torch")),
        dict(case="SB3 PPO HalfCheetah-v5 x8", env="HalfCheetah-v5", num_envs=8, steps=16384,
             cands=("dummy", "sb3_subproc", "fastvec_sb3", "fastvec_sb3_fixed", "fastvec_sb3_torch")),
    ],
    "cleanrl": [
        dict(case="CleanRL-style PPO Acrobot-v1 x8", env="Acrobot-v1", num_envs=8, steps=16384,
             cands=("sync", "fastvec", "fastvec_fixed", "fastvec_torch")),
        dict(case="CleanRL-style PPO CartPole-v1 x8", env="CartPole-v1", num_envs=8, steps=16384,
             cands=("sync", "fastvec", "fastvec_fixed", "fastvec_torch")),
    ],
    "train": [
        dict(case="fastvec train CartPole-v1", env="CartPole-v1", steps=50_000, cands=("sync", "engine")),
        dict(case="fastvec train InvertedPendulum-v5", env="InvertedPendulum-v5", steps=50_000,
             cands=("sync", "engine", "engine_spin")),
        dict(case="fastvec train HalfCheetah-v5 (100k steps)", env="HalfCheetah-v5", steps=102_400,
             cands=("sync", "engine", "engine_spin", "sync_autograd", "engine_autograd")),
        dict(case="fastvec train Acrobot-v1", env="Acrobot-v1", steps=65_536, cands=("sync", "engine")),
        dict(case="fastvec train Pong (16k steps)", env="ALE/Pong-v5", steps=16_384,
             cands=("sync", "engine", "engine_lockstep")),
    ],
}
LOOPS = tuple(CASES)
BASELINE = {"gap": "sync", "policy": "sync", "sb3": "dummy", "cleanrl": "sync", "train": "sync"}
LABELS = {
    "sync": "gymnasium SyncVectorEnv", "fastvec": "fastvec.AsyncVectorEnv",
    "fastvec_fixed": "fastvec.AsyncVectorEnv, fixed spins 200/20 us",
    "dummy": "SB3 DummyVecEnv", "sb3_subproc": "SB3 SubprocVecEnv", "fastvec_sb3": "fastvec.SubprocVecEnv",
    "fastvec_sb3_fixed": "fastvec.SubprocVecEnv, fixed spins 200/20 us", "engine": "fastvec engine",
    "engine_spin": "fastvec engine, spinning through the step",
    "engine_lockstep": "fastvec engine, lock-step (env_groups=1)",
    "sync_autograd": "gymnasium SyncVectorEnv, autograd learner", "engine_autograd": "fastvec engine, autograd learner",
    "fastvec_torch": "fastvec.AsyncVectorEnv, torch_threads=None",
    "fastvec_sb3_torch": "fastvec.SubprocVecEnv, torch_threads=None",
}


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
        "worker_sleeps": sum(a["sleeps"] - b["sleeps"] for a, b in zip(after["workers"], before["workers"])) / n
        / steps,
        # a count, not per step: sleeps no doorbell ended (``Engine.wait_counts``); 0 unless something is wrong
        "lost": (after["parent"]["lost"] - before["parent"]["lost"]
                 + sum(a["lost"] - b["lost"] for a, b in zip(after["workers"], before["workers"]))),
    }


def _lost_wakeups(res: dict) -> int:
    """The sleeps of a child's run that no doorbell ended (its waits, or the trainer's)."""
    waits = [res.get("waits")] + [g.get("waits") for g in (res.get("gaps") or {}).values()]
    return int(res.get("lost_wakeups") or 0) + sum(int(w.get("lost", 0)) for w in waits if w)


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
            out[f"{ms:g}"] = {"step_us": float(np.median(lat)) * 1e6,
                              "iter_us": (clock() - t0) / spec["steps"] * 1e6,
                              "waits": _waits_per_step(counts, _wait_counts(env), spec["steps"])}
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
            nn.Conv2d(obs_shape[0], 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, out))
    else:
        body = nn.Sequential(nn.Linear(int(np.prod(obs_shape)), 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                             nn.Linear(64, out))
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
        return {"sps": spec["steps"] * spec["num_envs"] / wall, "torch_threads": torch.get_num_threads(),
                "waits": _waits_per_step(counts, _wait_counts(env), spec["steps"])}
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
    return {"wall_s": wall, "sps": spec["steps"] / wall, "startup_s": startup, "torch_threads": torch.get_num_threads(),
            "waits": waits}


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
        return {"sps": iters * T * n / wall, "wall_s": wall, "torch_threads": torch.get_num_threads(),
                "waits": _waits_per_step(counts, _wait_counts(envs), iters * T)}
    finally:
        envs.close()


def child_train(spec: dict) -> dict:
    from ..train import PPOConfig, apply_overrides
    from ..train.cli import run_training
    from ..train.presets import env_factory, preset_for

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
            from ..train import cli

            cli.main_spin_for = lambda cfg, workers, cores: cfg.main_spin_us
        res = run_training(env_id, cfg, progress=False, tensorboard=False, save=False)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "sps": res["env_steps"] / wall, "times": res["time_breakdown"],
            "env_groups": res["env_groups"], "learner": res["learner"], "lost_wakeups": res["lost_wakeups"]}


CHILDREN = {"gap": child_gap, "policy": child_policy, "sb3": child_sb3, "cleanrl": child_cleanrl,
            "train": child_train}


# ------------------------------------------------------------------ in the parent
def _cpu_ticks():
    """(steal, total) ticks of all CPUs since boot, from Linux's /proc/stat; None elsewhere.
    Steal is the time the hypervisor ran other guests while this VM wanted the CPU: a
    multi-process candidate loses more to it than a serial one, so each run records it."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks[:8])


def _run_child(spec: dict, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "fastvec.bench.loops", json.dumps(spec)]
    t0 = _cpu_ticks()
    try:
        # The child imports the fastvec this process runs: its folder first on the path,
        # and an empty cwd (`python -m` puts the cwd first, and an unbuilt source checkout
        # there would shadow it).
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
        with tempfile.TemporaryDirectory(prefix="fastvec-loop-") as cwd:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True, cwd=cwd, env=env)
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                pids = _dump_stacks(proc.pid)
                # The child alone: its workers exit when it is gone, and its resource
                # tracker then frees the segment it left.
                proc.kill()
                proc.communicate()
                return {"error": f"timed out after {timeout:g} s (Python stacks of processes {pids} "
                                 f"in the run's worker-output.log)"}
    except OSError as exc:
        return {"error": f"could not start: {exc}"}
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit code {proc.returncode}"}
    res = json.loads(lines[-1])
    t1 = _cpu_ticks()
    if t0 and t1 and t1[1] > t0[1]:
        res["steal"] = (t1[0] - t0[0]) / (t1[1] - t0[1])
    return res


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux's /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _dump_stacks(pid: int) -> list[int]:
    """A child that ran past its time: have it and its workers (forked: they keep its
    ``faulthandler`` registration) print their Python stacks to stderr, so that a hang
    says where it was. Returns the pids."""
    if not hasattr(signal, "SIGUSR1"):
        return [pid]
    # Only the child and its forks: another process below it (multiprocessing's
    # resource tracker, which frees the segment once the child is gone) would die of
    # the signal. One at a time, so that the stacks do not interleave.
    pids = [p for p in _descendants(pid) if _cmdline(p) == _cmdline(pid)]
    for p in pids:
        _signal(p, signal.SIGUSR1)
        time.sleep(0.5)
    return pids


def _cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def _metric(loop: str, res: dict) -> dict:
    """Higher is better for every figure kept: steps/s, or 1e6/us for step times."""
    if loop == "gap":
        return {f"{ms} ms": 1e6 / v["step_us"] for ms, v in res["gaps"].items()} | \
               {f"{ms} ms iter": 1e6 / v["iter_us"] for ms, v in res["gaps"].items()}
    return {"sps": res["sps"]}


def run_loops(loops=LOOPS, repeats: int = 3, progress=None, notes: list | None = None,
              timeout: float = 900.0) -> list[dict]:
    """Every case of ``loops``, candidates interleaved over ``repeats`` rounds."""
    notes = notes if notes is not None else []
    out = []
    for loop in loops:
        for case in CASES[loop]:
            cands = list(case["cands"])
            runs = {c: [] for c in cands}
            for r in range(repeats):
                order = cands[r % len(cands):] + cands[:r % len(cands)]
                for c in order:
                    if progress:
                        progress(f"{loop}: {case['case']} {c}", 0)
                    spec = {k: v for k, v in case.items() if k not in ("cands", "case")}
                    spec.update(loop=loop, cand=c, round=r)
                    res = _run_child(spec, timeout)
                    runs[c].append(res)
                    if "error" in res:
                        notes.append(f"{loop} / {case['case']} / {c} round {r}: {res['error']}")
                    elif _lost_wakeups(res):
                        notes.append(f"{loop} / {case['case']} / {c} round {r}: {_lost_wakeups(res)} sleeps "
                                     f"ended by the 100 ms look at the flags, not by a doorbell (lost wake-ups)")
                    if progress:
                        progress("", 1)
            out.append(summarize(loop, case, runs))
    return out


def summarize(loop: str, case: dict, runs: dict) -> dict:
    base = BASELINE[loop]
    rows = []
    for c, results in runs.items():
        per = {}
        for r, res in enumerate(results):
            if "error" in res:
                continue
            b = runs[base][r] if r < len(runs[base]) else {"error": "missing"}
            mine = _metric(loop, res)
            theirs = _metric(loop, b) if "error" not in b else {}
            for key, v in mine.items():
                per.setdefault(key, {"values": [], "ratios": []})["values"].append(v)
                if key in theirs:
                    per[key]["ratios"].append(v / theirs[key])
        stats = {}
        for key, d in per.items():
            vals, rats = np.asarray(d["values"]), np.asarray(d["ratios"])
            stats[key] = {"median": float(np.median(vals)), "min": float(vals.min()), "max": float(vals.max()),
                          "ratio": float(np.median(rats)) if rats.size else None,
                          "ratio_min": float(rats.min()) if rats.size else None,
                          "ratio_max": float(rats.max()) if rats.size else None}
        rows.append({"candidate": c, "label": LABELS[c], "runs": results, "stats": stats,
                     "errors": [res["error"] for res in results if "error" in res], "waits": _median_waits(loop, results)})
    return {"loop": loop, "case": case["case"], "baseline": base, "candidates": rows}


def _steal_line(case: dict) -> str:
    """The CPU steal over the case's runs: its median, and its largest, with whose run."""
    seen = [(res["steal"], row["label"], r) for row in case["candidates"]
            for r, res in enumerate(row["runs"]) if res.get("steal") is not None]
    if not seen:
        return ""
    top = max(seen)
    return (f"\nCPU steal during the runs (the hypervisor's time for other guests): median "
            f"{100 * float(np.median([s for s, _, _ in seen])):.1f}%, at most {100 * top[0]:.1f}% "
            f"({top[1]}, round {top[2] + 1}).")


WAIT_KEYS = ("parent_naps", "parent_sleeps", "worker_naps", "worker_sleeps")


def _median_waits(loop: str, results: list):
    """The median over rounds of fastvec's waits per step (``_waits_per_step``); for the
    gap loop per gap; None for candidates that are not fastvec."""
    ok = [res for res in results if "error" not in res]

    def med(ws):
        ws = [w for w in ws if w]
        return {k: float(np.median([w[k] for w in ws])) for k in WAIT_KEYS} if ws else None

    if loop == "gap":
        gaps = {g: med([res["gaps"][g].get("waits") for res in ok]) for g in (ok[0]["gaps"] if ok else {})}
        return gaps if any(gaps.values()) else None
    return med([res.get("waits") for res in ok])


def _waits_cell(w) -> str:
    """parent sleeps; worker naps, sleeps (per step)."""
    if not w:
        return ""
    return f"{w['parent_sleeps']:.2f}; {w['worker_naps']:.2f}, {w['worker_sleeps']:.2f}"


def render_markdown(cases: list[dict]) -> str:
    """The real-loop tables: one row per candidate, ratios against the round's baseline."""
    lines = []
    for case in cases:
        lines += ["", f"#### {case['case']} ({case['loop']})", ""]
        keys = [k for k in case["candidates"][0]["stats"]] if case["candidates"][0]["stats"] else []
        if case["loop"] == "gap":
            gaps = [k for k in keys if not k.endswith("iter")]
            lines.append("| candidate | " + " | ".join(f"step after {k} gap (us)" for k in gaps)
                         + " | whole iteration at the longest gap (us) |")
            lines.append("|---|" + "---:|" * (len(gaps) + 1))
            for row in case["candidates"]:
                s = row["stats"]
                cells = [_gap_cell(s.get(k)) for k in gaps] + [_gap_cell(s.get(gaps[-1] + " iter")) if gaps else ""]
                lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
            for row in case["candidates"]:
                if row.get("waits"):
                    per = "; ".join(f"after {g} ms ({_waits_cell(w)})" for g, w in row["waits"].items() if w)
                    lines.append(f"\nWaits per step of {row['label']} (parent sleeps; worker naps, sleeps): {per}.")
        else:
            unit = "env steps/s"
            waits = any(row.get("waits") for row in case["candidates"])
            head = " waits per step: parent sleeps; worker naps, sleeps |" if waits else ""
            lines.append(f"| candidate | {unit} (median, range) | ratio to {LABELS[case['baseline']]} (range) |{head}")
            lines.append("|---|---:|---:|" + ("---:|" if waits else ""))
            for row in case["candidates"]:
                s = row["stats"].get("sps")
                tail = f" {_waits_cell(row.get('waits'))} |" if waits else ""
                if s is None:
                    lines.append(f"| {row['label']} | failed: {'; '.join(row['errors'])} | |{tail}")
                    continue
                lines.append(f"| {row['label']} | {s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f}) | "
                             f"{_ratio(s)} |{tail}")
        if steal := _steal_line(case):
            lines.append(steal)
    return "\n".join(lines) + "\n"


def _ratio(s: dict) -> str:
    if s.get("ratio") is None:
        return "n/a"
    return f"**{s['ratio']:.2f}x** ({s['ratio_min']:.2f}-{s['ratio_max']:.2f})"


def _gap_cell(s) -> str:
    if s is None:
        return "failed"
    us = 1e6 / s["median"]
    return f"{us:,.0f} ({_ratio(s)})"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m fastvec.bench.loops '<json spec>' (run by fastvec bench)", file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    # A run past its time is asked for its stacks (``_dump_stacks``) before it is killed.
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    res = CHILDREN[spec["loop"]](spec)
    sys.stdout.flush()
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
