"""``fastvec export``: a trained policy written as TorchScript and ONNX, run where fastvec
cannot be imported.

Tiny policies are trained here (CartPole's MLP with the observation normaliser, a CNN on
a small image env, LSTMs over both, HalfCheetah's Gaussian with its normaliser); 1,000
observations are recorded by running each env on the trainer's deterministic actions
(``ActorCritic.predict``), and the exported files' actions on them, computed in a child
process in which ``import fastvec`` fails, must equal those actions: exactly for
categorical actions, to float tolerance for Gaussian ones; a recurrent policy's state is
threaded through the steps by the child as a user would. CartPole's and HalfCheetah's
exported policies play 10 episodes in ONNX Runtime there with ``fastvec eval``'s seeds and
its way of spreading episodes over envs, and their returns must be ``fastvec eval``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from fastvec.cli import main as fastvec_main
from fastvec.train import (
    PPOConfig,
    apply_overrides,
    export_policy,
    load_checkpoint,
    policy_from_checkpoint,
    preset_for,
    run_training,
)
from fastvec.train.model.actor_critic import make_policy

# The child process: fastvec refused by a finder ahead of every other (CI installs fastvec
# into the environment, so ``-I`` and a working directory outside the tree are not enough
# on their own), then the exported files run with torch.jit.load and onnxruntime only.
CHILD = r'''
import importlib.abc, json, sys

class NoFastvec(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "fastvec":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoFastvec())
try:
    import fastvec  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("fastvec is importable in the child")

import numpy as np


def load(kind, path):
    """(run(*arrays) -> list of arrays, the file's fastvec metadata)."""
    if kind == "onnx":
        import onnxruntime as ort

        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        meta = json.loads(sess.get_modelmeta().custom_metadata_map["fastvec_policy"])
        return (lambda *xs: sess.run(None, dict(zip(names, xs)))), meta
    import torch

    extra = {"fastvec_policy.json": ""}
    module = torch.jit.load(path, _extra_files=extra)

    def run(*xs):
        with torch.no_grad():
            out = module(*[torch.from_numpy(x) for x in xs])
        return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]

    return run, json.loads(extra["fastvec_policy.json"])


def actions(job):
    policy, meta = load(job["kind"], job["model"])
    obs = np.load(job["obs"])
    if job["starts"] is None:
        return policy(obs)[0]
    starts = np.load(job["starts"])
    state = np.zeros((obs.shape[1], meta["state_size"]), np.float32)
    out = []
    for t in range(obs.shape[0]):
        state = state * ~starts[t][:, None]  # zeros where an episode starts
        act, state = policy(obs[t], state)
        out.append(act)
    return np.stack(out)


def episodes(job):
    """fastvec eval's scheme: min(episodes, 8) envs, each its share of the episodes, one seeded reset."""
    import gymnasium as gym

    policy, meta = load("onnx", job["model"])
    count, n = job["episodes"], min(job["episodes"], 8)
    venv = gym.vector.SyncVectorEnv(
        [lambda: gym.make(meta["env_id"], **meta["env_kwargs"])] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    targets = np.array([(count + i) // n for i in range(n)])
    done, ep_ret, ep_len = np.zeros(n, np.int64), np.zeros(n), np.zeros(n, np.int64)
    returns, lengths = [], []
    obs, _ = venv.reset(seed=job["seed"])
    while (done < targets).any():
        act = policy(obs)[0]
        if isinstance(venv.single_action_space, gym.spaces.Box):
            act = act.astype(venv.single_action_space.dtype)
        obs, r, term, trunc, _ = venv.step(act)
        ep_ret += r
        ep_len += 1
        for i in np.flatnonzero(term | trunc):
            if done[i] < targets[i]:
                returns.append(float(ep_ret[i]))
                lengths.append(int(ep_len[i]))
                done[i] += 1
            ep_ret[i], ep_len[i] = 0.0, 0
    venv.close()
    return {"returns": returns, "lengths": lengths}


job = json.load(open(sys.argv[1]))
if job["what"] == "actions":
    np.save(job["out"], actions(job))
else:
    json.dump(episodes(job), open(job["out"], "w"))
assert not [m for m in sys.modules if m.split(".")[0] == "fastvec"]
'''

RECORDED = 1000  # observations per policy
# The kinds whose briefly trained actions turn on the image (cnn) and on the state (lstm),
# so that a wrong input or a dropped state changes them. The CNN+LSTM, trained as briefly
# under the run's env seeds, plays one action on every seed tried (1-6): its parity still
# runs the whole graph, state and all, but only the two kinds above can show a wrong input.
TURNING = {"mlp", "cnn", "lstm"}
KINDS = {  # name: (env maker, envs for the recording, config overrides)
    "mlp": ("CartPole-v1", 1, ["normalize_obs=true"]),
    "cnn": ("image", 1, []),
    "lstm": ("CartPole-v1", 4, ["policy_core=lstm", "core_size=16", "bptt=16"]),
    "cnn+lstm": ("image", 4, ["policy_core=lstm", "core_size=16", "bptt=8"]),
    "gaussian": ("HalfCheetah-v5", 1, []),
}


class SideEnv(gym.Env):
    """36x36 two-channel images (channels last), each half of a random brightness; the reward is 1 where the action
    names the brighter half of the image seen one step before, so a policy's actions turn
    on what it sees and on what it remembers. Episodes of 5-20 steps."""

    observation_space = gym.spaces.Box(0, 255, (36, 36, 2), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def _image(self):
        """Each half one random level, with noise."""
        left, right = self.np_random.integers(0, 224, 2)
        img = self.np_random.integers(0, 32, (36, 36, 2), dtype=np.uint8)
        img[:, :18] += np.uint8(left)
        img[:, 18:] += np.uint8(right)
        self.prev, self.img = self.img, img
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length, self.img = 0, int(self.np_random.integers(5, 21)), None
        return self._image(), {}

    def step(self, action):
        self.t += 1
        obs = self._image()
        brighter = int(self.prev[:, 18:].mean() > self.prev[:, :18].mean())
        return obs, float(int(action) == brighter), self.t >= self.length, False, {}


def _image_env():
    return SideEnv()


def _train(name: str, run_dir: str) -> str:
    """A briefly trained run of policy kind ``name`` in ``run_dir``."""
    env, _n, sets = KINDS[name]
    cfg = apply_overrides(PPOConfig(), preset_for(env) if env != "image" else {})
    apply_overrides(cfg, ["num_envs=4", "n_steps=64", "total_steps=1024", "n_epochs=2", "minibatch_size=64"])
    apply_overrides(cfg, ["device=cpu", "seed=3", "checkpoint_every=0", *sets])
    if env == "image":
        venv = gym.vector.SyncVectorEnv([_image_env] * 4, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        try:
            run_training(None, cfg.validate(), venv=venv, run_dir=run_dir, progress=False, tensorboard=False)
        finally:
            venv.close()
    else:
        run_training(env, cfg.validate(), run_dir=run_dir, progress=False, tensorboard=False)
    return run_dir


def _record(name: str, run_dir: str):
    """``RECORDED`` observations of the env run on the trained policy's deterministic
    actions: (observations, where episodes start or None, the policy's actions). A
    recurrent policy's are ``[T, n, ...]`` over ``n`` envs, its state zeroed at starts."""
    env, n, _sets = KINDS[name]
    pol = policy_from_checkpoint(load_checkpoint(run_dir))
    fn = _image_env if env == "image" else (lambda: gym.make(env))
    venv = gym.vector.SyncVectorEnv([fn] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    state = torch.zeros(n, pol.state_size) if pol.recurrent else None
    obs_seen, starts, acts = [], [], []
    obs, _ = venv.reset(seed=11)
    start = np.ones(n, bool)
    for _t in range(RECORDED // n):
        if state is not None:
            state[torch.from_numpy(start)] = 0.0
        act = pol.predict(obs, deterministic=True, state=state)
        obs_seen.append(obs)
        starts.append(start)
        acts.append(act)
        obs, _r, term, trunc, _ = venv.step(act.astype(venv.single_action_space.dtype))
        start = term | trunc
    venv.close()
    if pol.recurrent:
        return np.stack(obs_seen), np.stack(starts), np.stack(acts)
    return np.concatenate(obs_seen), None, np.concatenate(acts)


def _forgetful(run_dir: str, obs) -> list:
    """A recurrent policy's deterministic actions on ``obs`` ``[T, n, ...]`` fed a zero
    state at every step."""
    pol = policy_from_checkpoint(load_checkpoint(run_dir))
    return [pol.predict(o, state=torch.zeros(o.shape[0], pol.state_size)).tolist() for o in obs]


def _child(tmp_path, job: dict) -> None:
    """Run ``CHILD`` on ``job`` in a fresh interpreter (``-I``: no PYTHONPATH, no user site,
    not the script's folder) started outside the source tree."""
    script, spec = tmp_path / "child.py", tmp_path / "job.json"
    script.write_text(CHILD)
    spec.write_text(json.dumps(job))
    proc = subprocess.run(
        [sys.executable, "-I", str(script), str(spec)], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each kind's trained run directory, made when first asked for."""
    made: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in made:
            made[name] = _train(name, str(tmp_path_factory.mktemp(name.replace("+", "-"))))
        return made[name]

    return get


@pytest.mark.parametrize("name", list(KINDS))
def test_exported_actions_equal_the_trainers_without_fastvec(runs, name, tmp_path):
    run = runs(name)
    obs, starts, want = _record(name, run)
    if name in TURNING:  # the actions turn on the observations (and the state): a wrong input shows
        assert len(np.unique(want)) > 1, "the policy plays one action only"
        if starts is not None:
            assert _forgetful(run, obs) != want.tolist(), "the state changes no action"
    np.save(tmp_path / "obs.npy", obs)
    if starts is not None:
        np.save(tmp_path / "starts.npy", starts)
    for fmt in ("torchscript", "onnx"):
        model = str(tmp_path / f"policy.{fmt}")
        info = export_policy(run, model, format=fmt)
        assert list(info["inputs"]) == (["obs", "state"] if starts is not None else ["obs"])
        out = str(tmp_path / f"{fmt}.npy")
        job = {"what": "actions", "kind": fmt, "model": model, "obs": str(tmp_path / "obs.npy"), "out": out}
        job["starts"] = None if starts is None else str(tmp_path / "starts.npy")
        _child(tmp_path, job)
        got = np.load(out)
        assert got.shape == want.shape, (fmt, got.shape, want.shape)
        if name == "gaussian":
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=fmt)
        else:
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, want, err_msg=fmt)


@pytest.mark.parametrize("name", ["mlp", "gaussian"])
def test_onnx_returns_equal_fastvec_evals_without_fastvec(runs, name, tmp_path, capsys):
    run = runs(name)
    model = str(tmp_path / "policy.onnx")
    assert fastvec_main(["export", run, "--format", "onnx", model]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["path"] == model
    assert fastvec_main(["eval", run, "--episodes", "10", "--seed", "5"]) == 0
    want = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    out = str(tmp_path / "episodes.json")
    _child(tmp_path, {"what": "episodes", "model": model, "episodes": 10, "seed": 5, "out": out})
    got = json.load(open(out))
    returns = np.array(got["returns"])
    assert len(returns) == want["episodes"] == 10
    assert np.mean(got["lengths"]) == want["mean_length"]
    stats = {"mean_return": returns.mean(), "std_return": returns.std()}
    stats.update(min_return=returns.min(), max_return=returns.max())
    if name == "mlp":  # the same actions, the same episodes: the same numbers
        assert stats == {k: want[k] for k in stats}
    else:  # ONNX Runtime's float32 sums differ from torch's in the last bits; MuJoCo carries them on
        assert stats == pytest.approx({k: want[k] for k in stats}, rel=1e-6, abs=1e-6)


def test_a_run_directory_exports_its_newest_checkpoint(runs, tmp_path):
    """Of checkpoint.pt and checkpoints/step-*.pt, the one with the most env steps (a
    resumed run killed after a periodic checkpoint leaves an older checkpoint.pt)."""
    ck = torch.load(os.path.join(runs("mlp"), "checkpoint.pt"), weights_only=False)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for steps, path in ((768, run / "checkpoint.pt"), (512, None), (1024, None)):
        ck["env_steps"] = steps
        torch.save(ck, path or run / "checkpoints" / f"step-{steps:012d}.pt")
    info = export_policy(str(run), str(tmp_path / "out" / "p.pt"), format="torchscript")
    assert info["checkpoint"].endswith("step-000000001024.pt") and info["env_steps"] == 1024
    assert os.path.isfile(tmp_path / "out" / "p.pt")
    (run / "checkpoints" / "step-000000001024.pt").write_bytes(b"half a file")  # unreadable: skipped
    assert export_policy(str(run), str(tmp_path / "p.pt"), format="torchscript")["env_steps"] == 768


def test_stochastic_export_samples_the_policys_distribution(runs, tmp_path):
    """CartPole's exported sampler, 20,000 draws at one observation: the share of action 1
    is the policy's probability of it, within 5 standard errors."""
    import onnxruntime as ort

    run = runs("mlp")
    pol = policy_from_checkpoint(load_checkpoint(run))
    obs = np.array([[0.02, 0.1, -0.03, -0.2]], np.float32)
    with torch.no_grad():
        p1 = float(torch.softmax(pol.actor_params(torch.from_numpy(obs)), -1)[0, 1])
    model = str(tmp_path / "p.onnx")
    assert not export_policy(run, model, format="onnx", deterministic=False)["deterministic"]
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    draws = sess.run(None, {"obs": np.repeat(obs, 20000, 0)})[0]
    assert set(np.unique(draws)) <= {0, 1}
    assert abs(draws.mean() - p1) < 5 * np.sqrt(p1 * (1 - p1) / 20000) + 1e-9, (draws.mean(), p1)
    ts = str(tmp_path / "p.pt")
    export_policy(run, ts, format="torchscript", deterministic=False)
    torch.manual_seed(0)
    draws = torch.jit.load(ts)(torch.from_numpy(np.repeat(obs, 20000, 0))).numpy()
    assert abs(draws.mean() - p1) < 5 * np.sqrt(p1 * (1 - p1) / 20000) + 1e-9, (draws.mean(), p1)


SPACES = {  # observation and action spaces the policy takes, beyond the trained kinds above
    "one-hot+multidiscrete": (gym.spaces.Discrete(5, start=2), gym.spaces.MultiDiscrete([3, 5], start=[1, -2])),
    "multibinary": (gym.spaces.MultiDiscrete([4, 2]), gym.spaces.MultiBinary(3)),
    "unbounded-box": (gym.spaces.Box(-1, 1, (2, 3)), gym.spaces.Box(-np.inf, np.inf, (2,))),
    "gru": (gym.spaces.Box(-1, 1, (3,), np.float64), gym.spaces.Discrete(4)),
    "bounded-box": (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(np.array([-1, 0]), np.array([1, np.inf]), (2,))),
}


@pytest.mark.parametrize("name", list(SPACES))
def test_every_kind_of_space_exports(name, tmp_path):
    """Random weights, random observations: both files' actions are ``predict``'s (a state
    fed through three steps for the GRU)."""
    import onnxruntime as ort

    from fastvec.train import save_checkpoint

    obs_space, act_space = SPACES[name]
    core = "gru" if name == "gru" else "none"
    cfg = PPOConfig(hidden=(8,), policy_core=core, core_size=4, normalize_obs=name == "unbounded-box")
    torch.manual_seed(1)
    pol = make_policy(obs_space, act_space, hidden=(8,), core=core, core_size=4, normalize_obs=cfg.normalize_obs)
    if pol.obs_norm is not None:
        pol.update_obs_norm(torch.randn(64, 6) * 3 + 1)
    with torch.no_grad():
        pol.actor_head.weight.mul_(300)  # means well past the bounds, where there are any
    ppo = SimpleNamespace(policy=pol, cfg=cfg, env_steps=0)
    ppo.storage = SimpleNamespace(single_observation_space=obs_space, single_action_space=act_space)
    save_checkpoint(str(tmp_path / "ck.pt"), ppo, None, None)
    obs_space.seed(2)
    obs = np.stack([np.asarray(obs_space.sample()) for _ in range(64)])
    for fmt in ("torchscript", "onnx"):
        path = str(tmp_path / f"p.{fmt}")
        export_policy(str(tmp_path / "ck.pt"), path, format=fmt)
        if fmt == "onnx":
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            run = lambda *xs: sess.run(None, dict(zip(["obs", "state"], xs)))
        else:
            module = torch.jit.load(path)

            def run(*xs, module=module):
                out = module(*map(torch.from_numpy, xs))
                return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]

        state = torch.zeros(64, pol.state_size) if pol.recurrent else None
        fed = np.zeros((64, pol.acting_state), np.float32)
        for _step in range(3 if pol.recurrent else 1):
            want = pol.predict(obs, deterministic=True, state=state)
            got = run(obs, fed) if pol.recurrent else run(obs)
            if pol.recurrent:
                fed = got[1]
            np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6, err_msg=fmt)
            if name == "bounded-box":  # the bounds bind: some means were clipped, below and above
                assert (want[:, 0] == -1).any() and (want[:, 0] == 1).any() and (want[:, 1] == 0).any()
            assert got[0].dtype == want.dtype


# ---------------------------------------------------------------- bad input, one line each
def test_bad_input_is_one_line(runs, tmp_path, capsys, monkeypatch):
    run = runs("mlp")
    out = str(tmp_path / "p.onnx")

    def one_line(argv, expect):
        try:
            code = fastvec_main(["export", *argv])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        assert code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("fastvec export: error: ") and expect in err, err

    one_line([run, "--format", "tflite", out], "invalid choice: 'tflite'")
    one_line([run, out], "--format")
    (tmp_path / "empty").mkdir()
    one_line([str(tmp_path / "empty"), "--format", "onnx", out], "holds no checkpoint")
    one_line([str(tmp_path / "nothing-here"), "--format", "onnx", out], "checkpoint not found")
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    one_line([run, "--format", "onnx", out], 'pip install "fastvec[export]"')
    assert not os.path.exists(out)
    with pytest.raises(ValueError, match="unknown export format 'tflite'"):
        export_policy(run, out, format="tflite")
