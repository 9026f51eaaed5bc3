"""Memory tasks from other packages: POPGym's RepeatPreviousEasy (popgym, in the ``test``
extra) as ``fastvec train`` sees it, against popgym's own env stepped on the same seeds
and actions; the task's rule and the best a policy without memory can expect from it;
its preset learning more than that through the CLI; ``fastvec.train`` without popgym."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
from gymnasium.vector import SyncVectorEnv
from helpers import assert_same

import fastvec
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.config import presets
from fastvec.train.config.presets import env_factory, preset_for

ENV = "popgym-RepeatPreviousEasy-v0"


def _popgym_env():
    from popgym.envs.repeat_previous import RepeatPreviousEasy

    return RepeatPreviousEasy()


def test_popgym_ids_are_registered_when_fastvec_train_is_imported():
    assert presets.HAS_POPGYM
    spec = gym.spec(ENV)
    assert spec.entry_point.startswith("popgym.")
    env = env_factory(ENV)()
    assert env.observation_space == gym.spaces.Discrete(4) and env.action_space == gym.spaces.Discrete(4)


def test_the_engine_steps_repeat_previous_as_popgym_does():
    """fastvec's workers building the env from its id, against popgym's class stepped in
    gymnasium's SyncVectorEnv: the same observations, rewards and ends, step by step,
    through the autoresets after each 51-step episode."""
    env = fastvec.AsyncVectorEnv([env_factory(ENV)] * 4, num_workers=2)
    ref = SyncVectorEnv([_popgym_env] * 4)
    try:
        assert_same(env.reset(seed=7)[0], ref.reset(seed=7)[0], "reset obs")
        rng = np.random.default_rng(0)
        ends = 0
        for t in range(120):
            actions = rng.integers(0, 4, size=4)
            got, want = env.step(actions), ref.step(actions)
            for name, g, w in zip(("obs", "rewards", "terminated", "truncated"), got[:4], want[:4]):
                assert_same(g, w, f"step {t} {name}")
            ends += int(want[2].sum())
        assert ends == 8  # two episodes of 51 steps in each env
    finally:
        env.close()
        ref.close()


def test_the_reward_is_for_the_suit_shown_three_cards_before():
    """The rule the preset learns: answering the suit observed 3 steps before the latest
    observation scores 1 over an episode; one suit always scores at most -0.45 (a
    suit is 13 of the 48 cards asked about at most)."""
    env = gym.make(ENV)
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        seen, best, done = [obs], 0.0, False
        while not done:
            action = seen[-4] if len(seen) >= 4 else 0
            obs, reward, terminated, truncated, _ = env.step(action)
            seen.append(obs)
            best, done = best + reward, terminated or truncated
        assert abs(best - 1.0) < 1e-9 and len(seen) == 52
        env.reset(seed=seed)
        fixed, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(0)
            fixed, done = fixed + reward, terminated or truncated
        assert fixed <= -0.45
    env.close()


# Without memory a policy sees only the latest card. Of the 51 other cards, the one 3
# before it has its suit 12 times and each other suit 13 times, so the best such policy
# names another suit and is right 13/51 of the time: 48 answers of +-1/48 each.
MEMORYLESS_BEST = 13 / 51 - 38 / 51


def test_the_best_a_policy_without_memory_can_expect():
    """MEMORYLESS_BEST, checked on the task: answering a suit other than the latest
    card's, over 300 episodes (the mean's standard error is about 0.008)."""
    env = gym.make(ENV)
    total = 0.0
    for seed in range(300):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step((obs + 1) % 4)
            total, done = total + reward, terminated or truncated
    env.close()
    assert abs(total / 300 - MEMORYLESS_BEST) < 0.02


def test_the_preset_learns_what_no_policy_without_memory_can(tmp_path, capsys):
    """The preset through the CLI, 16k steps (a few seconds; 0.95 takes 33k-45k): its
    LSTM's training return and its checkpoint's evaluation both beat the best a policy
    without memory can expect, by 0.4 (6 standard errors of a 4-episode mean; seeds 0-4
    ended at 0.05-0.09 in training, 0.17-0.25 in evaluation)."""
    preset = preset_for(ENV)
    assert preset["policy_core"] == "lstm" and preset["solve_return"] == 0.95
    run = tmp_path / "run"
    steps = 16384
    args = [ENV, "--logdir", str(run), "--no-progress", "--no-tensorboard", "--total-steps", str(steps)]
    assert cli_main("train", args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["policy"].startswith("mlp+lstm+categorical") and result["env_steps"] == steps
    assert result["episodes"] == preset["num_envs"] * (steps // preset["num_envs"] // 51)  # every one 51 steps
    assert result["final_mean_return"] > MEMORYLESS_BEST + 0.4, result
    assert cli_main("eval", [str(run), "--episodes", "4"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["episodes"] == 4 and ev["mean_length"] == 51.0
    assert ev["mean_return"] > MEMORYLESS_BEST + 0.4, ev


def test_fastvec_train_imports_without_popgym(tmp_path):
    """Where popgym cannot be imported, ``fastvec.train`` imports, CartPoleNoVel-v1 is
    still registered and no popgym id is (run outside the source tree, whose unbuilt
    ``fastvec`` would shadow the installed one)."""
    code = (
        "import sys; sys.modules['popgym'] = None\n"
        "import gymnasium as gym, fastvec.train\n"
        "from fastvec.train.config import presets\n"
        "print(presets.HAS_POPGYM, 'CartPoleNoVel-v1' in gym.registry, any(k.startswith('popgym') for k in gym.registry))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "False"]
