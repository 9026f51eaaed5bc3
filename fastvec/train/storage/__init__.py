"""Rollout storage: where rollouts live, and the learner's tensors over them.

- ``sources``: ``RolloutStorage``, the one protocol, and the engine's ring as one (local
  or Ray);
- ``vector_copies``: gymnasium's and SB3's vector envs, copied into arrays of the same layout;
- ``agent_rows``: the engine's ring seen as one row per PettingZoo agent;
- ``member_rows``: a population's engine seen as each member's own rows;
- ``rollout``: ``Rollout``, the learner's tensors over a storage's ``[T + 1, N, ...]``.
"""
