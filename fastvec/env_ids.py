"""Env ids as the commands take them: one env made from an id, and why an id names no
env. Atari ids (``ALE/...``) register ale-py's envs first: gymnasium >= 1.0 registers
them only on request.

PettingZoo has no registry, so a multi-agent env is named by its import path:
``pettingzoo:MODULE`` (the module's ``parallel_env``, as PettingZoo's own envs and
mpe2's provide it: ``pettingzoo:mpe2.simple_spread_v3``) or ``pettingzoo:MODULE:NAME``
(any callable there returning a ``ParallelEnv``).

A gymnasium env of your own is named the same way, ``MODULE:NAME`` (any prefix but
``pettingzoo:``), and ``MODULE`` is imported first, here and in every worker:

- ``MODULE:ENV_ID``, where importing ``MODULE`` registers ``ENV_ID`` with gymnasium
  (``mypackage.envs:MyEnv-v0``): gymnasium's own syntax, made by ``gymnasium.make``.
- ``MODULE:CALLABLE``, any class or function there that returns a ``gymnasium.Env``
  (``mypackage.envs:MyEnv``), called with the env's settings as keyword arguments:
  an entry point, used as it returns the env (no wrappers added).

``NAME`` is told apart by what it is once ``MODULE`` is imported: an id in gymnasium's
registry (looked up first, as ``gymnasium.make`` would), else a callable attribute."""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

__all__ = [
    "is_atari",
    "register_ale",
    "env_id_problem",
    "make_env",
    "PETTINGZOO",
    "is_pettingzoo",
    "make_parallel_env",
    "own_env_parts",
    "own_env_kind",
    "resolve_own_env",
    "make_entry_env",
    "env_problem",
    "registered_spec",
    "parse_settings",
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
    id: its module imports and has the callable; a ``MODULE:NAME``: its module imports and
    registers ``NAME`` or holds a callable of that name; the env itself is checked when
    built, an entry point's by ``env_problem``).
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
    if own_env_parts(env_id) is not None:
        try:
            resolve_own_env(env_id)
        except ValueError as exc:
            return str(exc)
        return None
    if is_atari(env_id) and not register_ale():
        return f"{env_id} needs ale-py (pip install ale-py)"
    try:
        gym.spec(env_id)
    except Exception as exc:  # gymnasium.error.NameNotFound / VersionNotFound / ...
        why = _first_line(exc) or type(exc).__name__
        return f"unknown env id {env_id!r}: {why} (an env of your own: MODULE:ENV_ID or MODULE:CALLABLE)"
    return None


def make_env(env_id: str, env_kwargs: dict | None = None):
    """One env with ``env_kwargs`` as its settings; module-level so that every start
    method can pickle ``partial(make_env, id, kwargs)``."""
    import gymnasium as gym

    if own_env_kind(env_id) == "entry":
        return make_entry_env(env_id, env_kwargs)
    if is_atari(env_id):
        register_ale()
    return gym.make(env_id, **(env_kwargs or {}))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def own_env_parts(env_id) -> tuple[str, str] | None:
    """``(module, name)`` of an env of your own (``MODULE:NAME``, not ``pettingzoo:``);
    None for any other id."""
    if not isinstance(env_id, str) or is_pettingzoo(env_id) or ":" not in env_id:
        return None
    module, _, name = env_id.partition(":")
    return module, name


def resolve_own_env(env_id: str) -> tuple[str, Any]:
    """``("id", its EnvSpec)`` or ``("entry", the callable)`` for a ``MODULE:NAME`` env,
    its module imported; ValueError, one line, saying why it names no env."""
    import gymnasium as gym

    parts = own_env_parts(env_id)
    module, name = parts if parts is not None else ("", "")
    if not name or ":" in name or any(not p.isidentifier() for p in module.split(".")):
        raise ValueError(
            f"{env_id!r} is not an env of your own: write MODULE:ENV_ID (an id MODULE registers with gymnasium) "
            "or MODULE:CALLABLE (returning a gymnasium.Env), e.g. mypackage.envs:MyEnv-v0"
        )
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # ImportError, or whatever the module raised while importing
        raise ValueError(f"{env_id}: cannot import {module} ({type(exc).__name__}: {_first_line(exc)})") from None
    if name in gym.registry:
        return "id", gym.registry[name]
    fn = getattr(mod, name, None) if name.isidentifier() else None
    if callable(fn):
        return "entry", fn
    ids = _registered_by(module)
    known = f"it registers {', '.join(ids)}" if ids else "it registers no env id"
    if not name.isidentifier():
        raise ValueError(f"{env_id}: importing {module} registered no env id {name!r} ({known})")
    what = f"{module} has no {name}" if fn is None else f"{module}.{name} is of type {type(fn).__name__}"
    raise ValueError(
        f"{env_id}: {name!r} is neither an env id {module} registers nor a callable in it ({what}; {known})"
    )


def _registered_by(module: str, most: int = 5) -> list[str]:
    """Ids in gymnasium's registry whose entry point lives in ``module`` (a hint)."""
    import gymnasium as gym

    out = []
    for spec in gym.registry.values():
        ep = spec.entry_point
        where = ep.partition(":")[0] if isinstance(ep, str) else getattr(ep, "__module__", "") or ""
        if where == module or where.startswith(module + "."):
            out.append(spec.id)
    return out[:most] + (["..."] if len(out) > most else [])


def own_env_kind(env_id) -> str | None:
    """``"id"`` or ``"entry"`` for an env of your own (ValueError where it names none);
    None for any other id."""
    return None if own_env_parts(env_id) is None else resolve_own_env(env_id)[0]


def registered_spec(env_id: str):
    """gymnasium's ``EnvSpec`` for ``env_id`` (``MODULE:ENV_ID`` too); None where there is none."""
    import gymnasium as gym

    try:
        if own_env_parts(env_id) is not None:
            kind, spec = resolve_own_env(env_id)
            return spec if kind == "id" else None
        return gym.spec(env_id)
    except Exception:
        return None


def _not_an_env(env_id: str, obj) -> str | None:
    import gymnasium as gym

    if isinstance(obj, gym.Env):
        return None
    return f"{env_id} returned an object of type {type(obj).__name__}, not a gymnasium.Env (an entry point must)"


def make_entry_env(env_id: str, env_kwargs: dict | None = None):
    """The env a ``MODULE:CALLABLE`` entry point returns for ``env_kwargs`` (TypeError
    where it is no ``gymnasium.Env``); module-level, so that a worker started by any
    method imports ``MODULE`` itself."""
    env = _build(env_id, env_kwargs)
    why = _not_an_env(env_id, env)
    if why is not None:
        raise TypeError(why)
    return env


def env_problem(env_id: str, env_kwargs: dict | None = None, agents: bool = True) -> str | None:
    """``env_id_problem``, then one env built here where ``env_id`` is an env of your own
    (``MODULE:ENV_ID`` or an entry point ``MODULE:CALLABLE``) or ``env_kwargs`` are given:
    why it fails to build with them, is no ``gymnasium.Env``, or has a composite action
    space with a leaf the trainer cannot act on (``fastvec.composite_actions``), in one
    line; None where it builds."""
    why = env_id_problem(env_id, agents)
    if why is not None or is_pettingzoo(env_id) or (not env_kwargs and own_env_kind(env_id) is None):
        return why
    try:
        env = _build(env_id, env_kwargs)
    except Exception as exc:  # a setting the env does not take, or the env's own failure
        return f"{env_id} with settings {dict(env_kwargs or {})} raised {type(exc).__name__}: {_first_line(exc)}"
    why = _not_an_env(env_id, env) or _action_problem(env_id, env)
    close = getattr(env, "close", None)
    if callable(close):
        close()
    return why


def _action_problem(env_id: str, env) -> str | None:
    """Why the trainer cannot act on ``env``'s composite action space (None: it can, or
    the space is not composite)."""
    from .composite_actions import action_leaves, is_composite_action

    if not is_composite_action(env.action_space):
        return None
    try:
        action_leaves(env.action_space)
    except ValueError as exc:
        return f"{env_id}: {exc}"
    return None


def _build(env_id: str, env_kwargs: dict | None):
    """What ``make_env`` builds, an entry point's return value unchecked."""
    kind, fn = resolve_own_env(env_id) if own_env_parts(env_id) is not None else ("", None)
    if kind == "entry":
        return fn(**(env_kwargs or {}))
    return make_env(env_id, env_kwargs)


_SPLIT = re.compile(r",(?=\s*[A-Za-z_][A-Za-z0-9_.]*\s*=)")  # commas that start the next key


def parse_settings(text: str, what: str = "") -> dict:
    """``"key=value,key=value"`` as a dict, each value read as JSON where it parses
    (``20``, ``0.1``, ``true``, ``[1, 2]``), as text otherwise; ValueError (its message
    led by ``what``) on bad text or a key given twice."""
    lead = f"{what}: " if what else ""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{lead}expected key=value[,key=value...], got {text!r}")
    out: dict = {}
    for item in _SPLIT.split(text.strip()):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"{lead}expected key=value[,key=value...], got {text!r}")
        if key in out:
            raise ValueError(f"{lead}{text!r} gives {key} twice")
        try:
            out[key] = json.loads(raw.strip())
        except ValueError:
            out[key] = raw.strip()
    return out
