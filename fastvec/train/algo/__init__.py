"""PPO itself: collect, targets, update, and the state that carries them across rollouts.

- ``ppo``: ``PPO``, the three steps over one policy and rollout, and its train state;
- ``collect``: the policy acts into the storage for T steps;
- ``targets``: values, bootstraps, GAE or V-trace;
- ``update``: epochs of minibatches, the KL stop, the schedules;
- ``minibatch``: one minibatch's loss and gradient (autograd, or numpy for a small MLP);
- ``optim``: flat parameters, Adam, the learning rate's schedule;
- ``statistics``: episode tracking, reward scaling, bounded curves;
- ``checkpoints``: the train state on disk, and the checkpoint a resume starts from.
"""
