"""The GPU's code path on the CPU: separate device buffers filled by copies (what the
trainer does on CUDA), busy spans timed by (fake) CUDA events, page-locking through a
(fake) cudart; and, on a GPU, CUDA against the CPU on the same rollout.

The reference for the copies is the zero-copy trainer on the same seeds. On the CPU the
two must agree exactly, not to a tolerance: both run the same kernels on the same
values in the same order, and a copy moves bits unchanged; only where the tensors live
differs.
"""

from __future__ import annotations

import copy
import mmap
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import ImageEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from fastvec.train import PPO, EngineStorage, HostPin, PPOConfig
from fastvec.train.compute import pinned
from fastvec.train.compute.busy import DeviceBusy
from fastvec.train.model.actor_critic import make_policy
from fastvec.train.model.distributions import GaussianDist
from fastvec.train.storage.rollout import Rollout
from fastvec.train.storage.vector_copies import GymVectorStorage

CPU = torch.device("cpu")


class FakeEvent:
    """``torch.cuda.Event``'s timing interface on a clock the test sets (seconds)."""

    def __init__(self, cuda: FakeCuda, enable_timing: bool = False):
        assert enable_timing
        self.cuda, self.at, self.synced = cuda, None, False

    def record(self) -> None:
        self.at = self.cuda.clock
        self.cuda.recorded += 1

    def synchronize(self) -> None:
        self.synced = True

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1e3  # milliseconds, as CUDA's


class FakeCuda:
    """What the trainer calls of ``torch.cuda``: events, ``synchronize`` and ``cudart()``
    (``cudaHostRegister``/``cudaHostUnregister`` return ``codes``' next value)."""

    def __init__(self, register=0, unregister=0):
        self.clock = 0.0
        self.recorded = 0
        self.calls: list[tuple] = []
        self.codes = {"cudaHostRegister": register, "cudaHostUnregister": unregister}

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 (torch.cuda's name)
        return FakeEvent(self, enable_timing)

    def synchronize(self) -> None:
        self.calls.append(("synchronize",))

    def cudart(self):
        return self

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802
        self.calls.append(("register", ptr, size, flags))
        return self.codes["cudaHostRegister"]

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.calls.append(("unregister", ptr))
        return self.codes["cudaHostUnregister"]


# ---------------------------------------------------------------- copies vs zero copy
def _pendulum():
    return gym.make("Pendulum-v1", max_episode_steps=20)  # truncations inside a rollout: bootstraps


ENVS = {  # policy kinds: numpy acting and learner; Gaussian with an observation normaliser; CNN
    "cartpole": (lambda: gym.make("CartPole-v1"), {}),
    "pendulum": (_pendulum, {"normalize_obs": True, "normalize_reward": True}),
    "image": (lambda: ImageEnv(shape=(36, 36, 2)), {}),
    # recurrent cores: states recorded on the device, starts from the host's flags
    "pendulum+lstm": (
        _pendulum,
        {"normalize_obs": True, "normalize_reward": True, "policy_core": "lstm", "core_size": 16, "bptt": 8},
    ),
    "image+gru": (lambda: ImageEnv(shape=(36, 36, 2)), {"policy_core": "gru", "core_size": 16}),
}


def _run(env_name, separate, *, T=16, N=4, rollouts=3, cuda=None, storage=None, device=CPU, policy=None, cfg_kw=None):
    """``rollouts`` rounds of collect / prepare / update on fixed seeds; per round the
    learner's tensors (as CPU copies) and the parameters after the update."""
    fn, kw = ENVS[env_name]
    cfg = PPOConfig(
        num_envs=N,
        n_steps=T,
        device=device.type,
        seed=7,
        **{"minibatch_size": 32, "n_epochs": 2, **kw, **(cfg_kw or {})},
    )
    torch.manual_seed(7)
    venv = None
    if storage is None:
        venv = SyncVectorEnv([fn] * N, autoreset_mode=AutoresetMode.SAME_STEP)
        storage = GymVectorStorage(venv, T + 1)
    try:
        ppo = PPO(cfg, storage, device, policy, separate_buffers=separate)
        if cuda is not None:
            ppo.busy = DeviceBusy(device, cuda=cuda)
        ro = ppo.rollout
        assert ro.copies == bool(separate) or device.type != "cpu"
        storage.reset(7)
        out = []
        for _ in range(rollouts):
            ppo.collect()
            ppo.prepare()
            ppo.update()
            got = {
                name: getattr(ro, name).detach().cpu().clone() for name in ("obs_dev", "values", "logp", "adv", "ret")
            }
            got["act_dev"] = ro.act_dev[1:].cpu().clone()  # slot 0 holds no action
            got.update(
                act=ro.act.clone(),
                obs=ro.obs.clone(),
                adv_np=ro.adv_np.copy(),
                param=ppo.flat_param.detach().cpu().clone(),
            )
            if ro.raw is not None:
                got["raw"] = ro.raw.cpu().clone()
            out.append(got)
            ro.obs[0].copy_(ro.obs[T])  # as the trainer's loop
        return out, ppo
    finally:
        if venv is not None:
            venv.close()


def _assert_equal_runs(a, b):
    for r, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.keys() == y.keys()
        for name in x:
            np.testing.assert_array_equal(np.asarray(x[name]), np.asarray(y[name]), err_msg=f"rollout {r}: {name}")


@pytest.mark.parametrize("env_name", list(ENVS))
def test_separate_buffers_match_zero_copy(env_name):
    """Lock-step: with separate buffers (and a fake CUDA timing them) the trainer takes
    the same actions and computes the same values, log-probs, advantages, returns and
    parameters as with zero copy, exactly; the device buffers hold what the envs wrote."""
    zero, ppo0 = _run(env_name, False)
    cuda = FakeCuda()
    sep, ppo1 = _run(env_name, True, cuda=cuda)
    ro0, ro1 = ppo0.rollout, ppo1.rollout
    assert not ro0.copies and ro0.obs_dev is ro0.obs and ro0.values is ro0.values_host
    assert ro1.copies and not np.shares_memory(ro1.obs_dev.numpy(), ro1.obs.numpy())
    assert not np.shares_memory(ro1.act_dev.numpy(), ro1.act.numpy())
    assert not np.shares_memory(ro1.values.numpy(), ro1.values_np)
    assert not np.shares_memory(ro1.adv.numpy(), ro1.adv_np)
    _assert_equal_runs(zero, sep)
    for got in sep:
        # the device copies are the envs' data (slot 0: the next rollout's start came after)
        assert torch.equal(got["obs_dev"][1:], got["obs"][1:])
        assert torch.equal(got["act_dev"], got["act"][1:].to(got["act_dev"].dtype))
        np.testing.assert_array_equal(got["adv"].numpy(), got["adv_np"])
    # one busy span per acting step, one for the targets, one for the update: all timed
    assert cuda.recorded == 2 * (3 * 16 + 2 * 3)
    assert cuda.calls == [("synchronize",)] * 3  # after each update, for its time


def test_separate_buffers_match_zero_copy_with_batch_groups():
    """Batch groups (``env_groups=2``, engine workers): each group's rows go to the
    device and its actions come back; the same run as with zero copy."""
    from fastvec.engine import Engine

    runs = []
    for separate in (False, True):
        T, N = 12, 4
        storage = EngineStorage(
            Engine(
                [ENVS["cartpole"][0]] * N, num_workers=2, num_slots=T + 1, autoreset_mode="same_step", context="fork"
            ),
            groups=2,
        )
        try:
            cuda = FakeCuda()
            out, ppo = _run(
                "cartpole", separate, T=T, N=N, rollouts=2, cuda=cuda, storage=storage, cfg_kw={"env_groups": 2}
            )
            assert ppo.rollout.steps_by_group() is not None and len(ppo.rollout.steps_by_group()) == 2
            assert cuda.recorded == (2 * (2 * T * 2 + 2 * 2) if separate else 2 * 2 * 2)
        finally:
            storage.close()
        runs.append(out)
    _assert_equal_runs(*runs)


def test_zero_copy_needs_the_cpu():
    pol = make_policy(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2))
    venv = SyncVectorEnv([ENVS["cartpole"][0]] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        storage = GymVectorStorage(venv, 5)
        with pytest.raises(ValueError, match="zero copy"):
            Rollout(storage, pol, 4, torch.device("meta"), copies=False)
        assert Rollout(storage, pol, 4, torch.device("meta")).copies  # the default off the CPU
    finally:
        venv.close()


def test_pinned_allocations(monkeypatch):
    """``pin``: the learner's host arrays and a copying storage's buffers come from the
    pinned allocator (faked here: it needs CUDA) and are what the tensors view."""
    made = []

    def fake_pinned(shape, dtype):
        t = torch.from_numpy(np.full(shape, 7, dtype))  # uninitialised, like torch's pinned memory
        made.append((tuple(shape), np.dtype(dtype)))
        return t

    monkeypatch.setattr(pinned, "_pinned_empty", fake_pinned)
    assert pinned.alloc((2, 3), np.float32, pin=False).sum() == 0 and not made
    venv = SyncVectorEnv([ENVS["cartpole"][0]] * 3, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        storage = GymVectorStorage(venv, 5, pin=True)
        assert sorted(made) == sorted(
            [((5, 3, 4), np.dtype(np.float32))] * 2
            + [
                ((5, 3), np.dtype(np.int64)),
                ((5, 3), np.dtype(np.float64)),
                ((5, 3), np.dtype(np.bool_)),
                ((5, 3), np.dtype(np.bool_)),
            ]
        )
        made.clear()
        pol = make_policy(venv.single_observation_space, venv.single_action_space)
        ro = Rollout(storage, pol, 4, CPU, copies=True, pin=True)
        assert made == [((5, 3), np.dtype(np.float32))] + [((4, 3), np.dtype(np.float32))] * 3
        assert np.shares_memory(ro.values_host.numpy(), ro.values_np) and (ro.values_np == 7).all()
        made.clear()
        Rollout(storage, pol, 4, CPU, copies=True)  # the CPU pins nothing by default
        assert made == []
    finally:
        venv.close()


# ---------------------------------------------------------------- busy spans from events
def test_busy_fraction_from_fake_cuda_events():
    """With CUDA events the busy seconds are the spans' summed device time (the CPU
    seconds the caller passes are ignored); the last event is waited for before reading;
    the fraction is of the wall interval and at most 1."""
    cuda = FakeCuda()
    busy = DeviceBusy(CPU, cuda=cuda)
    assert busy.cuda
    busy.start()
    t0 = busy._last
    for start, stop in ((0.0, 0.5), (1.0, 1.25), (2.0, 2.25)):
        cuda.clock = start
        span = busy.begin()
        cuda.clock = stop
        busy.end(span)
    last_end = busy._spans[-1][1]
    assert busy.take(cpu_busy_s=99.0, now=t0 + 4.0) == pytest.approx(1.0 / 4.0)
    assert last_end.synced and busy._spans == []
    cuda.clock = 10.0
    span = busy.begin()
    cuda.clock = 13.0
    busy.end(span)
    assert busy.take(cpu_busy_s=0.0, now=t0 + 6.0) == 1.0  # 3 s of device time in 2 s of wall: capped
    assert busy.total_busy_s == pytest.approx(4.0) and busy.total_wall_s == pytest.approx(6.0)
    assert busy.fraction == pytest.approx(4.0 / 6.0)
    assert busy.take(cpu_busy_s=5.0, now=t0 + 8.0) == 0.0  # no spans: idle
    busy.synchronize()
    assert cuda.calls == [("synchronize",)]


def test_busy_fraction_on_the_cpu_counts_the_callers_seconds():
    busy = DeviceBusy(CPU)
    assert not busy.cuda and busy.begin() is None
    busy.end(None)
    busy.synchronize()  # nothing to wait for
    t0 = busy._last
    assert busy.take(cpu_busy_s=1.0, now=t0 + 4.0) == pytest.approx(0.25)
    assert busy.nvml() is None and busy.fraction == pytest.approx(0.25)


# ---------------------------------------------------------------- page-locking via cudart
def _segment_arrays():
    """Arrays carved out of one buffer, not page-aligned (as the engine's segment)."""
    buf = np.zeros(5 * mmap.PAGESIZE, np.uint8)
    base = buf.ctypes.data
    skip = (-base) % mmap.PAGESIZE + 100  # start 100 bytes into a page
    a = buf[skip : skip + 64].view(np.float32)
    b = buf[skip + 64 + 8 : skip + 64 + 8 + 2 * mmap.PAGESIZE]
    return buf, [b, None, a, np.zeros(0)], base + skip, base + skip + 72 + 2 * mmap.PAGESIZE


def test_host_pin_registers_the_arrays_span_once():
    buf, arrays, lo, hi = _segment_arrays()
    cuda = FakeCuda()
    pin = HostPin(arrays, cuda=cuda)
    page = mmap.PAGESIZE
    start, end = lo - lo % page, -(-hi // page) * page
    assert cuda.calls == [("register", start, end - start, 0)]
    assert pin.pinned and (pin.ptr, pin.nbytes) == (start, end - start) and end - start == 3 * page
    pin.release()
    assert cuda.calls[1:] == [("synchronize",), ("unregister", start)]  # no copy in flight first
    assert not pin.pinned
    pin.release()  # once only
    assert len(cuda.calls) == 3
    del buf


def test_host_pin_failures_warn():
    buf, arrays, _lo, _hi = _segment_arrays()

    class Enum:  # cudart returns an enum with .value
        value = 2

    cuda = FakeCuda(register=Enum())
    with pytest.warns(UserWarning, match=r"cudaHostRegister failed \(error 2\)"):
        pin = HostPin(arrays, cuda=cuda)
    assert not pin.pinned
    pin.release()
    assert [c[0] for c in cuda.calls] == ["register"]

    cuda = FakeCuda(unregister=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pin = HostPin(arrays, cuda=cuda)
    with pytest.warns(UserWarning, match=r"cudaHostUnregister failed \(error 1\)"):
        pin.release()
    assert not pin.pinned

    cuda = FakeCuda()
    assert not HostPin([None, np.zeros(0)], cuda=cuda).pinned and cuda.calls == []
    del buf


# ---------------------------------------------------------------- CUDA against the CPU
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("env_name", ["cartpole", "pendulum"])
def test_cuda_matches_the_cpu_on_the_same_rollout(env_name, monkeypatch):
    """The same initial policy and the same sampling noise (drawn on the CPU, then moved)
    on CUDA and on the CPU: the same discrete actions, and Gaussian actions, values,
    log-probs, advantages and parameters equal to float tolerance (the devices' kernels
    round differently; checked on the CPU with numpy against torch kernels: differences
    of ~1e-7). One minibatch per epoch: no permutation, whose draws would differ by
    device."""
    fn, kw = ENVS[env_name]
    env = fn()
    torch.manual_seed(3)
    pol = make_policy(env.observation_space, env.action_space, normalize_obs=kw.get("normalize_obs", False))
    env.close()
    gen = {}

    def cpu_noise(dist):
        gaussian = isinstance(dist, GaussianDist)

        def sample(out):  # the trainer's draws, from one CPU generator whatever the device
            noise = torch.empty(out.shape)
            if gaussian:
                noise.normal_(generator=gen["g"])
            else:
                noise.exponential_(generator=gen["g"]).clamp_(min=1e-30).log_().neg_()
            return out.copy_(noise)

        return sample

    runs = []
    for device in (CPU, torch.device("cuda")):
        gen["g"] = torch.Generator().manual_seed(11)
        p = copy.deepcopy(pol)
        monkeypatch.setattr(p.dist, "sample_noise", cpu_noise(p.dist))
        out, _ = _run(
            env_name, None, rollouts=2, device=device, policy=p, cfg_kw={"minibatch_size": 64, "learner": "torch"}
        )
        runs.append(out)
    for r, (x, y) in enumerate(zip(*runs, strict=True)):
        if "raw" not in x:  # discrete: the same actions (a flip needs a near tie: ~1e-6 a draw)
            np.testing.assert_array_equal(x["act"].numpy(), y["act"].numpy(), err_msg=f"rollout {r}")
        for name in ("values", "logp", "adv", "ret", "param") + (("raw", "act") if "raw" in x else ()):
            np.testing.assert_allclose(
                x[name].numpy(), y[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=f"rollout {r}: {name}"
            )
