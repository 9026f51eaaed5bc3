"""A mix of envs in one run: groups of env ids and constructor settings.

``fastvec train HalfCheetah-v5 --mix frame_skip=5 --mix frame_skip=20`` trains on the
preset's 8 envs, four with each setting. A group is ``key=value,...``: ``id`` (default:
the run's env id), ``count`` (default: an equal share of the envs the counted groups
leave) and the env's constructor settings (``gymnasium.make(id, **settings)``); a value
is read as JSON where it parses (``20``, ``0.1``, ``true``, ``[1, 2]``), as text
otherwise. Envs are numbered group by group, in the order given. The presets, the solve
threshold and the run's name are the run's env id's. An id may be an env of your own
(``MODULE:ENV_ID`` or ``MODULE:CALLABLE``, ``fastvec.env_ids``), its settings then
the entry point's keyword arguments.

A resolved mix is a list of ``{"env_id", "env_kwargs", "count"}`` dicts (what a
checkpoint keeps); a single group of the run's own env id is no mix, only settings
(``env_kwargs``). All groups must share their action space and the layout of their
observation space (bounds may differ): ``check_mix_spaces`` builds one env of each group in
this process, before any worker starts.
"""

from __future__ import annotations

import json

from .settings import ConfigError

__all__ = [
    "parse_group",
    "resolve_mix",
    "settle_mix",
    "counted_total",
    "is_mix",
    "group_of",
    "mix_factories",
    "check_mix_spaces",
    "describe_mix",
]


def parse_group(text: str) -> dict:
    """``"id=CartPole-v0,count=4,key=value"`` as ``{"env_id", "count", "env_kwargs"}``
    (``env_id`` and ``count`` None where not given); ConfigError on bad text."""
    from ...env_ids import parse_settings

    try:
        settings = parse_settings(text, "--mix")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    group = {"env_id": settings.pop("id", None), "count": settings.pop("count", None), "env_kwargs": settings}
    return _checked(group)


def _as_group(g) -> dict:
    if isinstance(g, str):
        return parse_group(g)
    if not isinstance(g, dict) or set(g) - {"env_id", "env_kwargs", "count"}:
        raise ConfigError(f"a mix group is 'key=value,...' or a dict of env_id, env_kwargs and count, got {g!r}")
    return _checked({"env_id": g.get("env_id"), "count": g.get("count"), "env_kwargs": g.get("env_kwargs") or {}})


def _checked(g: dict) -> dict:
    """``g`` (a fresh dict) where its id, count and settings are of the right kinds."""
    env_id, count, kwargs = g["env_id"], g["count"], g["env_kwargs"]
    if env_id is not None and (not isinstance(env_id, str) or not env_id):
        raise ConfigError(f"a mix group's id must be an env id, got {env_id!r}")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ConfigError(f"a mix group's count must be a positive integer, got {count!r}")
    if not isinstance(kwargs, dict):
        raise ConfigError(f"a mix group's env_kwargs must be a dict, got {kwargs!r}")
    g["env_kwargs"] = dict(kwargs)
    return g


def counted_total(groups) -> int | None:
    """The number of envs the groups name when every one gives its count, else None."""
    parsed = [_as_group(g) for g in groups]
    if parsed and all(g["count"] is not None for g in parsed):
        return sum(g["count"] for g in parsed)
    return None


def resolve_mix(groups, env_id: str, num_envs: int) -> list[dict] | None:
    """Every group with its env id and count (groups without a count share the envs the
    others leave, equally); None for a single group of ``env_id`` (only settings) or no
    groups. ConfigError, one line, where the counts do not add up to ``num_envs`` or an env
    id is unknown."""
    from .presets import check_env_id

    parsed = [_as_group(g) for g in (groups or ())]
    if not parsed:
        return None
    for g in parsed:
        g["env_id"] = g["env_id"] or env_id
        try:
            check_env_id(g["env_id"])
        except ValueError as exc:
            raise ConfigError(f"--mix: {exc}") from None
    counted = sum(g["count"] for g in parsed if g["count"] is not None)
    free = [g for g in parsed if g["count"] is None]
    left = num_envs - counted
    if left < 0 or (free and (left < len(free) or left % len(free))) or (not free and left):
        given = ", ".join(str(g["count"]) if g["count"] is not None else "?" for g in parsed)
        raise ConfigError(
            f"the mix's groups ({given}) cannot share num_envs={num_envs}: give every group a count, "
            "or leave the uncounted groups a multiple of their number"
        )
    for g in free:
        g["count"] = left // len(free)
    return [{"env_id": g["env_id"], "env_kwargs": g["env_kwargs"], "count": g["count"]} for g in parsed]


def settle_mix(groups, env_id: str, env_kwargs: dict | None, num_envs: int) -> tuple[dict | None, list[dict] | None]:
    """``(env_kwargs, mix)`` for a run: the groups resolved (``resolve_mix``) and checked
    (``check_mix_spaces``), a single group of ``env_id`` folded into ``env_kwargs``."""
    mix = resolve_mix(groups, env_id, num_envs)
    if mix is None:
        return env_kwargs, None
    if env_kwargs:
        raise ConfigError("give env_kwargs or a mix, not both (a mix group carries its own settings)")
    check_mix_spaces(mix)  # (for one group: that its settings build)
    if len(mix) == 1 and mix[0]["env_id"] == env_id:
        return mix[0]["env_kwargs"], None
    return None, mix


def is_mix(mix) -> bool:
    """More than one kind of env (a single group is settings only)."""
    return mix is not None and len(mix) > 1


def group_of(mix: list[dict]):
    """Each env's group index (envs are numbered group by group)."""
    import numpy as np

    return np.repeat(np.arange(len(mix)), [g["count"] for g in mix])


def mix_factories(mix: list[dict]) -> list:
    """One env constructor per env, group by group."""
    from .presets import env_factory

    out = []
    for g in mix:
        out += [env_factory(g["env_id"], g["env_kwargs"])] * g["count"]
    return out


def check_mix_spaces(mix: list[dict]) -> None:
    """ConfigError (one line) unless every group's action space equals the first's and its
    observation space has the same layout (leaves, shapes, dtypes; bounds may differ).
    Builds and closes one env of each group here."""
    from ..._core.segment import layout_of

    first = None
    for k, g in enumerate(mix):
        try:
            env = mix_factories([{**g, "count": 1}])[0]()
        except Exception as exc:  # a misspelt setting: TypeError from the env's constructor
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ConfigError(
                f"mix group {k} ({describe_group(g)}) does not build: {type(exc).__name__}: {msg}"
            ) from None
        try:
            spaces = env.observation_space, env.action_space
        finally:
            env.close()
        if first is None:
            first = spaces
            continue
        if spaces[1] != first[1]:
            raise ConfigError(
                f"mix group {k} ({describe_group(g)}) has action space {spaces[1]}, but group 0 has "
                f"{first[1]}: one policy acts for every env, so the action spaces must be equal"
            )
        if spaces[0] != first[0] and (layout_of(spaces[0]) is None or layout_of(spaces[0]) != layout_of(first[0])):
            raise ConfigError(
                f"mix group {k} ({describe_group(g)}) has observation space {spaces[0]}, but group 0 has "
                f"{first[0]}: the groups' observations must share leaves, shapes and dtypes"
            )


def describe_group(g: dict) -> str:
    settings = ",".join(f"{k}={json.dumps(v)}" for k, v in g["env_kwargs"].items())
    return g["env_id"] + (f"[{settings}]" if settings else "")


def describe_mix(mix: list[dict]) -> str:
    """``"4 x HalfCheetah-v5[frame_skip=5] + 4 x HalfCheetah-v5[frame_skip=20]"``."""
    return " + ".join(f"{g['count']} x {describe_group(g)}" for g in mix)
