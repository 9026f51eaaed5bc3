"""Data-parallel training (``fastvec train --nproc N``, ``fastvec.train.compute.ranks``) on gloo.

The reference: one rank of all ``num_envs`` envs. Two ranks of half as many each, the
same seed, must end with the same weights and Adam moments to float tolerance after
several updates of several minibatches each (the noise and permutations are the run's,
the gradients and statistics summed over the ranks), and the same counters. Then the
failure paths: bad input in one line before any process starts, a rank killed, the
launcher stopped by SIGTERM (all ranks at one safe point, resumable on as many ranks).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from fastvec.train import load_checkpoint

# Several minibatches an epoch, three epochs, every normaliser and the KL stop on.
SETTINGS = [
    "--set",
    "n_steps=32",
    "--set",
    "minibatch_size=32",
    "--set",
    "n_epochs=3",
    "--set",
    "normalize_obs=true",
    "--set",
    "normalize_reward=true",
    "--set",
    "target_kl=0.02",
    "--set",
    "torch_threads=1",
]


def _env():
    env = dict(os.environ)
    for k in ("FASTVEC_DEBUG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _cmd(run, *extra):
    return [
        sys.executable, "-m", "fastvec", "train", "CartPole-v1", "--device", "cpu", "--no-progress",
        "--no-tensorboard", "--logdir", str(run), *SETTINGS, *extra,
    ]  # fmt: skip


def _train(run, *extra, timeout=180):
    out = subprocess.run(
        _cmd(run, *extra), capture_output=True, text=True, env=_env(), cwd=str(run.parent), timeout=timeout
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), load_checkpoint(str(run / "checkpoint.pt"))


def _segments(pid: int) -> set[str]:
    """The fastvec shared-memory segments process ``pid`` maps."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split("/dev/shm/")[1].split()[0] for line in f if "/dev/shm/fastvec_" in line}


# the async pipeline at lag 0 is the lock-step run (tests/test_train_pipeline.py): on two ranks too
@pytest.mark.parametrize(
    "pipeline", [[], ["--set", "pipeline=async", "--set", "max_policy_lag=0"]], ids=["lockstep", "async"]
)
def test_two_ranks_equal_one_rank_of_all_their_envs(tmp_path, pipeline):
    args = ("--seed", "5", "--num-envs", "4", "--total-steps", "640")  # 5 rollouts of 128 samples, 4 updates
    one, ck1 = _train(tmp_path / "one", *args)
    two, ck2 = _train(tmp_path / "two", *args, "--nproc", "2", *pipeline)
    _, ck0 = _train(tmp_path / "zero", "--seed", "5", "--num-envs", "4", "--total-steps", "128")  # no update
    assert two["ranks"]["world"] == 2 and two["ranks"]["backend"] == "gloo" and len(two["ranks"]["rank_sps"]) == 2
    assert "ranks" not in one and ck0["train_state"]["updates"] == 0
    assert (one["env_steps"], one["updates"], one["grad_steps"]) == (
        two["env_steps"],
        two["updates"],
        two["grad_steps"],
    )
    assert one["updates"] == 4 and one["grad_steps"] > 4  # several minibatches an update
    assert one["num_envs"] == 4 and two["num_envs"] == 2  # (each rank's)
    sd0, sd1, sd2 = ck0["state_dict"], ck1["state_dict"], ck2["state_dict"]
    assert sd1.keys() == sd2.keys()
    for k in sd1:  # weights and the observation normaliser's statistics
        torch.testing.assert_close(sd2[k], sd1[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    # the updates moved the weights by far more than the tolerance
    assert max(float((sd1[k] - sd0[k]).abs().max()) for k in sd1 if k.endswith("weight")) > 1e-2
    o1, o2 = ck1["train_state"]["optimizer"], ck2["train_state"]["optimizer"]
    for k in o1:
        if isinstance(o1[k], torch.Tensor):
            torch.testing.assert_close(o2[k], o1[k], rtol=1e-4, atol=1e-7, msg=lambda m, k=k: f"optimizer {k}: {m}")
    assert ck2["train_state"]["reward_scaler"] == pytest.approx(ck1["train_state"]["reward_scaler"], rel=1e-9)
    ranks = ck2["train_state"]["ranks"]
    assert ranks["world"] == 2 and len(ranks["trackers"]) == 2
    # the same episodes, each counted by the rank that stepped it
    eps = [t["episodes"] for t in ranks["trackers"]]
    assert sum(eps) == one["episodes"] and all(eps)


@pytest.mark.parametrize(
    "extra,env,says",
    [
        (["--nproc", "0"], {}, "--nproc must be a positive integer"),
        (["--nproc", "3", "--num-envs", "4"], {}, "num_envs=4 must split evenly over 3 ranks"),
        (["--nproc", "20000", "--device", "cuda", "--num-envs", "20000"], {}, "CUDA"),  # none, or not one each
        (["--nproc", "2", "--backend", "ray"], {}, "each start fastvec's engine"),
        (
            ["--nproc", "2", "--mix", "count=2", "--mix", "count=2", "--num-envs", "4"],
            {},
            "a mix of envs runs on one rank",
        ),
        (["--nproc", "3"], {"WORLD_SIZE": "2", "RANK": "0"}, "differs from the launcher's WORLD_SIZE=2"),
    ],
)
def test_bad_input_is_one_line_before_any_process_starts(tmp_path, extra, env, says):
    out = subprocess.run(
        _cmd(tmp_path / "run", *extra),
        capture_output=True,
        text=True,
        env={**_env(), **env},
        cwd=str(tmp_path),
        timeout=60,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastvec train: error:") and says in lines[0], out.stderr
    assert not (tmp_path / "run").exists()


def _start(run, *extra):
    """A 2-rank run until its first periodic checkpoint; ``(launcher, ranks, the ranks'
    and their workers' pids, the segments they map)``."""
    cmd = _cmd(
        run, "--seed", "2", "--num-envs", "4", "--nproc", "2", "--total-steps", "1e7", "--checkpoint-every", "2048"
    )
    p = subprocess.Popen(
        [*cmd, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=str(run.parent)
    )
    deadline = time.monotonic() + 120
    while not list((run / "checkpoints").glob("step-*.pt")) if (run / "checkpoints").exists() else True:
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise AssertionError(p.communicate())
        time.sleep(0.05)
    ranks = psutil.Process(p.pid).children()
    assert len(ranks) == 2
    held = {q.pid for r in ranks for q in [r, *r.children(recursive=True)]}
    segs = set().union(*(_segments(r.pid) for r in ranks))
    assert len(held) > 2 and segs
    return p, ranks, held, segs


def _gone(pids, segs, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [q for q in pids if psutil.pid_exists(q) and psutil.Process(q).status() != psutil.STATUS_ZOMBIE]
        left = [s for s in segs if os.path.exists("/dev/shm/" + s)]
        if not alive and not left:
            return
        time.sleep(0.05)
    raise AssertionError(f"left behind: processes {alive}, segments {left}")


def test_a_killed_rank_ends_every_rank_with_one_line(tmp_path):
    run = tmp_path / "run"
    p, ranks, held, segs = _start(run)
    ranks[1].send_signal(signal.SIGKILL)
    t0 = time.perf_counter()
    _out, err = p.communicate(timeout=30)
    assert p.returncode == 1 and time.perf_counter() - t0 < 15, err
    assert "fastvec train: error: rank 1 of 2 was killed by SIGKILL; the other ranks were stopped" in err, err
    assert "Traceback" not in err
    _gone(held, segs)
    assert list((run / "checkpoints").glob("step-*.pt"))  # the last periodic checkpoint is kept


def test_a_killed_learner_ends_every_rank_with_one_line(tmp_path):
    run = tmp_path / "run"
    p, ranks, held, segs = _start(run, "--set", "pipeline=async")
    kids = [c for c in ranks[1].children() if "resource_tracker" not in " ".join(c.cmdline())]
    learner = min(kids, key=lambda c: (c.create_time(), c.pid))  # forked before the envs start
    learner.send_signal(signal.SIGKILL)
    t0 = time.perf_counter()
    _out, err = p.communicate(timeout=30)
    assert p.returncode == 1 and time.perf_counter() - t0 < 15, err
    assert "rank 1: the learner process died (killed by SIGKILL)" in err, err
    assert "fastvec train: error: rank 1 of 2 failed (exit code 1); the other ranks were stopped" in err, err
    assert "Traceback" not in err
    _gone(held, segs)
    assert list((run / "checkpoints").glob("step-*.pt"))  # the last periodic checkpoint is kept


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_every_rank_at_one_safe_point_and_the_run_resumes_on_as_many(tmp_path, sig, code):
    run = tmp_path / "run"
    p, _ranks, held, segs = _start(run)
    p.send_signal(sig)  # to the launcher, as a terminal's Ctrl-C reaches it: passed on to each rank once
    out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    res = json.loads(out.strip().splitlines()[-1])
    assert res["interrupted"] is True and res["ranks"]["world"] == 2 and "Traceback" not in err
    assert err.count("stopping at the next safe point") == 2  # each rank, once
    _gone(held, segs)
    ck = load_checkpoint(str(run / "checkpoint.pt"))
    assert ck["train_state"]["env_steps"] == res["env_steps"] and ck["train_state"]["ranks"]["world"] == 2
    if sig == signal.SIGINT:
        return  # resuming: once is enough (SIGTERM)
    # another number of ranks: one line, before any process starts
    again = [sys.executable, "-m", "fastvec", "train", "--resume", str(run), "--no-progress", "--no-tensorboard"]
    out1 = subprocess.run(
        [*again, "--nproc", "1"], capture_output=True, text=True, env=_env(), cwd=str(tmp_path), timeout=60
    )
    assert out1.returncode == 2 and "resume it with --nproc 2, not 1" in out1.stderr, out1.stderr
    total = res["env_steps"] + 1024
    out2 = subprocess.run(
        [*again, "--nproc", "2", "--total-steps", str(total)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=str(tmp_path),
        timeout=120,
    )
    assert out2.returncode == 0, out2.stderr
    res2 = json.loads(out2.stdout.strip().splitlines()[-1])
    assert res2["resumed"] is True and res2["env_steps"] == total and res2["updates"] > res["updates"]
