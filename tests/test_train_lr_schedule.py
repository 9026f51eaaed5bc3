"""The learning rate's schedules (``PPOConfig.lr_schedule``): linear (the default, as
before), constant, and adaptive (the rate follows the update's approximate KL).

References: the adaptive rule against a sequence computed by hand; its direction on real
CartPole runs with absurd targets (both learners); a resumed run against the same run
uninterrupted; the default against the linear decay written out, and against the old
``anneal_lr`` spellings, bit for bit.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from fastvec.engine import Engine
from fastvec.train import PPO, ConfigError, EngineStorage, PPOConfig, apply_overrides
from fastvec.train.algo.checkpoints import load_checkpoint, policy_from_checkpoint, save_checkpoint
from fastvec.train.algo.optim import LRSchedule, adapt_lr, mean_kl
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.commands.cli import run_training
from fastvec.train.config.overrides import FIELD_KINDS, check_resume_config
from fastvec.train.config.presets import env_factory, preset_for
from fastvec.train.run.loop import run_env_seeds


# =============================================================================== the rule
def test_adaptive_rule_against_a_hand_computed_sequence():
    """target 0.01 (band [0.005, 0.02]), factor 1.5, bounds [1e-4, 4e-3], from 1e-3."""
    steps = [
        (0.05, 1e-3 / 1.5),  # above 2 x target: divided
        (0.02, 1e-3 / 1.5),  # on the band's edge: kept
        (0.0201, 1e-3 / 1.5 / 1.5),
        (0.01, 1e-3 / 1.5 / 1.5),  # inside: kept
        (0.005, 1e-3 / 1.5 / 1.5),  # on the lower edge: kept
        (0.004, 1e-3 / 1.5),  # below target / 2: multiplied
        (0.0, 1e-3),
        (float("nan"), 1e-3),  # not measured: kept
        (0.001, 1.5e-3),
        (0.001, 2.25e-3),
        (0.001, 3.375e-3),
        (0.001, 4e-3),  # 5.0625e-3 clamped to lr_max
        (0.001, 4e-3),
    ]
    lr = 1e-3
    for kl, want in steps:
        lr = adapt_lr(lr, kl, 0.01, 1.5, 1e-4, 4e-3)
        assert lr == pytest.approx(want, rel=1e-12), (kl, lr, want)
    for k in range(1, 12):  # a run of large KLs: 4e-3 / 1.5**k until lr_min (k = 10: 6.9e-5)
        lr = adapt_lr(lr, 1.0, 0.01, 1.5, 1e-4, 4e-3)
        assert lr == pytest.approx(max(4e-3 / 1.5**k, 1e-4), rel=1e-12), k
    assert lr == 1e-4


def test_linear_and_constant_rates_and_the_state():
    cfg = PPOConfig(lr=2e-3, total_steps=1000)
    lin = LRSchedule(cfg, num_updates=8)
    assert [lin.rate(u) for u in (0, 2, 4, 8, 9)] == [2e-3, 2e-3 * 0.75, 2e-3 * 0.5, 0.0, 0.0]
    lin.observe(1.0)  # the KL moves only the adaptive rate
    assert lin.rate(2) == 2e-3 * 0.75
    const = LRSchedule(PPOConfig(lr=2e-3, lr_schedule="constant"), 8)
    assert [const.rate(u) for u in (0, 5, 100)] == [2e-3] * 3
    ada = LRSchedule(PPOConfig(lr=2e-3, lr_schedule="adaptive"), 8)
    ada.observe(1.0)
    assert ada.rate(0) == ada.rate(7) == 2e-3 / 1.5
    again = LRSchedule(PPOConfig(lr=2e-3, lr_schedule="adaptive"), 8)
    again.load(ada.state())
    assert again.rate(3) == 2e-3 / 1.5
    again.load(None)  # a checkpoint from before the schedules kept a state
    assert again.rate(3) == 2e-3 / 1.5


def test_mean_kl_of_either_learner():
    assert mean_kl([0.25, 0.5, 0.75]) == 0.5
    assert mean_kl([torch.tensor(0.25), torch.tensor(0.5), torch.tensor(0.75)]) == 0.5
    assert math.isnan(mean_kl([]))


# =============================================================================== real runs
def cartpole(**changes) -> PPOConfig:
    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(cfg, {"device": "cpu", "torch_threads": 1, "seed": 5, "total_steps": 20_000, **changes})
    return cfg.validate()


def engine_storage(cfg: PPOConfig) -> EngineStorage:
    fns = [env_factory("CartPole-v1", {})] * cfg.num_envs
    eng = Engine(fns, num_workers=cfg.num_workers, num_slots=cfg.n_steps + 1, autoreset_mode="same_step")
    return EngineStorage(eng)


def iterate(ppo: PPO, n: int) -> list[float]:
    """n rollouts and updates as the training loop runs them; the rate of each update."""
    rates = []
    for _ in range(n):
        ppo.collect()
        ppo.prepare()
        ppo.update()
        ppo.rollout.obs[0].copy_(ppo.rollout.obs[ppo.T])
        rates.append(ppo.last_stats[1])
    return rates


def run(cfg: PPOConfig, n: int) -> tuple[PPO, list[float]]:
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    st = engine_storage(cfg)
    try:
        ppo = PPO(cfg, st, torch.device("cpu"))
        st.reset(cfg.seed)
        return ppo, iterate(ppo, n)
    finally:
        st.close()


@pytest.mark.parametrize("learner", ["numpy", "torch"])
def test_adaptive_rate_falls_to_lr_min_and_rises_to_lr_max(learner):
    """A target no update can meet (1e-9) divides the rate by 1.5 after every update down
    to lr_min; one every update is below (1e3) multiplies it up to lr_max. The rate each
    update used is what ``losses/learning_rate`` reports."""
    down = cartpole(learner=learner, lr_schedule="adaptive", lr=5e-3, lr_kl_target=1e-9, lr_min=1e-3)
    ppo, rates = run(down, 6)
    assert (ppo.np_learner is not None) == (learner == "numpy")
    assert rates == pytest.approx([max(5e-3 / 1.5**k, 1e-3) for k in range(6)], rel=1e-12)
    assert rates[-1] == 1e-3 and ppo.summarize()["losses/learning_rate"] == 1e-3
    assert ppo.summarize()["losses/approx_kl"] > 2e-9

    up = cartpole(learner=learner, lr_schedule="adaptive", lr=1e-3, lr_kl_target=1e3, lr_max=5e-3)
    ppo, rates = run(up, 6)
    assert rates == pytest.approx([min(1e-3 * 1.5**k, 5e-3) for k in range(6)], rel=1e-12)
    assert rates[-1] == 5e-3 and ppo.summarize()["losses/learning_rate"] == 5e-3


def test_adaptive_rate_holds_in_the_band():
    """The rule reads the update's own KL: a target set to the KL the first update
    measures (the same run, so the same first update) keeps the rate."""
    cfg = cartpole(lr_schedule="adaptive", lr=1e-3, lr_kl_target=1e3)
    ppo, _ = run(cfg, 1)
    kl = ppo.summarize()["losses/approx_kl"]
    steady = cartpole(lr_schedule="adaptive", lr=1e-3, lr_kl_target=kl)  # the first update's KL is in its band
    _, rates = run(steady, 2)
    assert rates == [1e-3, 1e-3]


def test_resumed_run_continues_the_adaptive_rate(tmp_path):
    """N updates, a checkpoint, M more in the same process; a fresh PPO from the file runs
    the same M: the same rates and the same weights. Without the schedule's state the
    resumed rate would be ``lr`` again (checked, so the comparison can fail)."""
    N, M = 3, 3
    cfg = cartpole(lr_schedule="adaptive", lr=5e-3, lr_kl_target=1e-9, lr_min=1e-4)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    st = engine_storage(cfg)
    try:
        ppo = PPO(cfg, st, torch.device("cpu"))
        st.reset(run_env_seeds(cfg, ppo))
        iterate(ppo, N)
        path = save_checkpoint(str(tmp_path / "c.pt"), ppo, "CartPole-v1", {}, train_state=ppo.train_state())
        ppo.restart_envs(run_env_seeds(cfg, ppo, resumed=True))
        ref_rates = iterate(ppo, M)
        ref_params = ppo.flat_param.detach().clone()
    finally:
        st.close()
    assert ref_rates == pytest.approx([5e-3 / 1.5**k for k in range(N, N + M)], rel=1e-12)

    ckpt = load_checkpoint(path)
    st2 = engine_storage(cfg)
    try:
        pol = policy_from_checkpoint(ckpt)
        pol.train()
        ppo2 = PPO(cfg, st2, torch.device("cpu"), pol)
        ppo2.load_train_state(ckpt["train_state"])
        ppo2.restart_envs(run_env_seeds(cfg, ppo2, resumed=True))
        assert iterate(ppo2, M) == ref_rates
        assert torch.equal(ppo2.flat_param.detach(), ref_params)
    finally:
        st2.close()
    bare = LRSchedule(cfg, 1)
    bare.load(None)  # a train state without the schedule's
    assert bare.rate(N) == 5e-3 != ref_rates[0]


def test_adaptive_rate_in_metrics_and_tensorboard_and_resumed(tmp_path):
    """``fastvec train``'s logs carry the adaptive rate (``losses/learning_rate``) at every
    logging point; a run stopped and resumed (the loop's stop hook, as Ctrl-C) logs the
    rate going on from where it was."""
    run_dir = str(tmp_path / "run")
    cfg = cartpole(
        lr_schedule="adaptive",
        lr=5e-3,
        lr_kl_target=1e-9,
        lr_min=1e-4,
        total_steps=8 * 256,
        log_every_s=1e-6,
        checkpoint_every=0,
        stop_at_return=1e9,
    )
    calls = {"n": 0}

    def stop():
        calls["n"] += 1
        return calls["n"] > 3

    assert run_training("CartPole-v1", cfg, run_dir=run_dir, progress=False, stop=stop)["updates"] == 3
    assert run_training(resume=run_dir, progress=False)["updates"] == 7  # the last rollout is not learned
    # a row per update (the k-th at (k + 1) x 256 steps), and one at the end repeating the last
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    logged = [r["losses/learning_rate"] for r in rows if r["env_steps"] <= 7 * 256 and "losses/learning_rate" in r]
    assert logged == pytest.approx([5e-3 / 1.5**k for k in range(7)], rel=1e-12)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir)
    acc.Reload()
    tb = [e.value for e in acc.Scalars("losses/learning_rate") if e.step <= 7 * 256]
    assert tb == pytest.approx([5e-3 / 1.5**k for k in range(7)], rel=1e-6)  # float32 in the event file


# =============================================================================== unchanged default
def test_default_schedule_is_the_old_linear_decay_bit_for_bit():
    """The default config decays as ``lr * max(1 - u / num_updates, 0)`` (the expression
    PPO computed before the schedules had names), and learns the same weights as the
    schedule spelled out: ``lr_schedule=linear`` and ``anneal_lr=true``, and
    ``anneal_lr=false`` as ``lr_schedule=constant``."""
    base = {"lr": 2e-3, "total_steps": 5 * 8 * 32}  # 5 updates: the rate reaches 0 at the 6th
    default = cartpole(**base)
    default.lr_schedule = PPOConfig().lr_schedule  # the preset's anneal_lr=false undone: the default schedule
    ppo, rates = run(default, 6)
    assert rates == [2e-3 * max(1.0 - u / 5, 0.0) for u in range(6)]
    ref = ppo.flat_param.detach().clone()
    for spelled in ({"lr_schedule": "linear"}, {"anneal_lr": True}):
        ppo, _ = run(cartpole(**base, **spelled), 6)
        assert torch.equal(ppo.flat_param.detach(), ref), spelled
    ppo, rates = run(cartpole(**base, anneal_lr=False), 3)
    assert rates == [2e-3] * 3
    ref = ppo.flat_param.detach().clone()
    ppo, _ = run(cartpole(**base, lr_schedule="constant"), 3)
    assert torch.equal(ppo.flat_param.detach(), ref)


# =============================================================================== the horizon
def test_lr_horizon_makes_a_short_run_the_long_runs_beginning():
    """With ``lr_horizon`` the linear rate no longer depends on the budget: a run told 3
    updates learns, update for update, the first 3 of a run told 6; without it the two
    differ from the first update (the rate decays over each one's own total_steps)."""
    batch = 8 * 32  # the CartPole preset's rollout
    horizon = {"lr": 2e-3, "lr_schedule": "linear", "lr_horizon": 6 * batch}
    short, short_rates = run(cartpole(**horizon, total_steps=3 * batch), 3)
    long, long_rates = run(cartpole(**horizon, total_steps=6 * batch), 3)
    assert short_rates == long_rates == [2e-3 * (1 - u / 6) for u in range(3)]
    assert torch.equal(short.flat_param.detach(), long.flat_param.detach())
    budget = {"lr": 2e-3, "lr_schedule": "linear"}
    short, short_rates = run(cartpole(**budget, total_steps=3 * batch), 3)
    assert short_rates == [2e-3 * (1 - u / 3) for u in range(3)]
    assert not torch.equal(short.flat_param.detach(), long.flat_param.detach())
    # a horizon past the budget: the rate never reaches 0 in this run
    assert run(cartpole(**horizon, total_steps=2 * batch), 2)[1] == long_rates[:2]


def test_lr_horizon_short_of_the_budget_is_said_and_not_safe_on_resume(tmp_path, capsys):
    argv = ["CartPole-v1", "--set", "lr_schedule=linear", "--set", "lr_horizon=4096", "--total-steps", "8192"]
    assert cli_main("train", [*argv, "--list-keys"]) == 0
    assert json.loads(capsys.readouterr().out)["lr_horizon"] == 4096
    run_dir = str(tmp_path / "run")
    assert cli_main("train", [*argv, "--logdir", run_dir, "--no-progress", "--no-tensorboard"]) == 0
    err = capsys.readouterr().err
    assert "note: the learning rate reaches 0 at lr_horizon=4,096 env steps; the last 4,096" in err
    rates = [json.loads(line).get("losses/learning_rate") for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r for r in rates if r is not None][-1] == 0.0
    with pytest.raises(ConfigError, match="it cannot change lr_horizon"):
        check_resume_config(PPOConfig(lr_horizon=4096), PPOConfig(lr_horizon=8192))
    for bad in ("lr_horizon=0", "lr_horizon=-5", "lr_horizon=1.5"):
        assert cli_main("train", ["CartPole-v1", "--set", bad, "--list-keys"]) == 2
        err = capsys.readouterr().err.strip()
        assert "lr_horizon" in err and "\n" not in err, err


# =============================================================================== config
def test_anneal_lr_is_the_older_spelling():
    assert PPOConfig().lr_schedule == "linear" and PPOConfig().anneal_lr is True
    assert PPOConfig(anneal_lr=False).lr_schedule == "constant"
    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))  # a preset that says anneal_lr=False
    assert cfg.lr_schedule == "constant"
    apply_overrides(cfg, ["lr_schedule=adaptive"])  # later levels win, as for any key
    assert (cfg.lr_schedule, cfg.anneal_lr) == ("adaptive", False)
    apply_overrides(cfg, ["anneal_lr=false"])  # no linear decay: adaptive stays
    assert cfg.lr_schedule == "adaptive"
    apply_overrides(cfg, ["anneal_lr=true"])
    assert cfg.lr_schedule == "linear"
    # checkpoints: an old config dict (anneal_lr only) loads; a new one writes both, consistently
    old = {k: v for k, v in PPOConfig().to_dict().items() if k == "anneal_lr" or not k.startswith("lr_")}
    assert PPOConfig.from_dict({**old, "anneal_lr": False}).lr_schedule == "constant"
    ada = PPOConfig(lr_schedule="adaptive", lr_kl_target=0.02)
    d = ada.to_dict()
    assert (d["anneal_lr"], d["lr_schedule"], d["lr_kl_target"]) == (False, "adaptive", 0.02)
    assert list(d).index("anneal_lr") == list(d).index("lr") + 1 and "lr_schedule" in FIELD_KINDS
    assert PPOConfig.from_dict(d) == ada


@pytest.mark.parametrize(
    "items, msg",
    [
        (["lr_schedule=cosine"], "lr_schedule must be one of linear, constant, adaptive, got 'cosine'"),
        (["lr_kl_target=0"], "lr_kl_target must be a positive number, got 0.0"),
        (["lr_kl_target=-0.01"], "lr_kl_target must be a positive number"),
        (["lr_factor=1"], "lr_factor must be a number above 1, got 1.0"),
        (["lr_factor=0.5"], "lr_factor must be a number above 1"),
        (["lr_min=0"], "lr_min must be a positive number"),
        (["lr_max=inf"], "lr_max must be a positive number"),
        (["lr_min=1e-2", "lr_max=1e-3"], "lr_min=0.01 exceeds lr_max=0.001"),
        (["lr_schedule=adaptive", "lr=0.1"], r"lr=0.1 is outside \[lr_min, lr_max\] = \[1e-06, 0.01\]"),
        (["anneal_lr=true", "lr_schedule=adaptive"], "anneal_lr=true contradicts lr_schedule=adaptive"),
        (["lr_schedule=linear", "anneal_lr=false"], "anneal_lr=false contradicts lr_schedule=linear"),
        (["anneal_lr=maybe"], r"bad value for anneal_lr: 'maybe' \(expected true or false\)"),
    ],
)
def test_bad_schedules_are_one_line_errors(items, msg):
    with pytest.raises(ConfigError, match=msg) as info:
        apply_overrides(PPOConfig(), items).validate()
    assert "\n" not in str(info.value)


def test_conflicting_pair_in_the_constructor_and_in_a_checkpoint():
    with pytest.raises(ConfigError, match="anneal_lr=true contradicts lr_schedule=constant"):
        PPOConfig(anneal_lr=True, lr_schedule="constant")
    with pytest.raises(ConfigError, match="anneal_lr=true contradicts lr_schedule=adaptive"):
        PPOConfig.from_dict({**PPOConfig().to_dict(), "lr_schedule": "adaptive"})
    assert PPOConfig(anneal_lr=False, lr_schedule="adaptive").lr_schedule == "adaptive"


def test_resume_may_not_change_the_schedule():
    run = PPOConfig(lr_schedule="adaptive")
    for change in (["lr_schedule=linear"], ["lr_kl_target=0.02"], ["lr_max=0.005"]):
        with pytest.raises(ConfigError, match=r"--resume continues the run's config; it cannot change .*lr_"):
            check_resume_config(run, apply_overrides(PPOConfig(lr_schedule="adaptive"), change))
    check_resume_config(PPOConfig.from_dict(run.to_dict()), run)


def test_cli_sets_the_schedule(capsys):
    assert cli_main("train", ["CartPole-v1", "--set", "lr_schedule=adaptive", "--list-keys"]) == 0
    keys = json.loads(capsys.readouterr().out)
    assert (keys["lr_schedule"], keys["anneal_lr"], keys["lr"]) == ("adaptive", False, 5e-3)
    assert (keys["lr_kl_target"], keys["lr_factor"], keys["lr_min"], keys["lr_max"]) == (0.008, 1.5, 1e-6, 1e-2)
    for argv, expect in (
        (["--set", "lr_schedule=adaptive", "--set", "anneal_lr=true"], "anneal_lr=true contradicts"),
        (["--set", "lr_schedule=warmup"], "lr_schedule must be one of"),
        (["--set", "lr_schedule=adaptive", "--set", "lr_min=1"], "lr_min=1.0 exceeds lr_max=0.01"),
    ):
        assert cli_main("train", ["CartPole-v1", *argv, "--list-keys"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("fastvec train: error: ") and expect in err and "\n" not in err, err
