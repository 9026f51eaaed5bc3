"""Gymnasium env ids as the commands take them: one env made from an id, and why an id
names no env. Atari ids (``ALE/...``) register ale-py's envs first: gymnasium >= 1.0
registers them only on request."""

from __future__ import annotations

__all__ = ["is_atari", "register_ale", "env_id_problem", "make_env"]


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


def env_id_problem(env_id: str) -> str | None:
    """Why gymnasium does not know ``env_id``, in one line; None where it does."""
    import gymnasium as gym

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
