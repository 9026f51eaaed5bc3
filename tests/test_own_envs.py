"""Envs of the user's own, named ``MODULE:ENV_ID`` (gymnasium's syntax: the module
registers the id on import) or ``MODULE:CALLABLE`` (an entry point, with its settings):
trained, evaluated, resumed, benched and tuned by the real ``fastvec`` command from a
fresh interpreter that finds the module on its ``PYTHONPATH``; the envs the workers
build replayed step by step against ``gymnasium.make`` (or the entry point) by hand;
every bad input one line, before any worker starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from helpers import one_line_error

import fastvec
from fastvec.env_ids import env_problem, own_env_kind, parse_settings
from fastvec.train.config.presets import env_factory

# Where this process imports fastvec from (the installed package under CI, a built
# source tree while developing): the fresh interpreters import the same one.
ROOT = Path(fastvec.__file__).resolve().parent.parent
MOD = "fvown"  # the module the tests write; it registers FvOwnDrift-v0
ENV_ID = f"{MOD}:FvOwnDrift-v0"
ENTRY = f"{MOD}:make_drift"

# A point on a line pushed left, not at all or right (speed per step, some noise from
# the env's own generator) towards a goal: +1 and the end on reaching it, -0.01 a step
# until then, truncated after `limit` steps. A goal beyond [-1, 1] is never reached: every
# episode then returns -0.01 * limit in exactly `limit` steps.
SOURCE = """
import gymnasium as gym
import numpy as np


class Drift(gym.Env):
    def __init__(self, speed=0.1, goal=0.5, limit=40):
        self.speed, self.goal, self.limit = float(speed), float(goal), int(limit)
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(3)

    def _obs(self):
        return np.array([self.x, self.goal - self.x], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = float(self.np_random.uniform(-0.5, 0.5)), 0
        return self._obs(), {}

    def step(self, action):
        push = self.speed * (int(action) - 1) + self.np_random.normal(0.0, 0.02)
        self.x = float(np.clip(self.x + push, -1.0, 1.0))
        self.t += 1
        reached = abs(self.goal - self.x) < 0.05
        return self._obs(), 1.0 if reached else -0.01, reached, self.t >= self.limit, {}


gym.register("FvOwnDrift-v0", entry_point=__name__ + ":Drift")


def make_drift(speed, goal=0.5, limit=40):
    return Drift(speed, goal, limit)


def not_an_env():
    return 42


NOT_CALLABLE = 3
"""


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory) -> Path:
    """A folder holding the env module (and one whose import fails)."""
    d = tmp_path_factory.mktemp("own_envs")
    (d / f"{MOD}.py").write_text(textwrap.dedent(SOURCE))
    (d / "fvbroken.py").write_text("import fvown_missing_dependency  # noqa\n")
    return d


@pytest.fixture
def on_path(env_dir, monkeypatch) -> Path:
    monkeypatch.syspath_prepend(str(env_dir))
    return env_dir


def fastvec_cmd(args: list[str], cwd: Path, env_dir: Path | None, timeout: float = 300):
    """``python -m fastvec ARGS`` in a fresh interpreter; ``env_dir`` on its PYTHONPATH
    (None: the env module is not to be found)."""
    path = [str(ROOT)] if env_dir is None else [str(env_dir), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run(
        [sys.executable, "-m", "fastvec", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def last_json(out) -> dict:
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


SMALL_RUN = ["--num-envs", "4", "--num-workers", "1", "--no-progress", "--no-tensorboard", "--device", "cpu"]
SMALL_RUN += ["--set", "n_steps=64", "--set", "minibatch_size=128", "--set", "n_epochs=2"]


def load(run_dir) -> dict:
    from fastvec.train import load_checkpoint

    return load_checkpoint(str(run_dir))


# ------------------------------------------------------------------ the workers' envs, replayed
@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("form", ["id", "entry"])
def test_workers_envs_replay_gymnasium_make(on_path, form, context):
    """The envs fastvec's workers build from ``env_factory`` step exactly as the env
    made here by hand (``gymnasium.make("module:EnvId")``, or the entry point called with
    the same settings), seeded alike, on the same actions, resets included."""
    import importlib

    kwargs = {} if form == "id" else {"speed": 0.25, "goal": -0.3, "limit": 17}
    env_id = ENV_ID if form == "id" else ENTRY
    assert own_env_kind(env_id) == form
    n, steps, seed = 3, 90, 11
    venv = fastvec.AsyncVectorEnv(
        [env_factory(env_id, kwargs)] * n, num_workers=2, context=context, autoreset_mode="SameStep"
    )
    mod = importlib.import_module(MOD)
    refs = [gym.make(ENV_ID) if form == "id" else mod.make_drift(**kwargs) for _ in range(n)]
    actions = np.random.default_rng(5).integers(0, 3, size=(steps, n))
    try:
        obs, _ = venv.reset(seed=seed)
        ref_obs = np.stack([r.reset(seed=seed + i)[0] for i, r in enumerate(refs)])
        np.testing.assert_array_equal(obs, ref_obs)
        ends = 0
        for t in range(steps):
            obs, rew, term, trunc, info = venv.step(actions[t])
            for i, r in enumerate(refs):
                o, rr, te, tr, _ = r.step(int(actions[t, i]))
                assert (rew[i], term[i], trunc[i]) == (rr, te, tr), (t, i)
                if te or tr:
                    np.testing.assert_array_equal(info["final_obs"][i], o)
                    o, _ = r.reset()
                    ends += 1
                np.testing.assert_array_equal(obs[i], o, err_msg=f"step {t}, env {i}")
        assert ends >= n  # the replay went through resets
    finally:
        venv.close()
        for r in refs:
            r.close()


# ------------------------------------------------------------------ the command, from a fresh shell
def test_train_eval_resume_from_a_fresh_shell(env_dir, tmp_path):
    """``fastvec train module:EnvId`` in a fresh interpreter (the module found on
    PYTHONPATH only), its run named after the id, evaluated and resumed the same way; a
    shell without the module gets one line, exit 2, from eval and from resume."""
    first = last_json(
        fastvec_cmd(["train", ENV_ID, "--total-steps", "512", "--seed", "3", *SMALL_RUN], tmp_path, env_dir)
    )
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("fvown_FvOwnDrift-v0-seed3-"), runs
    run = runs[0]
    assert first["env_steps"] == 512
    ckpt = load(run)
    assert (ckpt["env_id"], ckpt["env_kwargs"], ckpt.get("mix")) == (ENV_ID, {}, None)

    ev = last_json(fastvec_cmd(["eval", str(run), "--episodes", "6"], tmp_path, env_dir))
    assert (ev["env_id"], ev["episodes"]) == (ENV_ID, 6)
    assert 1 <= ev["mean_length"] <= 40  # Drift's default limit

    again = last_json(fastvec_cmd(["train", "--resume", str(run), "--total-steps", "1024"], tmp_path, env_dir))
    assert again["env_steps"] == 1024
    assert load(run)["env_steps"] == 1024

    for args in (["eval", str(run)], ["train", "--resume", str(run), "--total-steps", "2048"]):
        out = fastvec_cmd(args, tmp_path, None)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "cannot import fvown (ModuleNotFoundError: No module named 'fvown')" in out.stderr


def test_entry_point_with_env_kwargs_on_spawned_workers(env_dir, tmp_path):
    """``module:callable --env-kwargs ...`` with ``--set context=spawn``: the workers
    import the module themselves and build the env with the settings (a goal out of
    reach: every episode lasts exactly ``limit`` steps and returns ``-0.01 * limit``);
    the checkpoint keeps them and ``fastvec eval`` rebuilds the env with them."""
    run = tmp_path / "entry"
    kwargs = "speed=0.2,goal=5.0,limit=25"
    args = ["train", ENTRY, "--env-kwargs", kwargs, "--set", "context=spawn", "--logdir", str(run)]
    res = last_json(fastvec_cmd([*args, "--total-steps", "512", *SMALL_RUN], tmp_path, env_dir))
    assert res["env_steps"] == 512
    assert res["final_mean_return"] == pytest.approx(-0.25)
    ckpt = load(run)
    assert (ckpt["env_id"], ckpt["env_kwargs"]) == (ENTRY, {"speed": 0.2, "goal": 5.0, "limit": 25})
    ev = last_json(fastvec_cmd(["eval", str(run), "--episodes", "4"], tmp_path, env_dir))
    assert (ev["mean_length"], ev["min_return"], ev["max_return"]) == (25.0, pytest.approx(-0.25), pytest.approx(-0.25))


def test_mix_naming_own_envs(env_dir, tmp_path):
    """``--mix`` groups of the registered id and of the entry point with its settings:
    the checkpoint keeps both, and eval's per-group returns show the entry point's
    settings reached its envs (an unreachable goal, 10 steps: -0.1 an episode)."""
    run = tmp_path / "mix"
    mix = ["--mix", "count=2", "--mix", f"id={ENTRY},count=2,speed=0.2,goal=5.0,limit=10"]
    res = last_json(
        fastvec_cmd(
            ["train", ENV_ID, *mix, "--logdir", str(run), "--total-steps", "512", *SMALL_RUN], tmp_path, env_dir
        )
    )
    assert res["env_steps"] == 512
    assert load(run)["mix"] == [
        {"env_id": ENV_ID, "env_kwargs": {}, "count": 2},
        {"env_id": ENTRY, "env_kwargs": {"speed": 0.2, "goal": 5.0, "limit": 10}, "count": 2},
    ]
    ev = last_json(fastvec_cmd(["eval", str(run), "--episodes", "8"], tmp_path, env_dir))
    assert [g["env_id"] for g in ev["groups"]] == [ENV_ID, ENTRY]
    assert ev["groups"][1]["mean_return"] == pytest.approx(-0.1)


def test_bench_and_tune_take_own_envs(env_dir, tmp_path):
    """``fastvec bench`` and ``fastvec tune`` on both forms; ``make_drift`` needs its
    ``speed``, so the entry point runs only where ``--env-kwargs`` reached it."""
    bench = fastvec_cmd(
        ["bench", ENTRY, "--env-kwargs", "speed=0.2", "--num-envs", "2", "--steps", "50", "--repeats", "1"],
        tmp_path,
        env_dir,
    )
    assert bench.returncode == 0, bench.stderr
    assert bench.stdout.startswith(f"{ENTRY}, 2 envs")
    tune = fastvec_cmd(["tune", ENV_ID, "--num-envs", "2", "--seconds", "0.05", "--no-batches"], tmp_path, env_dir)
    assert tune.returncode == 0, tune.stderr
    assert tune.stdout.startswith(f"fastvec tune {ENV_ID}, 2 envs")
    for cmd in ("bench", "tune"):
        out = fastvec_cmd([cmd, ENTRY, "--num-envs", "2"], tmp_path, env_dir)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "make_drift() missing 1 required positional argument: 'speed'" in out.stderr


def test_console_script_finds_a_module_in_the_current_folder(env_dir):
    """The ``fastvec`` console script (whose path holds its own folder, not the current
    one) finds the env module in the folder it runs from, as ``python -m fastvec`` does."""
    script = shutil.which("fastvec", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("no fastvec console script beside this interpreter")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["bench", ENV_ID, "--num-envs", "2", "--steps", "10", "--repeats", "1"]
    out = subprocess.run([script, *args], capture_output=True, text=True, timeout=300, cwd=env_dir, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{ENV_ID}, 2 envs")


# ------------------------------------------------------------------ bad input
BAD = [
    ("fvown_nowhere:X-v0", "cannot import fvown_nowhere (ModuleNotFoundError: No module named 'fvown_nowhere')"),
    ("fvbroken:X-v0", "cannot import fvbroken (ModuleNotFoundError: No module named 'fvown_missing_dependency')"),
    (f"{MOD}:FvOwnDrift-v9", "importing fvown registered no env id 'FvOwnDrift-v9' (it registers FvOwnDrift-v0)"),
    (f"{MOD}:nothing_here", "'nothing_here' is neither an env id fvown registers nor a callable in it (fvown has no"),
    (f"{MOD}:NOT_CALLABLE", "(fvown.NOT_CALLABLE is of type int; it registers FvOwnDrift-v0)"),
    (f"{MOD}:not_an_env", "fvown:not_an_env returned an object of type int, not a gymnasium.Env"),
    (f"{MOD}:make_drift", "TypeError: make_drift() missing 1 required positional argument: 'speed'"),
    (f"{MOD}:a:b", "'fvown:a:b' is not an env of your own: write MODULE:ENV_ID"),
]


@pytest.fixture
def no_workers(monkeypatch):
    """Any worker started fails the test (bad input is refused before)."""
    from fastvec._core import supervisor

    def spawn(*args, **kwargs):
        raise AssertionError("a worker started")

    monkeypatch.setattr(supervisor.Supervisor, "spawn", spawn)


@pytest.mark.parametrize("env_id,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_one_line_before_any_worker(on_path, no_workers, env_id, needle, capsys, tmp_path):
    from fastvec.bench import main as bench_main
    from fastvec.train.commands.cli import main as cli_main
    from fastvec.tune import main as tune_main

    assert needle in env_problem(env_id)
    run = ["--total-steps", "256", "--logdir", str(tmp_path / "r"), *SMALL_RUN]
    one_line_error(capsys, cli_main("train", [env_id, *run]), needle)
    one_line_error(
        capsys, cli_main("train", ["CartPole-v1", "--mix", "count=2", "--mix", f"id={env_id}", *run]), needle
    )
    one_line_error(capsys, bench_main("bench", [env_id]), needle)
    with pytest.raises(SystemExit) as stop:
        tune_main("tune", [env_id])
    one_line_error(capsys, stop.value.code, needle)
    assert not (tmp_path / "r").exists()


def test_env_kwargs_text(capsys):
    assert parse_settings("speed=0.2,goal=-1,name=far,on=true,sizes=[1, 2]") == {
        "speed": 0.2,
        "goal": -1,
        "name": "far",
        "on": True,
        "sizes": [1, 2],
    }
    from fastvec.bench import main as bench_main
    from fastvec.train.commands.cli import main as cli_main

    for argv, needle in (
        (["--env-kwargs", "speed"], "argument --env-kwargs: expected key=value[,key=value...], got 'speed'"),
        (["--env-kwargs", "a=1,a=2"], "argument --env-kwargs: 'a=1,a=2' gives a twice"),
    ):
        with pytest.raises(SystemExit) as stop:
            cli_main("train", ["CartPole-v1", *argv])
        one_line_error(capsys, stop.value.code, needle)
        one_line_error(capsys, bench_main("bench", ["CartPole-v1", *argv]), needle)
    one_line_error(
        capsys,
        cli_main("train", ["CartPole-v1", "--env-kwargs", "a=1", "--mix", "count=8"]),
        "give env_kwargs or a mix, not both",
    )
