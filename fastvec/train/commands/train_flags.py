"""``fastvec train``'s flags, in three groups: what the run trains on and for how long
(``run_flags``), the checkpoints it starts from and the files it writes (``file_flags``),
where its envs run (``backend_flags``). ``fastvec.train.commands.cli`` reads them."""

from __future__ import annotations

import argparse

from ..._cli_util import add_env_kwargs, duration
from .outputs import add_track_flags

__all__ = ["run_flags", "file_flags", "backend_flags"]


def run_flags(p: argparse.ArgumentParser) -> None:
    """What the run trains on and for how long, and its hyperparameters."""
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--num-envs", type=int, default=None)
    p.add_argument(
        "--mix",
        action="append",
        default=None,
        metavar="GROUP",
        help="a group of the run's envs (repeatable): [id=ENV_ID,][count=N,]setting=value,... with the "
        "env's constructor settings, e.g. --mix frame_skip=5 --mix frame_skip=20 (ENV_ID's preset; "
        "uncounted groups share the envs equally; a mix is placed on the workers by cost)",
    )
    add_env_kwargs(p)
    p.add_argument("--num-workers", type=int, default=None)
    p.add_argument("--total-steps", type=float, default=None, help="env steps (1e6 accepted)")
    p.add_argument(
        "--stop-at-return",
        type=float,
        default=None,
        help="stop once the mean return of the last 20 episodes reaches this",
    )
    p.add_argument(
        "--max-time",
        type=duration,
        default=None,
        metavar="DURATION",
        help="stop at the first safe point after this much wall time, e.g. 300, 90s, 5m, 1.5h "
        "(the final checkpoint and result as at the end; the schedules do not change)",
    )
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a hyperparameter (repeatable)",
    )
    p.add_argument(
        "--action-mask",
        default=None,
        choices=["none", "auto", "info", "method", "dict"],
        help='where the env\'s action masks come from: info["action_mask"], its action_masks() method, '
        'the "action_mask" key of its Dict observation, auto (whichever it gives) or none (default)',
    )
    p.add_argument("--zoo", action="store_true", help="use RL Zoo's hyperparameters where known (CartPole)")
    p.add_argument("--list-keys", action="store_true", help="print the config for ENV_ID and exit")


def file_flags(p: argparse.ArgumentParser) -> None:
    """Checkpoints to start from or continue, and what the run writes."""
    p.add_argument("--logdir", default=None, help="run directory (default: runs/ENV-seedN-TIME)")
    p.add_argument(
        "--init-from", default=None, metavar="CHECKPOINT", help="start from the weights of a checkpoint of the same env"
    )
    p.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint (same config; "
        "--total-steps, --stop-at-return, --device and other safe keys may change)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=float,
        default=None,
        metavar="N",
        help="env steps between checkpoints in the run directory (1e5 accepted; 0: only at the end; default 100000)",
    )
    p.add_argument(
        "--video-every",
        type=float,
        default=None,
        metavar="N",
        help="film one deterministic evaluation episode every N env steps into RUN_DIR/videos/ "
        "(its first 10 s, MuJoCo's draft look: see --video-settings) in a process of its own that films "
        'while the trainer learns (1e5 accepted; needs imageio-ffmpeg: pip install "fastvec[envs]")',
    )
    p.add_argument(
        "--video-settings",
        default=None,
        metavar="KEY=VALUE,...",
        help="the filmed env's own settings: width=320,height=240, a camera "
        '(MuJoCo: default_camera_config={"type":2,"trackbodyid":1} follows the body); and the film\'s: '
        "seconds=S of each episode (0: all; default 10), look=draft|full (MuJoCo's shadows, reflections, "
        "anti-aliasing; default draft)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-tensorboard", action="store_true", help="skip TensorBoard event files")
    add_track_flags(p)


def backend_flags(p: argparse.ArgumentParser) -> None:
    """Where the envs run, and on how many learners."""
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="data-parallel ranks on this machine, each with its share of num_envs and a replica of the "
        "policy, gradients summed over them (gloo on the CPU, NCCL on one CUDA device each; default 1; "
        "under torchrun: its WORLD_SIZE)",
    )
    p.add_argument(
        "--backend",
        choices=["engine", "ray"],
        default="engine",
        help="engine: envs on this machine (default); ray: envs in Ray actors over a "
        'cluster (pip install "fastvec[ray]"), --num-workers then counts per actor',
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="with --backend ray: the cluster to join (default: start a local Ray instance on 127.0.0.1)",
    )
    p.add_argument(
        "--actors",
        type=int,
        default=None,
        metavar="N",
        help="with --backend ray: Ray actors hosting the envs (default: one per node)",
    )
