"""``torch_threads``: the doors give the caller's torch the cores their workers leave,
and put back what they changed."""

from __future__ import annotations

import gymnasium as gym
import psutil
import pytest

import fastvec
from fastvec.options import available_cores

torch = pytest.importorskip("torch")

DOORS = {"gym": fastvec.AsyncVectorEnv, "sb3": fastvec.SubprocVecEnv}


def cartpole():
    return gym.make("CartPole-v1")


@pytest.fixture
def torch_at(monkeypatch):
    """Set torch's thread count for one test (no user choice in the environment)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    before = torch.get_num_threads()

    def set_to(n):
        torch.set_num_threads(n)

    yield set_to
    torch.set_num_threads(before)


@pytest.mark.parametrize("door", DOORS)
def test_auto_leaves_the_workers_cores_and_restores(door, torch_at):
    cores = available_cores()
    torch_at(cores + 2)  # more threads than cores: always too many
    env = DOORS[door]([cartpole] * 2, num_workers=1)
    try:
        assert torch.get_num_threads() == max(1, cores - 1)
        env.reset()
        assert torch.get_num_threads() == max(1, cores - 1)
    finally:
        env.close()
    assert torch.get_num_threads() == cores + 2


@pytest.mark.parametrize("door", DOORS)
def test_auto_never_raises_the_count(door, torch_at):
    torch_at(1)
    with DOORS[door]([cartpole] * 2, num_workers=1) as env:
        env.reset()
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 1


def test_an_int_sets_and_none_leaves_alone(torch_at):
    torch_at(3)
    with fastvec.AsyncVectorEnv([cartpole] * 2, num_workers=2, torch_threads=2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 3
    with fastvec.SubprocVecEnv([cartpole] * 2, num_workers=2, torch_threads=None):
        assert torch.get_num_threads() == 3
    assert torch.get_num_threads() == 3


def test_a_users_choice_in_the_environment_wins(torch_at, monkeypatch):
    torch_at(available_cores() + 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    with fastvec.AsyncVectorEnv([cartpole] * 2, num_workers=2):
        assert torch.get_num_threads() == available_cores() + 2


def test_a_count_the_caller_changed_meanwhile_is_kept(torch_at):
    torch_at(available_cores() + 2)
    env = fastvec.AsyncVectorEnv([cartpole] * 2, num_workers=1)
    torch.set_num_threads(5)  # the caller's own choice, after the door opened
    env.close()
    assert torch.get_num_threads() == 5


@pytest.mark.parametrize("bad", [0, -1, 1.5, "all", True])
@pytest.mark.parametrize("door", DOORS)
def test_bad_torch_threads_fail_before_any_process_starts(door, bad):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match="torch_threads"):
        DOORS[door]([cartpole] * 2, torch_threads=bad)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
