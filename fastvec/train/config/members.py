"""Members: the runs one ``fastvec train --seeds K [--sweep KEY=V1,V2 ...]`` trains at once.

A member is a whole PPO run: a config that differs from the run's own in its ``seed``
and, in a sweep, in the swept keys. ``--seeds 8`` makes 8 members with seeds ``seed,
seed + 1, ..., seed + 7`` (each env of each member has a stream of its own:
``fastvec.train.config.seeding``), ``--seeds 1,5,9`` the members with those seeds; a
sweep makes one member per setting of its grid (the product of the keys' values) and
seed. A member equals the run alone with its seed and settings: two members with the
same seed and different settings see the same env streams (a paired comparison, as two
runs alone with that seed would).

Members share an engine and a rollout's length, so they differ in scalar settings only:
a key that shapes the envs, the rollout, the network or the process (``STRUCTURAL``) is
refused in a sweep, with what to do instead.
"""

from __future__ import annotations

import dataclasses
import itertools

from .overrides import FIELD_KINDS, apply_overrides
from .settings import TRANSPORT_KEYS, ConfigError, PPOConfig

__all__ = ["Member", "STRUCTURAL", "parse_seeds", "parse_sweep", "member_configs", "MAX_MEMBERS"]

MAX_MEMBERS = 1024
"""More members than this in one run is refused (each holds its envs, weights and buffers)."""

STRUCTURAL = frozenset(
    {
        "num_envs",
        "n_steps",
        "minibatch_size",
        "hidden",
        "critic_hidden",
        "activation",
        "policy_core",
        "core_size",
        "bptt",
        "normalize_obs",
        "pipeline",
        "max_policy_lag",
        "rollout_buffers",
        "targets",
        "values_of",
        "proximal_policy",
        "device",
        "torch_threads",
        "learn_threads",
        "learner",
        "log_every_s",
        "checkpoint_every",
        "keep_checkpoints",
        "restart_on_error",
        "max_restarts",
        "restart_window",
        "step_timeout",
        *TRANSPORT_KEYS,
    }
)
"""Keys every member shares: the envs and the engine, the rollout's shape, the network,
where and how it computes, logs and checkpoints."""


@dataclasses.dataclass(frozen=True)
class Member:
    """One member: its ``label`` (its directory's name: ``seed-3``, ``lr=0.001,seed-3``),
    the swept ``setting`` (key -> value; empty without a sweep), and its ``cfg``."""

    label: str
    setting: dict
    cfg: PPOConfig

    @property
    def group(self) -> str:
        """The setting's name (``lr=0.001``; ``all`` without a sweep): the members of a
        group differ in their seed only, and are compared with the other groups'."""
        return ",".join(f"{k}={_text(v)}" for k, v in self.setting.items()) or "all"


def _text(v) -> str:
    if isinstance(v, tuple):
        return "x".join(str(x) for x in v)
    return f"{v:g}" if isinstance(v, float) else str(v)


def parse_seeds(seeds, first: int) -> list[int]:
    """``--seeds``: a count K (seeds ``first .. first + K - 1``), a comma list of seeds, or
    (from Python) a list of ints; ConfigError on anything else, a count < 1, a seed < 0
    or a seed twice."""
    if isinstance(seeds, (list, tuple)):
        t = ",".join(str(x) for x in seeds) + ","  # a list, even of one seed
    else:
        t = str(seeds).strip()
    try:
        count = int(t) if "," not in t else None
        found = [int(x) for x in t.split(",") if x.strip()] if count is None else list(range(first, first + count))
    except (TypeError, ValueError):
        raise ConfigError(
            f"--seeds must be a member count like 8 or a list of seeds like 1,2,3, got {seeds!r}"
        ) from None
    if count is not None and count < 1:
        raise ConfigError(f"--seeds must be a member count >= 1 or a list of seeds, got {seeds!r}")
    if not found:
        raise ConfigError(f"--seeds names no seed: {seeds!r}")
    if any(s < 0 for s in found):
        raise ConfigError(f"--seeds: seeds must be >= 0, got {seeds!r}")
    if len(set(found)) != len(found):
        raise ConfigError(f"--seeds names a seed twice: {seeds!r}")
    return found


def parse_sweep(items: list[str]) -> dict[str, list]:
    """``--sweep KEY=V1,V2 ...`` (repeatable): each key's values, typed as ``--set`` types
    them; ConfigError for an unknown or structural key, a key given twice, a value of
    the wrong type, or a key with one value repeated."""
    sweep: dict[str, list] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--sweep expects KEY=V1,V2,..., got {item!r}")
        key, text = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in FIELD_KINDS:
            raise ConfigError(f"--sweep: unknown config key {key!r} (fastvec train ENV --list-keys lists them)")
        if key == "seed":
            raise ConfigError("--sweep: give the seeds with --seeds, not as a swept key")
        if key in ("total_steps", "stop_at_return", "max_seconds", "solve_return"):
            raise ConfigError(f"--sweep: {key} ends the run and is every member's; give it once with --set")
        if key in STRUCTURAL:
            raise ConfigError(
                f"--sweep: {key} shapes what the members share (envs, rollout, network or process); "
                "sweep it with separate fastvec train runs"
            )
        if key in sweep:
            raise ConfigError(f"--sweep names {key} twice; give its values once, comma-separated")
        if FIELD_KINDS[key].startswith("ints"):
            raise ConfigError(f"--sweep: {key} takes a tuple; sweep it with separate runs")
        values = [_typed(key, v) for v in text.split(",")]
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"--sweep {key} repeats a value: {text!r}")
        sweep[key] = values
    return sweep


def _typed(key: str, text: str):
    cfg = PPOConfig()
    apply_overrides(cfg, [f"{key}={text}"])  # ConfigError, naming the key, where the type is wrong
    return getattr(cfg, key)


def member_configs(cfg: PPOConfig, seeds: list[int], sweep: dict[str, list] | None = None) -> list[Member]:
    """The members of ``cfg`` (the run's config) with ``seeds`` and the grid ``sweep``:
    setting-major (the seeds of the first setting, then of the next), each config
    validated; ConfigError where a setting is not valid or the members are too many."""
    sweep = sweep or {}
    settings = [dict(zip(sweep, combo)) for combo in itertools.product(*sweep.values())] or [{}]
    if len(settings) * len(seeds) > MAX_MEMBERS:
        raise ConfigError(f"{len(settings)} settings x {len(seeds)} seeds is more than {MAX_MEMBERS} members")
    members = []
    for setting in settings:
        for seed in seeds:
            c = PPOConfig.from_dict(cfg.to_dict())
            apply_overrides(c, {**setting, "seed": seed})
            try:
                c.validate()
            except ConfigError as exc:
                raise ConfigError(f"--sweep setting {setting}: {exc}") from None
            label = ",".join([*(f"{k}={_text(v)}" for k, v in setting.items()), f"seed-{seed}"])
            members.append(Member(label, setting, c))
    return members
