"""The run's settings: what a user may set, and what each env starts from.

- ``settings``: ``PPOConfig`` (every hyperparameter, each with a docstring) and its
  ``TransportConfig`` (how the envs run);
- ``rules``: the rules the values obey, ``ConfigError``, and the names the model accepts;
- ``overrides``: ``--set key=value`` parsing, and what a resume may change;
- ``presets``: per-env hyperparameters, env construction, the envs the trainer registers;
- ``mix``: several env ids (and constructor settings) in one run.

The bottom layer of the trainer: it imports nothing else of ``fastvec.train``.
"""

from .overrides import apply_overrides
from .presets import env_factory, preset_for, solve_threshold
from .rules import ConfigError
from .settings import PPOConfig, TransportConfig

__all__ = [
    "PPOConfig",
    "TransportConfig",
    "ConfigError",
    "apply_overrides",
    "preset_for",
    "env_factory",
    "solve_threshold",
]
