"""The front doors: the engine's ``StepResult`` turned into a public API.

- ``gymnasium``: ``AsyncVectorEnv``, a ``gymnasium.vector.VectorEnv`` (infos merged into
  ``{key, _key}`` arrays), put together from:
  - ``gymnasium_arguments``: its arguments, checked before any process starts;
  - ``gymnasium_steps``: ``reset`` and ``step``, and their infos;
  - ``gymnasium_calls``: calls in flight, calls to the envs, ``render``;
- ``sb3``: ``SubprocVecEnv``, Stable-Baselines3's ``VecEnv`` API (per-env info dicts);
- ``base``: what both share (the engine, the ring of result slots, open and closed, the
  checks of seeds, timeouts and ``num_workers``);
- ``batches``: ``send`` / ``recv``, batches of envs that step while the caller acts;
- ``vector_infos``: gymnasium's vector infos, for its door and its batches;
- ``gymnasium_agents``: ``AgentVectorEnv``, PettingZoo copies as gymnasium rows;
- ``sb3_agents``: ``AgentVecEnv``, the same as SB3 rows;
- ``threads``: torch's threads kept off the workers' cores;
- ``_gym_infos``, ``_sb3_infos`` (compiled, sources in ``csrc/fastvec/doors/``): each
  door's infos built from the shared info table in one pass, on the common step.

Neither door knows about processes, sockets or pickling: that is the engine's job.
"""
