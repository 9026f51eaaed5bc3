"""Rollout storage: where rollouts live, and the learner's tensors over them.

- ``sources``: ``RolloutStorage``, the one protocol, and its kinds (the engine's ring,
  gymnasium's and SB3's vector envs, Ray);
- ``agent_rows``: the engine's ring seen as one row per PettingZoo agent;
- ``rollout``: ``Rollout``, the learner's tensors over a storage's ``[T + 1, N, ...]``.
"""
