#!/usr/bin/env python
"""Action masks: ``fastvec train Taxi-v4`` against sb3-contrib's ``MaskablePPO``, with and
without masks, to a mean return of 7.0.

    python benchmarks/bench_masks.py --out benchmarks/results/masks --seeds 1 2 3   # needs sb3-contrib
    python benchmarks/bench_masks.py --seeds 1 --max-steps 4096 --threshold -1000    # a smoke run

Taxi's solved level is about 8 (gymnasium's ``reward_threshold``); 7.0 is the level
issue 60 times. gymnasium 1.4 names the env ``Taxi-v4`` (``Taxi-v3`` is deprecated
there; the same task, its ``info["action_mask"]`` as before). Four candidates, each run
a fresh process, interleaved seed by seed in an order that rotates:

- ``fastvec masked``: ``fastvec train Taxi-v4 --action-mask info --stop-at-return 7``
  with ``--fastvec-set`` on the command line (default ``n_epochs=10
  lr_schedule=constant``: MaskablePPO's ten epochs and constant learning rate on the
  trainer's defaults otherwise, 8 envs x 128 steps, minibatch 256; with the trainer's
  own 4 epochs and a rate decaying to 0 over ``--max-steps``, seed 1 was still at
  random play's -194 after 200k steps);
- ``fastvec unmasked``: the same with ``--action-mask none``;
- ``MaskablePPO masked``: sb3-contrib 2.9's ``MaskablePPO("MlpPolicy", env)`` with its
  documented defaults (one env wrapped in ``ActionMasker`` with Taxi's own
  ``action_mask``, n_steps 2048, batch 64, 10 epochs, lr 3e-4), until the mean return
  of the last 20 episodes reaches the threshold;
- ``MaskablePPO unmasked``: the same, ``learn(use_masking=False)``.

Reported per candidate: seeds that reached the threshold, the wall time and env steps
to it (medians, min-max), the best mean return of 20 consecutive episodes each run
reached (for MaskablePPO checked at every step, for fastvec at its logging points, once
a second, and at its end: a bound from below), and each fastvec candidate's median time
over the masked MaskablePPO's. Every run uses one torch thread and counts its start-up.
Writes ``masks.json`` and ``masks.md`` into ``--out``.
"""

from __future__ import annotations

import collections
import json
import sys
import time

from harness.common import machine, write_results
from harness.races import child_run, fastvec_run, race, race_header, race_parser, race_table

ENV = "Taxi-v4"
CANDIDATES = ("fastvec masked", "fastvec unmasked", "MaskablePPO masked", "MaskablePPO unmasked")


def taxi_mask(env):
    """Taxi's own action mask of its current state (what ``info["action_mask"]`` holds)."""
    return env.unwrapped.action_mask(env.unwrapped.s)


def child_maskable(seed: int, masked: bool, threshold: float, max_steps: int) -> dict:
    """sb3-contrib's MaskablePPO with its defaults until the last 20 episodes' mean return
    reaches ``threshold`` (or ``max_steps``)."""
    import numpy as np
    import torch
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.wrappers import ActionMasker
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    p = torch.nn.Parameter(torch.zeros(4))
    (p * 2).sum().backward()
    torch.optim.Adam([p]).step()  # torch's first-use imports, before the clock

    class Stop(BaseCallback):
        def __init__(self):
            super().__init__()
            self.rets: collections.deque = collections.deque(maxlen=20)
            self.solved = False
            self.best = None

        def _on_step(self):
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.rets.append(info["episode"]["r"])
            if len(self.rets) == 20:
                mean = float(np.mean(self.rets))
                self.best = mean if self.best is None else max(self.best, mean)
            self.solved = self.best is not None and self.best >= threshold
            return not self.solved

    t0 = time.perf_counter()
    env = make_vec_env(
        ENV, n_envs=1, seed=seed, wrapper_class=ActionMasker, wrapper_kwargs={"action_mask_fn": taxi_mask}
    )
    model = MaskablePPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0)
    stop = Stop()
    model.learn(max_steps, callback=stop, use_masking=masked)
    wall = time.perf_counter() - t0
    env.close()
    return {
        "solved": stop.solved,
        "env_steps": int(model.num_timesteps),
        "wall_seconds": wall,
        "final_mean_return": float(np.mean(stop.rets)) if stop.rets else None,
        "best_mean_return": stop.best,
    }


def one_run(name: str, seed: int, args) -> dict:
    """One candidate on one seed, in a fresh process."""
    masked = name.endswith(" masked")
    if name.startswith("fastvec"):
        return fastvec_run(ENV, seed, args, ["--action-mask", "info" if masked else "none"])
    job = {"seed": seed, "masked": masked, "threshold": args.threshold, "max_steps": args.max_steps}
    return child_run(__file__, name, seed, job, args.timeout)


def report(runs: dict, args, wall: float) -> str:
    table, level = race_table(runs, "MaskablePPO masked")
    lines = [
        *race_header(f"Action masks: {ENV}", args, wall),
        *table,
        "",
        f"fastvec's settings: {' '.join(f'--set {s}' for s in args.fastvec_set if s) or 'the defaults'}. "
        f"Best mean return: the highest mean of 20 consecutive episodes a run reached; the highest "
        f"level every run of every candidate reached: {level}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--_child":
        print(json.dumps(child_maskable(**json.loads(sys.argv[2]))))
        return 0
    ap = race_parser(__doc__.splitlines()[0], 7.0, 2_000_000, ["n_epochs=10", "lr_schedule=constant"])
    args = ap.parse_args(argv)
    args.command = "python bench_masks.py " + " ".join(sys.argv[1:] if argv is None else argv)
    runs, wall = race(CANDIDATES, args, one_run)
    data = {
        "env_id": ENV,
        "seeds": args.seeds,
        "threshold": args.threshold,
        "max_steps": args.max_steps,
        "fastvec_set": args.fastvec_set,
        "runs": runs,
        "machine": machine(args.command),
    }
    write_results(args.out, report(runs, args, wall), data, stem="masks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
