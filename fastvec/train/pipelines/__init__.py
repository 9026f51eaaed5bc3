"""When a run collects and when it learns.

- ``lockstep``: ``Schedule``, the protocol, and ``LockStep``: collect, then learn;
- ``collector``: ``pipeline=async`` from the collector's end: the envs keep stepping
  while a learner process learns on the rollout before;
- ``ring``: the engine's ring as K rollouts, one section each;
- ``handoff``: what the collector and the learner share (weights, the rollout's
  section, the train state) and the wire between them; ``seqlock`` (compiled) guards it;
- ``learner``: the learner process's main loop;
- ``watch``: the learner process seen from the collector: started, watched, stopped.
"""
