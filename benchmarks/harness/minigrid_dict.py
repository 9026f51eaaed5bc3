"""MiniGrid's DoorKey-5x5 as a Dict observation that fastvec and SB3 both encode:
``{"image": Box(0, 10, (7, 7, 3), float32), "direction": Discrete(4)}``.

MiniGrid's own observation is ``{"image": uint8 (7, 7, 3), "direction": Discrete(4),
"mission": Text}``. Two leaves need a wrapper before either trainer can take it:

- ``mission`` is a Text leaf (on DoorKey always the same sentence), which neither SB3's
  ``CombinedExtractor`` nor fastvec encodes: dropped.
- ``image`` is not a picture but the 7x7 cells in view, each (object, colour, state)
  codes (at most 10). As uint8 both trainers would send it to the Nature CNN, whose
  first 8x8 kernel does not fit 7x7: given as float32 in [0, 10], a vector leaf, which
  SB3 flattens and fastvec encodes with an MLP.

``direction`` stays Discrete (one-hot in both). Named on the command line as
``harness.minigrid_dict:door_key`` (a ``MODULE:CALLABLE`` entry point, ``benchmarks/``
on the path).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

ENV_ID = "MiniGrid-DoorKey-5x5-v0"


class CodesDict(gym.ObservationWrapper):
    """MiniGrid's observation without ``mission``, its ``image`` as float32 codes."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        image = env.observation_space["image"]
        self.observation_space = gym.spaces.Dict(
            {
                "image": gym.spaces.Box(0.0, 10.0, image.shape, np.float32),
                "direction": env.observation_space["direction"],
            }
        )

    def observation(self, observation):
        return {"image": observation["image"].astype(np.float32), "direction": observation["direction"]}


def door_key(**kwargs) -> gym.Env:
    """``MiniGrid-DoorKey-5x5-v0`` (its 250-step limit its own) as ``CodesDict``."""
    import minigrid  # noqa: F401  (registers the MiniGrid envs)

    return CodesDict(gym.make(ENV_ID, **kwargs))
