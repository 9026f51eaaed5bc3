"""Env ids as the commands take them: one env made from an id, and why an id names no
env. Atari ids (``ALE/...``) register ale-py's envs first: gymnasium >= 1.0 registers
them only on request.

PettingZoo has no registry, so a multi-agent env is named by its import path:
``pettingzoo:MODULE`` (the module's ``parallel_env``, as PettingZoo's own envs and
mpe2's provide it: ``pettingzoo:mpe2.simple_spread_v3``) or ``pettingzoo:MODULE:NAME``
(any callable there returning a ``ParallelEnv``)."""

from __future__ import annotations

import importlib

__all__ = [
    "is_atari",
    "register_ale",
    "env_id_problem",
    "make_env",
    "PETTINGZOO",
    "is_pettingzoo",
    "make_parallel_env",
]

PETTINGZOO = "pettingzoo:"


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def register_ale() -> bool:
    """Register ale-py's envs with gymnasium; False where ale-py is not installed."""
    try:
        import ale_py
    except ImportError:
        return False
    import gymnasium as gym

    gym.register_envs(ale_py)
    return True


def is_pettingzoo(env_id) -> bool:
    """``env_id`` names a PettingZoo ParallelEnv (``pettingzoo:MODULE[:NAME]``)."""
    return isinstance(env_id, str) and env_id.startswith(PETTINGZOO)


def _parallel_target(env_id: str) -> tuple[str, str]:
    """``(module, callable name)`` of a ``pettingzoo:`` id; ValueError where malformed."""
    path = env_id[len(PETTINGZOO) :]
    module, _, name = path.partition(":")
    if not module or ":" in name or any(not part.isidentifier() for part in module.split(".")):
        raise ValueError(
            f"{env_id!r} is not a PettingZoo env path: write pettingzoo:MODULE (its parallel_env) "
            "or pettingzoo:MODULE:NAME, e.g. pettingzoo:mpe2.simple_spread_v3"
        )
    return module, name or "parallel_env"


def _parallel_fn(env_id: str):
    """The callable a ``pettingzoo:`` id names; ValueError saying why it cannot be had."""
    module, name = _parallel_target(env_id)
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"{env_id}: cannot import {module} ({exc})") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ValueError(f"{env_id}: {module} has no callable {name!r} (give pettingzoo:{module}:NAME)")
    return fn


def make_parallel_env(env_id: str, env_kwargs: dict | None = None):
    """One PettingZoo env for a ``pettingzoo:`` id (module-level, so that every start
    method can pickle ``partial(make_parallel_env, id, kwargs)``)."""
    return _parallel_fn(env_id)(**(env_kwargs or {}))


def env_id_problem(env_id: str, agents: bool = True) -> str | None:
    """Why ``env_id`` names no env, in one line; None where it does (a ``pettingzoo:``
    id: its module imports and has the callable; the env itself is checked when built).
    ``agents=False``: a command that takes gymnasium envs only."""
    import gymnasium as gym

    if is_pettingzoo(env_id) and not agents:
        return f"{env_id} is a PettingZoo env; this command takes gymnasium env ids (see fastvec.AgentVectorEnv)"
    if is_pettingzoo(env_id):
        try:
            _parallel_fn(env_id)
        except ValueError as exc:
            return str(exc)
        return None
    if is_atari(env_id) and not register_ale():
        return f"{env_id} needs ale-py (pip install ale-py)"
    try:
        gym.spec(env_id)
    except Exception as exc:  # gymnasium.error.NameNotFound / VersionNotFound / ...
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"unknown env id {env_id!r}: {msg}"
    return None


def make_env(env_id: str):
    """One env; module-level so that every start method can pickle ``partial(make_env, id)``."""
    import gymnasium as gym

    if is_atari(env_id):
        register_ale()
    return gym.make(env_id)
