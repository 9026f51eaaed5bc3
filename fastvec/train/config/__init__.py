"""The run's settings: what a user may set, and what each env starts from.

- ``settings``: ``PPOConfig`` (every hyperparameter, each with a docstring) and its
  ``TransportConfig`` (how the envs run);
- ``rules``: the rules the values obey, ``ConfigError``, and the names the model accepts;
- ``overrides``: ``--set key=value`` parsing, and what a resume may change;
- ``presets``: per-env hyperparameters, env construction, the envs the trainer registers;
- ``mix``: several env ids (and constructor settings) in one run;
- ``seeding``: each env's reset seed, from a stream of its own.

The bottom layer of the trainer: it imports nothing else of ``fastvec.train``.
"""
