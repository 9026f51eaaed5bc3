"""Small deterministic gymnasium envs for the fastvec test suite.

Every env draws its randomness from ``self.np_random`` only, so two copies reset with the
same seed and fed the same actions produce the same trajectory, in this process or in a
worker. They live in a module (not in a test file) so that cloudpickle pickles them by
reference and any start method can rebuild them.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def _frame(seed_values, size=8) -> np.ndarray:
    """A small deterministic rgb frame made from a few numbers."""
    v = np.asarray(seed_values, dtype=np.float64).ravel()
    base = (np.abs(v).sum() * 37.0) % 256
    img = (np.arange(size * size * 3).reshape(size, size, 3) * 7 + int(base)) % 256
    return img.astype(np.uint8)


# --------------------------------------------------------------------------- env 1
class DictTupleEnv(gym.Env):
    """Dict observation with a Box, a Discrete, a MultiDiscrete, a MultiBinary, a
    shape-() Box and (``nested=True``) a nested ``Tuple(Box, Discrete)``; Box actions.

    Episodes terminate after a random length drawn at reset; infos are sometimes empty.
    SB3's DummyVecEnv does not accept nested spaces: use ``nested=False`` there.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, nested: bool = True, max_len: int = 9, render_mode: str | None = None):
        obs = {
            "box": spaces.Box(-5.0, 5.0, (3,), np.float32),
            "disc": spaces.Discrete(5, start=1),
            "md": spaces.MultiDiscrete([3, 4]),
            "mb": spaces.MultiBinary(4),
            "scalar": spaces.Box(-np.inf, np.inf, (), np.float64),
        }
        if nested:
            obs["tup"] = spaces.Tuple((spaces.Box(-1.0, 1.0, (2,), np.float64), spaces.Discrete(3)))
        self.nested = nested
        self.observation_space = spaces.Dict(obs)
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.max_len = max_len
        self.render_mode = render_mode
        self.pos = np.zeros(3, np.float32)
        self.t = 0
        self.length = 1
        self.last_noise = 0.0
        self.counter = 0  # an attribute for get_attr/set_attr tests

    def _obs(self):
        p = self.pos
        obs = {
            "box": p.astype(np.float32),
            "disc": np.int64(1 + int(abs(float(p[1])) * 10) % 5),
            "md": np.array([self.t % 3, int(abs(float(p[2])) * 7) % 4], dtype=np.int64),
            "mb": (np.array([p[0], p[1], p[2], self.last_noise]) > 0).astype(np.int8),
            "scalar": np.float64(float(p.sum()) * 0.5 + self.t),
        }
        if self.nested:
            obs["tup"] = (
                np.clip(np.array([self.last_noise, float(p[0]) / 5.0]), -1.0, 1.0),
                np.int64((self.t * 2 + int(p[0] > 0)) % 3),
            )
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(3, self.max_len + 1))
        self.pos = self.np_random.uniform(-1.0, 1.0, 3).astype(np.float32)
        self.last_noise = float(self.np_random.normal())
        info = {"length": self.length}
        if options and "start" in options:
            self.pos[:] = np.float32(options["start"])
            info["start"] = float(options["start"])
        return self._obs(), info

    def step(self, action):
        a = np.asarray(action, dtype=np.float32)
        noise = self.np_random.normal(size=3).astype(np.float32)
        self.last_noise = float(noise[0])
        self.pos = np.clip(self.pos + np.array([a[0], a[1], a[0] * a[1]], np.float32) + 0.1 * noise, -5, 5)
        self.pos = self.pos.astype(np.float32)
        self.t += 1
        self.counter += 1
        reward = float(-np.abs(self.pos).sum() + a.sum() + noise[1])
        terminated = self.t >= self.length
        info = {"t": self.t, "noise": float(noise[2])} if self.t % 3 == 0 else {}
        return self._obs(), reward, terminated, False, info

    def render(self):
        if self.render_mode == "rgb_array":
            return _frame([*self.pos.tolist(), self.t])
        return None

    def get_counter(self, add=0):
        return self.counter + add


def make_dict_env(nested: bool = True, render_mode: str | None = None):
    return DictTupleEnv(nested=nested, render_mode=render_mode)


# --------------------------------------------------------------------------- env 2
class RandomEndEnv(gym.Env):
    """Episodes end at random times: terminated and truncated are drawn independently
    (both may be set). Infos are sometimes empty and sometimes hold numbers, arrays,
    strings and nested dicts; reset infos are sometimes empty too."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, p_end: float = 0.12, render_mode: str | None = None):
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.action_space = spaces.Discrete(3)
        self.p_end = p_end
        self.render_mode = render_mode
        self.x = np.zeros(2)
        self.t = 0
        self.episodes = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.episodes += 1
        self.x = self.np_random.normal(size=2)
        if self.np_random.random() < 0.5:
            info = {}
        else:
            info = {"episode_id": self.episodes, "start": self.x.copy()}
        return self.x.copy(), info

    def step(self, action):
        a = int(action)
        self.t += 1
        self.x = self.x + (a - 1) * 0.5 + self.np_random.normal(size=2) * 0.1
        terminated = bool(self.np_random.random() < self.p_end)
        truncated = bool(self.np_random.random() < self.p_end)
        kind = int(self.np_random.integers(5))
        if kind == 0:
            info = {}
        elif kind == 1:
            info = {"num": float(self.x[0]), "count": self.t, "flag": bool(self.x[1] > 0)}
        elif kind == 2:
            info = {"arr": self.x * 2.0, "f32": np.float32(self.x[1])}
        elif kind == 3:
            info = {"nested": {"a": self.t, "b": self.x.astype(np.float32), "deep": {"flag": bool(a == 2)}}}
        else:
            info = {"num": float(self.x[1]), "text": f"step-{self.t}"}
        reward = float(self.x.sum() + a)
        return self.x.copy(), reward, terminated, truncated, info

    def render(self):
        if self.render_mode == "rgb_array":
            return _frame([*self.x.tolist(), self.t])
        return None


# --------------------------------------------------------------------------- env 3
class EnvExploded(RuntimeError):
    """Raised by FailingEnv."""


class FailingEnv(gym.Env):
    """Raises ``EnvExploded`` in ``step`` once it has taken ``fail_after`` steps (counted
    across episodes; ``None`` never fails). Also raises in ``reset`` when
    ``fail_on_reset`` is set, and in ``explode()`` on demand."""

    metadata = {"render_modes": []}

    def __init__(self, fail_after: int | None = 3, fail_on_reset: bool = False):
        self.observation_space = spaces.Box(-10.0, 10.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.fail_after = fail_after
        self.fail_on_reset = fail_on_reset
        self.steps = 0
        self.state = np.zeros(2, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.fail_on_reset:
            raise EnvExploded("reset exploded")
        self.state = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action):
        if self.fail_after is not None and self.steps >= self.fail_after:
            raise EnvExploded(f"step {self.steps + 1} exploded")
        self.steps += 1
        self.state = np.clip(self.state + (int(action) - 0.5) * 0.1, -10, 10).astype(np.float32)
        return self.state.copy(), float(self.state[0]), False, False, {}

    def explode(self):
        raise EnvExploded("explode() was called")


def raising_factory():
    raise ValueError("this factory cannot build an env")


# --------------------------------------------------------------------------- helpers
class StepCounterEnv(gym.Env):
    """SB3's ``StepEnv``: observation = index of the step, episode of ``max_steps``."""

    def __init__(self, max_steps: int):
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(np.array([0]), np.array([999]), dtype=np.int64)
        self.max_steps = max_steps
        self.current_step = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.current_step = 0
        return np.array([self.current_step], dtype=np.int64), {}

    def step(self, action):
        prev_step = self.current_step
        self.current_step += 1
        truncated = self.current_step >= self.max_steps
        return np.array([prev_step], dtype=np.int64), 0.0, False, truncated, {}


class ImageEnv(gym.Env):
    """A channel-last uint8 image observation (for VecFrameStack / VecTransposeImage);
    random episode lengths, all drawn from ``np_random``."""

    def __init__(self, shape=(12, 8, 3)):
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)
        self.action_space = spaces.Discrete(2)
        self.t = 0
        self.length = 1

    def _obs(self):
        return self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(2, 7))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        obs = self._obs()
        obs[0, 0, 0] = int(action) * 100 + self.t
        return obs, float(action) - 0.5, self.t >= self.length, False, {}


class SB3CustomEnv(gym.Env):
    """The env of SB3's own vec-env tests: observations sampled from ``space`` (which is
    also the action space), rewards from numpy's global RNG, episodes of 4 steps."""

    def __init__(self, space, render_mode: str | None = "rgb_array"):
        self.action_space = space
        self.observation_space = space
        self.current_step = 0
        self.ep_length = 4
        self.render_mode = render_mode
        self.current_options = None
        self.state = None

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.seed(seed)
        self.current_step = 0
        self.current_options = options
        self.state = self.observation_space.sample()
        return self.state, {}

    def step(self, action):
        reward = float(np.random.rand())
        self.state = self.observation_space.sample()
        self.current_step += 1
        return self.state, reward, False, self.current_step >= self.ep_length, {}

    def render(self):
        if self.render_mode == "rgb_array":
            return np.zeros((4, 4, 3))
        return None

    def seed(self, seed=None):
        if seed is not None:
            np.random.seed(seed)
            self.observation_space.seed(seed)

    @staticmethod
    def custom_method(dim_0=1, dim_1=1):
        return np.ones((dim_0, dim_1))


def _flat_values(space, value) -> list[float]:
    """Depth-first float values of ``value`` (an element of ``space``)."""
    if isinstance(space, spaces.Dict):
        return [x for key, sub in space.spaces.items() for x in _flat_values(sub, value[key])]
    if isinstance(space, spaces.Tuple):
        return [x for sub, v in zip(space.spaces, value) for x in _flat_values(sub, v)]
    return np.asarray(value, dtype=np.float64).ravel().tolist()


def _flat_size(space) -> int:
    if isinstance(space, spaces.Dict):
        return sum(_flat_size(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return sum(_flat_size(s) for s in space.spaces)
    if isinstance(space, spaces.Discrete):
        return 1
    if isinstance(space, spaces.MultiDiscrete):
        return int(space.nvec.size)
    return int(np.prod(space.shape))


class EchoEnv(gym.Env):
    """Observes the action it was given (flattened, as float64) plus one number drawn
    from ``np_random``; counts actions outside its action space in ``invalid``.
    Episodes end every ``period`` steps."""

    def __init__(self, action_space: spaces.Space, period: int = 5):
        self.action_space = action_space
        self.observation_space = spaces.Box(-np.inf, np.inf, (_flat_size(action_space) + 1,), np.float64)
        self.period = period
        self.t = 0
        self.invalid = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        obs = np.zeros(self.observation_space.shape)
        obs[-1] = self.np_random.random()
        return obs, {}

    def step(self, action):
        if not self.action_space.contains(action):
            self.invalid += 1
        self.t += 1
        obs = np.array(_flat_values(self.action_space, action) + [self.np_random.random()])
        return obs, float(obs.sum()), self.t % self.period == 0, False, {}


class MisbehavingEnv(gym.Env):
    """Returns something odd from ``step`` when ``kind`` says so:
    "local_fn" (an info holding a local function: picklable by cloudpickle only),
    "lock" (an info holding a lock: not picklable at all), "obs_shape" (an observation
    of the wrong shape). ``kind=None`` behaves."""

    def __init__(self, kind=None):
        self.kind = kind
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        import threading

        self.t += 1
        obs = np.full(2, 0.1 * int(action), np.float32)
        info = {}
        offset = self.t
        if self.kind == "local_fn":
            info = {"fn": lambda x: x + offset}
        elif self.kind == "lock":
            info = {"lock": threading.Lock()}
        elif self.kind == "obs_shape":
            obs = np.zeros(3, np.float32)
        return obs, 1.0, False, False, info


class SteadyInfoEnv(gym.Env):
    """The same flat numeric info keys every step, of many types (an ALE or MuJoCo
    env's shape of infos): the case the engine turns into gymnasium's infos in one
    compiled pass. Episodes end at random times."""

    observation_space = spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.normal(size=3).astype(np.float32), {}

    def step(self, action):
        self._t += 1
        x = self.np_random.normal(size=3).astype(np.float32)
        info = {
            "lives": int(self._t % 5),
            "x": float(x[0]),
            "flag": bool(x[1] > 0),
            "f32": np.float32(x[2]),
            "f16": np.float16(x[1]),
            "i8": np.int8(-self._t % 100),
            "u32": np.uint32(self._t * 7),
            "frame": np.int64(self._t),
        }
        terminated = bool(self.np_random.random() < 0.05)
        return x, float(action) - 1.0, terminated, self._t >= 30, info


class FlatInfoEnv(gym.Env):
    """Infos that are flat dicts of numbers of many types (what MuJoCo and ALE return),
    the case fastvec sends as columns. Keys come and go, and now and then a key changes
    type (a ``float`` where it was ``np.float64``), which must fall back to records."""

    observation_space = spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.normal(size=3).astype(np.float32), {"start": np.float64(self.np_random.normal())}

    def step(self, action):
        self._t += 1
        rng = self.np_random
        x = rng.normal(size=3).astype(np.float32)
        info = {
            "x_position": np.float64(x[0]),
            "lives": int(rng.integers(0, 5)),
            "reward_ctrl": np.float32(-abs(x[1])),
            "flag": bool(x[2] > 0),
            "frame": np.int32(self._t),
        }
        info["f16"] = np.float16(x[1])
        info["u32"] = np.uint32(self._t * 7)
        info["i8"] = np.int8(-self._t % 100)
        if rng.random() < 0.3:
            info["sometimes"] = float(x[1])
        if rng.random() < 0.05:
            info["x_position"] = float(x[0])  # a different type for one key
        if rng.random() < 0.03:
            info["flag"] = np.bool_(x[2] > 0)  # not a number to gymnasium: an object array
        if rng.random() < 0.03:  # more keys than the shared info table holds
            info.update({f"k{k}": float(k) for k in range(12)})
        terminated = bool(rng.random() < 0.03)
        truncated = self._t >= 40
        return x, float(action) * 0.5, terminated, truncated, info


class CostEnv(gym.Env):
    """A step that costs ``cost_us`` microseconds of busy CPU (a per-instance setting,
    as mixed tasks or physics settings make envs differ in cost), or of waiting with
    ``sleep`` (an env that waits on a simulator or I/O); episodes of ``episode_len``
    steps, observations that count them."""

    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, cost_us: float = 100.0, episode_len: int = 50, fail_in_step: bool = False, sleep: bool = False):
        self.cost_us = float(cost_us)
        self.sleep = sleep
        self.episode_len = int(episode_len)
        self.fail_in_step = fail_in_step
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, self.np_random.normal()]), {}

    def step(self, action):
        if self.fail_in_step:
            raise RuntimeError("this env cannot step")
        if self.sleep:
            time.sleep(self.cost_us * 1e-6)
        end = time.perf_counter() + (0.0 if self.sleep else self.cost_us * 1e-6)
        while time.perf_counter() < end:
            pass
        self.t += 1
        return np.array([float(self.t), float(action)]), 1.0, False, self.t >= self.episode_len, {}


# --------------------------------------------------------------------------- goal ring
class GoalRingEnv(gym.Env):
    """Goal reaching on a ring of ``cells`` cells, with a Dict observation: ``pos`` (the
    agent's cell, a float Box ``[1]``), ``goal`` (the goal's cell, ``Discrete``) and
    ``clock`` (the steps left, ``Discrete``). Action ``a`` moves the agent ``a`` cells on;
    landing on the goal earns 1 and draws a new goal. Only ``(goal - pos) % cells`` lands:
    a policy that ignores ``pos`` or ``goal`` lands by chance, ``1 / cells`` of the time
    (an expected return of ``length / cells``); one that reads both returns ``length``."""

    def __init__(self, cells: int = 4, length: int = 8, extra=None):
        self.cells, self.length = int(cells), int(length)
        obs = {
            "pos": spaces.Box(0.0, cells - 1.0, (1,), np.float32),
            "goal": spaces.Discrete(cells),
            "clock": spaces.Discrete(length + 1),
        }
        if extra is not None:  # one more leaf (what the refusal tests give), always zero
            obs["extra"] = extra
        self.observation_space = spaces.Dict(obs)
        self.action_space = spaces.Discrete(cells)
        self.pos = self.goal = self.t = 0

    def _obs(self):
        obs = {"pos": np.array([self.pos], np.float32), "goal": self.goal, "clock": self.length - self.t}
        if "extra" in self.observation_space.spaces:
            obs["extra"] = self.observation_space["extra"].sample() * 0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.goal = (int(x) for x in self.np_random.integers(0, self.cells, 2))
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.pos = (self.pos + int(action)) % self.cells
        self.t += 1
        reward = 0.0
        if self.pos == self.goal:
            reward = 1.0
            self.goal = int(self.np_random.integers(0, self.cells))
        return self._obs(), reward, False, self.t >= self.length, {}


gym.register("FvGoalRing-v0", entry_point=__name__ + ":GoalRingEnv")


# --------------------------------------------------------------------------- masked
class MaskedChoiceEnv(gym.Env):
    """Discrete(6) actions under an action mask drawn at random every step (at least one
    action valid). A valid action earns ``(action + 1) / 6`` (the highest valid one is
    best, worth 1 where action 5 is valid); an invalid one ends the episode with -1. An
    episode is ``length`` steps. The observation is the mask as floats, so the policy can
    see it. ``source``: where the mask is given, ``info`` (``info["action_mask"]``,
    ``int8``), ``method`` (an ``action_masks()`` method, bool) or ``both``; ``multi``: a
    ``MultiDiscrete([3, 4])`` action space instead, one mask per branch (an action earns
    the two branches' sums, every sub-action must be valid). ``bad``: make the mask wrong
    (``shape``, ``dtype``, ``empty`` at step 3 of each episode, ``empty_first``). Its
    ``rgb_array`` frame shows the current mask: a white 8 x 8 block per valid action,
    black per invalid one.

    ``dict_obs``: the observation is a Dict instead, ``seen`` (the mask as floats) and
    ``clock`` (the steps taken, ``Discrete``); ``source="dict"`` gives the mask as its
    ``action_mask`` key too (an ``int8`` Box, PettingZoo classic's convention), and neither
    in the info nor through a method."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        source: str = "info",
        length: int = 10,
        multi: bool = False,
        bad: str = "",
        dict_obs: bool = False,
        render_mode: str | None = None,
    ):
        self.source, self.length, self.multi, self.bad = source, int(length), bool(multi), bad
        self.render_mode = render_mode
        self.nvec = [3, 4] if multi else [6]
        self.action_space = spaces.MultiDiscrete(self.nvec) if multi else spaces.Discrete(6)
        self.size = sum(self.nvec)
        self.observation_space = spaces.Box(0.0, 1.0, (self.size,), np.float32)
        self.dict_obs = bool(dict_obs) or source == "dict"
        if self.dict_obs:
            obs = {"seen": self.observation_space, "clock": spaces.Discrete(self.length + 1)}
            if source == "dict":
                obs["action_mask"] = spaces.Box(0, 1, (self.size,), np.int8)
            self.observation_space = spaces.Dict(obs)
        self.mask = np.ones(self.size, bool)
        self.t = 0
        if source in ("method", "both"):  # (the info source's env has no such method)
            self.action_masks = self._masks

    def _draw(self) -> None:
        parts = []
        for n in self.nvec:
            m = self.np_random.random(n) < 0.5
            m[self.np_random.integers(n)] = True
            parts.append(m)
        self.mask = np.concatenate(parts)
        if self.bad == "empty_first" or (self.bad == "empty" and self.t == 3):
            self.mask[:] = False

    def _masks(self) -> np.ndarray:
        m = self.mask.copy()
        if self.bad == "shape":
            return m[:-1]
        return m.astype(np.float32) if self.bad == "dtype" else m

    def _out(self, info: dict):
        if self.source in ("info", "both"):
            info["action_mask"] = self._masks().astype(np.int8) if self.bad != "dtype" else self._masks()
        if not self.dict_obs:
            return self.mask.astype(np.float32), info
        obs = {"seen": self.mask.astype(np.float32), "clock": self.t}
        if self.source == "dict":
            obs["action_mask"] = self._masks().astype(np.int8) if self.bad != "dtype" else self._masks()
        return obs, info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._out({})

    def step(self, action):
        a = np.atleast_1d(np.asarray(action)).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(self.nvec)[:-1]])
        if not self.mask[offsets + a].all():
            self._draw()
            obs, info = self._out({"invalid": 1})
            return obs, -1.0, True, False, info
        self.t += 1
        reward = float(((a + 1) / np.asarray(self.nvec)).sum())
        self._draw()
        obs, info = self._out({"invalid": 0})
        return obs, reward, False, self.t >= self.length, info

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return np.repeat(np.repeat(self.mask.astype(np.uint8) * 255, 8)[None, :, None], 8, 0).repeat(3, 2)


# --------------------------------------------------------------------------- composite actions
class CompositeActionEnv(gym.Env):
    """A composite action space of every leaf kind: ``Dict(move=Discrete(3, start=-1),
    aim=Tuple(Box(-1, 1, (2,)), MultiBinary(2)), gear=MultiDiscrete([2, 3]))``. Each step
    shows a target (the observation: the target move one-hot, the target point, the
    target bits, the target gears one-hot) and pays for each part matched: 1 for the move,
    1 for the gears (both), the fraction of bits matched, and ``1 - |aim - point|`` on
    average over the point's two axes; 4 a step at best, ``length`` steps an episode. A
    policy blind to one leaf loses that leaf's part. ``received`` keeps the last action
    the env was given (for the tests); ``text_leaf``: a ``Text`` leaf ``say`` besides."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, length: int = 8, render_mode: str | None = None, text_leaf: bool = False):
        self.length, self.render_mode = int(length), render_mode
        leaves = {
            "move": spaces.Discrete(3, start=-1),
            "aim": spaces.Tuple((spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.MultiBinary(2))),
            "gear": spaces.MultiDiscrete([2, 3]),
        }
        if text_leaf:  # (a leaf the trainer cannot act on: the refusal tests')
            leaves["say"] = spaces.Text(4)
        self.action_space = spaces.Dict(leaves)
        self.observation_space = spaces.Box(-1.0, 1.0, (12,), np.float32)
        self.t = 0
        self.received = None

    def _draw(self) -> None:
        r = self.np_random
        self.move, self.point = int(r.integers(-1, 2)), r.uniform(-0.8, 0.8, 2).astype(np.float32)
        self.bits, self.gears = r.integers(0, 2, 2), np.array([r.integers(0, 2), r.integers(0, 3)])

    def _obs(self):
        obs = np.zeros(12, np.float32)
        obs[self.move + 1] = 1.0
        obs[3:5] = self.point
        obs[5:7] = self.bits
        obs[7 + self.gears[0]] = 1.0
        obs[9 + self.gears[1]] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.received = action
        aim, bits = action["aim"]
        reward = float(action["move"] == self.move) + float(np.array_equal(action["gear"], self.gears))
        reward += float(np.mean(bits == self.bits)) + float(1.0 - np.abs(aim - self.point).mean())
        self.t += 1
        self._draw()
        return self._obs(), reward, False, self.t >= self.length, {}

    def render(self):
        frame = np.zeros((16, 48, 3), np.uint8)
        frame[:, 16 * (self.move + 1) : 16 * (self.move + 2)] = 255
        return frame


gym.register("FvComposite-v0", entry_point=__name__ + ":CompositeActionEnv")
gym.register("FvCompositeText-v0", entry_point=__name__ + ":CompositeActionEnv", kwargs={"text_leaf": True})
