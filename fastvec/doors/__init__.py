"""The front doors: the engine's ``StepResult`` turned into a public API.

- ``fastvec.doors.gymnasium``: ``AsyncVectorEnv``, a ``gymnasium.vector.VectorEnv``, put
  together from ``gymnasium_arguments`` (its arguments, checked before any process
  starts), ``gymnasium_steps`` (``reset``/``step``; infos merged into ``{key, _key}``
  arrays, compiled for the common step in ``_gym_infos``), ``gymnasium_calls`` (calls
  in flight, calls to the envs) and ``batches`` (EnvPool's ``send``/``recv``);
- ``fastvec.doors.sb3``: ``SubprocVecEnv``, Stable-Baselines3's ``VecEnv`` API
  (per-env info dicts; compiled for the common step in ``_sb3_infos``);
- ``fastvec.doors.base``: what both share (the ring of result slots, open and closed,
  the checks of seeds, timeouts and ``num_workers``).

Neither door knows about processes, sockets or pickling: that is the engine's job.
"""
