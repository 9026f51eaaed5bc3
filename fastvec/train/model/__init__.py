"""The policy: an actor-critic built from the spaces, in three pieces.

- ``actor_critic``: ``ActorCritic`` (encoder, core, heads), chosen from the spaces;
- ``encoders``: observations to features (an MLP, Nature's CNN, the running normaliser);
- ``cores``: memory between the encoder and the heads (none, LSTM, GRU);
- ``distributions``: the action heads' distributions;
- ``acting``: the per-step forward as the hot loop runs it (functional or numpy);
- ``deployed``: the actor alone, observations to actions, as ``fastvec export`` writes it.
"""
