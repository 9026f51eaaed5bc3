"""``--set key=value``: parsing the keys of ``PPOConfig`` (and its transport's), and what
a resumed run may change (``SAFE_ON_RESUME``)."""

from __future__ import annotations

import math

from .settings import SET_FIELDS, SIZES, TRANSPORT_KEYS, ConfigError, PPOConfig, check_schedule_pair

__all__ = ["FIELD_KINDS", "apply_overrides", "SAFE_ON_RESUME", "check_resume_config", "schedule_note"]


_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}
_NONE = {"none", "null", ""}


def _parse_value(name: str, text: str, kind: str):
    t = text.strip()
    low = t.lower()
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    if optional and low in _NONE:
        return None
    try:
        if base == "int":
            f = float(t)  # accept 1e6 / 100_000
            if not f.is_integer():
                raise ValueError
            return int(f)
        if base == "float":
            v = float(t)
            if math.isnan(v):
                raise ValueError
            return v
        if base == "bool":
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if base == "ints":
            if low in ("none", "null"):  # no hidden layer: a linear policy
                return ()
            return tuple(int(x) for x in t.replace("x", ",").split(","))  # int(""): ValueError
        if base == "str":
            if not t:
                raise ValueError
            return t
    except ValueError:
        pass
    want = {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "ints": "comma-separated integers like 64,64, or none for no hidden layer",
        "str": "a non-empty string",
    }[base]
    raise ConfigError(f"bad value for {name}: {text!r} (expected {want}{' or none' if optional else ''})")


def _field_kinds() -> dict[str, str]:
    """Each flat key's kind of value (``FLAT_KEYS``' order): int, float, bool, ints, str;
    with ``?`` where none is allowed."""
    kinds = {}
    for f in SET_FIELDS:
        if f.name == "lr_schedule":
            kinds["anneal_lr"] = "bool"  # a property now; its place among the keys as before
        ann = str(f.type).replace(" ", "")
        opt = "None" in ann
        if ann.startswith("tuple"):
            k = "ints"
        elif ann.startswith("bool"):
            k = "bool"
        elif ann.startswith("int"):
            k = "int"
        elif ann.startswith("float"):
            k = "float"
        else:
            k = "str"
        kinds[f.name] = k + ("?" if opt else "")
    return kinds


FIELD_KINDS = _field_kinds()


def apply_overrides(cfg: PPOConfig, items) -> PPOConfig:
    """Apply ``["key=value", ...]`` (or a dict of already-typed values) to ``cfg``."""
    given = {}
    if isinstance(items, dict):
        for k, v in items.items():
            if k not in FIELD_KINDS:
                raise ConfigError(f"unknown config key {k!r}")
            if k in SIZES and v is not None:
                v = tuple(v)
            given[k] = v
    else:
        for item in items:
            if "=" not in item:
                raise ConfigError(f"--set expects key=value, got {item!r}")
            key, text = item.split("=", 1)
            key = key.strip().replace("-", "_")
            if key not in FIELD_KINDS:
                close = [k for k in FIELD_KINDS if key in k or k in key]
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise ConfigError(f"unknown --set key {key!r}{hint}; known keys: {', '.join(sorted(FIELD_KINDS))}")
            given[key] = _parse_value(key, text, FIELD_KINDS[key])
    if "anneal_lr" in given and "lr_schedule" in given:
        check_schedule_pair(given["anneal_lr"], given["lr_schedule"])
    for k, v in given.items():
        setattr(cfg, k, v)
    return cfg


# What a resumed run may change: how long it runs and when it stops, where and how fast
# it computes, how it logs and checkpoints, how it treats failing workers. Everything
# else shapes the learning itself (the envs, the rollout, the objective, the network,
# the seed, the learning rate's schedule) and stays the run's. Changing total_steps moves
# the linear schedule's end (it decays over total_steps from where it is); the adaptive
# schedule's rate is in the train state and goes on from where it was. Other devices or
# thread counts give results equal only up to floating-point rounding.
SAFE_ON_RESUME = frozenset(
    {
        "total_steps",
        "pipeline",
        "max_policy_lag",
        "rollout_buffers",
        "stop_at_return",
        "max_seconds",
        "solve_return",
        "device",
        "torch_threads",
        "learn_threads",
        "learner",
        "num_workers",
        "log_every_s",
        "checkpoint_every",
        "keep_checkpoints",
        "video_every",
        "video_settings",
        "restart_on_error",
        "max_restarts",
        "restart_window",
        "step_timeout",
        *TRANSPORT_KEYS,
    }
)


def schedule_note(cfg: PPOConfig) -> str | None:
    """A line for the user where the linear schedule ends before the run does (its rate is
    0 from ``lr_horizon`` on: those steps collect but do not learn)."""
    h = cfg.lr_horizon
    if h is None or cfg.lr_schedule != "linear" or h >= cfg.total_steps:
        return None
    return (
        f"the learning rate reaches 0 at lr_horizon={h:,} env steps; the last "
        f"{cfg.total_steps - h:,} of total_steps={cfg.total_steps:,} will not learn"
    )


def check_resume_config(run: PPOConfig, new: PPOConfig) -> None:
    """ConfigError unless ``new`` differs from the run's config ``run`` in safe keys only."""
    changed = [k for k in FIELD_KINDS if getattr(run, k) != getattr(new, k)]
    unsafe = [k for k in changed if k not in SAFE_ON_RESUME]
    if unsafe:
        detail = ", ".join(f"{k} ({getattr(run, k)!r} -> {getattr(new, k)!r})" for k in unsafe)
        raise ConfigError(
            f"--resume continues the run's config; it cannot change {detail} "
            f"(safe to change: {', '.join(sorted(SAFE_ON_RESUME))})"
        )
