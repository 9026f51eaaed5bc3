"""A training run: the loop over rollouts and what it leaves behind.

- ``loop``: ``train(cfg, storage, monitor)``, which builds no envs;
- ``report``: the scalars of each logging point and the run's result;
- ``monitor``: the run directory, TensorBoard, metrics, the curve, health probes;
- ``tracking``: a tracker besides TensorBoard (``--track wandb``), one more sink of the monitor;
- ``card``: the run directory's model card, ``README.md``;
- ``stops``: what ends a run early: worker restarts past their limit, Ctrl-C, SIGTERM.
"""
