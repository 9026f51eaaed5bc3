"""Statistics PPO keeps across rollouts: episode returns and lengths, the running
scale of the discounted return that reward normalisation divides by. Both are saved in
the train state, so a resumed run continues them. And ``thin``, which keeps a learning
curve's memory bounded."""

from __future__ import annotations

import collections
import math

import numpy as np

from ..compute.ranks import SOLO, Ranks

__all__ = ["EpisodeTracker", "RewardScaler", "thin", "CURVE_POINTS"]

CURVE_POINTS = 4096


def thin(points: list, cap: int = CURVE_POINTS) -> None:
    """Keep a learning curve's memory bounded over any run length: past ``cap`` points,
    drop every other one (the oldest resolution halves; the newest point stays)."""
    if len(points) > cap:
        last = points[-1]
        del points[1::2]
        if points[-1] is not last:
            points.append(last)


class EpisodeTracker:
    """Episode returns and lengths from a rollout's rewards and flags, vectorised over
    time (a Python loop only over the episodes that ended). With ``set_groups`` (a run
    on a mix of envs) each group's last ``window`` returns are kept too."""

    def __init__(self, n: int, window: int):
        self.ret = np.zeros(n)
        self.len = np.zeros(n, np.int64)
        self.window = collections.deque(maxlen=window)
        self.group_of: np.ndarray | None = None
        self.group_windows: list[collections.deque] = []
        self.recent_returns: list[float] = []
        self.recent_lengths: list[int] = []
        self.episodes = 0

    def update(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, acted=None) -> None:
        """Take in a rollout's ``[T, n]`` rewards and flags; ``acted``: per step, the
        envs that acted (an episode's length counts those steps; None: all did)."""
        T = rewards.shape[0]
        done = terminated | truncated
        if not done.any():
            self.ret += rewards.sum(0)
            self.len += T if acted is None else acted.sum(0)
            return
        cum = np.cumsum(rewards, 0)
        steps = np.cumsum(acted, 0) if acted is not None else np.broadcast_to(np.arange(1, T + 1)[:, None], done.shape)
        base_r = np.zeros_like(self.ret)
        base_t = np.zeros_like(self.len)
        ts, ns = np.nonzero(done)
        for t, n in zip(ts.tolist(), ns.tolist()):
            r = float(self.ret[n] + cum[t, n] - base_r[n])
            length = int(self.len[n] + steps[t, n] - base_t[n])
            self.window.append(r)
            if self.group_of is not None:
                self.group_windows[self.group_of[n]].append(r)
            self.recent_returns.append(r)
            self.recent_lengths.append(length)
            self.ret[n] = 0.0
            self.len[n] = 0
            base_r[n] = cum[t, n]
            base_t[n] = steps[t, n]
        self.episodes += len(ts)
        self.ret += cum[-1] - base_r
        self.len += steps[-1] - base_t

    def mean(self):
        return float(np.mean(self.window)) if self.window else None

    def set_groups(self, group_of) -> None:
        """Env i belongs to group ``group_of[i]`` (before any episode is counted)."""
        self.group_of = np.asarray(group_of, np.int64)
        self.group_windows = [collections.deque(maxlen=self.window.maxlen) for _ in range(int(self.group_of.max()) + 1)]

    def group_means(self) -> list[float | None]:
        """Each group's mean over its last ``window`` returns (None: none yet)."""
        return [float(np.mean(w)) if w else None for w in self.group_windows]

    def full(self) -> bool:
        return len(self.window) == self.window.maxlen

    def drain(self):
        returns, lengths = self.recent_returns, self.recent_lengths
        self.recent_returns, self.recent_lengths = [], []
        return returns, lengths

    def restart_envs(self) -> None:
        """The envs were reset: the episodes in progress are dropped, not counted."""
        self.ret[:] = 0.0
        self.len[:] = 0

    def state(self) -> dict:
        return {
            "window": list(self.window),
            "episodes": self.episodes,
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "group_windows": [list(w) for w in self.group_windows],
        }

    def load(self, state: dict) -> None:
        self.window.clear()
        self.window.extend(state["window"])
        self.episodes = int(state["episodes"])
        self.recent_returns = list(state["recent_returns"])
        self.recent_lengths = list(state["recent_lengths"])
        for w, saved in zip(self.group_windows, state.get("group_windows", [])):  # (older states: none)
            w.clear()
            w.extend(saved)


class RewardScaler:
    """SB3 VecNormalize-style reward scaling: divide by the running std of the
    discounted return (per env), clip to +-10."""

    def __init__(self, n: int, gamma: float, clip: float = 10.0, eps: float = 1e-8):
        self.acc = np.zeros(n)
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def state(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]

    def __call__(self, rewards, done, ranks: Ranks = SOLO, acted=None) -> np.ndarray:
        """``rewards`` ``[T, n]`` scaled; the running scale takes in this batch's
        discounted returns (every rank's, ``ranks``); ``acted``: ``[T, n]``, the steps
        whose row acted (agents: an agent that left has no return to count; None: all)."""
        T = rewards.shape[0]
        rets = np.empty_like(rewards)
        counted = rewards if acted is None else np.where(acted, rewards, 0.0)
        for t in range(T):
            self.acc = self.acc * self.gamma + counted[t]
            rets[t] = self.acc
            self.acc[done[t]] = 0.0
        b_mean, b_var, n = _moments(rets if acted is None else rets[acted], ranks)
        delta = b_mean - self.mean
        tot = self.count + n
        self.mean += delta * n / tot
        self.var = (self.var * self.count + b_var * n + delta**2 * self.count * n / tot) / tot
        self.count = tot
        return np.clip(rewards / math.sqrt(self.var + self.eps), -self.clip, self.clip).astype(np.float32)


def _moments(x: np.ndarray, ranks: Ranks):
    """Mean, population variance and count of ``x``'s items over every rank's."""
    if ranks.solo:
        return (x.mean(), x.var(), x.size) if x.size else (0.0, 0.0, 0)
    n, total = ranks.floats([x.size, x.sum()])
    mean = total / n
    (sq,) = ranks.floats([np.square(x - mean).sum()])
    return mean, sq / n, int(n)
