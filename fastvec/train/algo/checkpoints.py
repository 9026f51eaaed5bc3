"""Checkpoints written by ``fastvec train``, and finding the one a resume starts from.

A checkpoint holds the weights, the config, the spaces and the env id (what ``fastvec
eval`` and ``--init-from`` need) and, since format 2, the ``train_state`` a resumed run
continues from (optimiser, counters, schedules' position, normalisers, episode window,
RNG states, wall time so far; see ``PPO.train_state``). Envs are not in it: a resumed
run resets them, seeded by the scheme its train state names (``env_seeding``, see
``fastvec.train.config.seeding``; a train state without it, written before, resumes with
``offset``). Format 3 names the policy's weights by its pieces (``actor_body.encoder.0.weight``,
``actor_head.weight``, ``body.encoder.convs.0.weight``); formats 1 and 2 (one
``actor`` / ``critic`` network each, a CNN ``trunk``) are read with their names mapped
to these (``upgrade_state_dict``): the same numbers, so they evaluate and resume as before.

In a run directory: ``checkpoint.pt`` (at the end of a run, on Ctrl-C / SIGTERM, and
when the envs fail) and ``checkpoints/step-<env steps>.pt`` (every ``checkpoint_every``
env steps, the last ``keep_checkpoints`` kept). Every write is atomic: a temporary file
in the same directory, flushed to disk, then renamed over the old name, so a process
killed at any moment leaves the previous checkpoint whole.
"""

from __future__ import annotations

import glob
import os
import re
import sys
import tempfile

import torch

from ..model.actor_critic import ActorCritic, describe_policy, make_policy

__all__ = [
    "CHECKPOINT_FORMAT",
    "save_checkpoint",
    "load_checkpoint",
    "policy_from_checkpoint",
    "check_spaces",
    "PeriodicCheckpoints",
    "resume_checkpoint",
    "newest_checkpoint",
    "upgrade_state_dict",
]

CHECKPOINT_FORMAT = "fastvec-ppo-3"
# 1: weights only (no train_state); 1 and 2: the policy's modules before it was made of pieces
READABLE_FORMATS = ("fastvec-ppo-1", "fastvec-ppo-2", CHECKPOINT_FORMAT)
_PERIODIC = re.compile(r"step-(\d+)\.pt$")
_TMP_PREFIX = ".tmp-"


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_torch_save(obj, path: str) -> str:
    """``torch.save`` to ``path`` so that no reader (and no crash) ever sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX + os.path.basename(path) + ".", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(folder)
    return path


def save_checkpoint(
    path: str,
    ppo,
    env_id: str | None,
    env_kwargs: dict | None,
    extra=None,
    train_state: dict | None = None,
    mix: list[dict] | None = None,
) -> str:
    """Write ``ppo``'s weights (and ``train_state``, for a resume) to ``path``, atomically.
    ``mix``: the run's groups of envs where they differ (``fastvec.train.config.mix``)."""
    from ... import __version__

    pol = ppo.policy
    state = {k: v.detach().cpu().clone() for k, v in pol.state_dict().items()}
    ckpt = {
        "format": CHECKPOINT_FORMAT,
        "fastvec_version": __version__,
        "env_id": env_id,
        "env_kwargs": dict(env_kwargs or {}),
        "mix": mix,
        "config": ppo.cfg.to_dict(),
        "observation_space": ppo.storage.single_observation_space,
        "action_space": ppo.storage.single_action_space,
        "agents": _agents_of(ppo.storage),
        "policy": describe_policy(pol),
        "state_dict": state,
        "env_steps": ppo.env_steps,
        "train_state": train_state,
        "extra": extra or {},
    }
    return atomic_torch_save(ckpt, path)


def _agents_of(storage) -> list | None:
    """A PettingZoo run's agents, in row order per copy (``AgentStorage``); None otherwise."""
    spec = getattr(storage, "spec", None)
    return None if spec is None else list(spec.agents)


def load_checkpoint(path: str) -> dict:
    """Load a checkpoint written by ``fastvec train``; ValueError with a one-line
    message if the file is missing or is not one."""
    if not os.path.exists(path):
        raise ValueError(f"checkpoint not found: {path}")
    if os.path.isdir(path):
        cand = os.path.join(path, "checkpoint.pt")
        if not os.path.exists(cand):
            raise ValueError(f"{path} is a directory without checkpoint.pt")
        path = cand
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(
            f"{path} is not a readable checkpoint: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    fmt = ckpt.get("format") if isinstance(ckpt, dict) else None
    if isinstance(fmt, str) and fmt.startswith("fastvec-ppo-") and fmt not in READABLE_FORMATS:
        raise ValueError(
            f"{path} was written by an incompatible fastvec version "
            f"({ckpt.get('fastvec_version', '?')}, format {fmt}; this version reads "
            f"{', '.join(READABLE_FORMATS)})"
        )
    if fmt not in READABLE_FORMATS:
        raise ValueError(f"{path} is not a fastvec PPO checkpoint")
    return ckpt


def upgrade_state_dict(state: dict, fmt: str) -> dict:
    """A policy's state dict written in checkpoint format ``fmt``, named as this version
    names it. Before format 3 an MLP side was one ``nn.Sequential`` whose last ``Linear``
    was its head (``actor.4.weight`` is ``actor_head.weight``, ``actor.0.weight`` is
    ``actor_body.encoder.0.weight``) and a CNN's body was ``trunk``."""
    if fmt == CHECKPOINT_FORMAT:
        return state
    out = {}
    last = {}  # side -> the index of its head (its last Linear)
    for k in state:
        side, _, rest = k.partition(".")
        if side in ("actor", "critic"):
            last[side] = max(last.get(side, -1), int(rest.split(".", 1)[0]))
    for k, v in state.items():
        side, _, rest = k.partition(".")
        if side in last:
            i, _, p = rest.partition(".")
            out[f"{side}_head.{p}" if int(i) == last[side] else f"{side}_body.encoder.{rest}"] = v
        elif side == "trunk":
            out[f"body.encoder.{rest}"] = v
        else:
            out[k] = v
    return out


def policy_from_checkpoint(ckpt: dict) -> ActorCritic:
    """The checkpoint's policy (in eval mode), its weights loaded."""
    c = ckpt["config"]
    pol = make_policy(
        ckpt["observation_space"],
        ckpt["action_space"],
        hidden=tuple(c["hidden"]),
        critic_hidden=None if c.get("critic_hidden") is None else tuple(c["critic_hidden"]),
        activation=c["activation"],
        ortho_init=False,
        log_std_init=c["log_std_init"],
        normalize_obs=c["normalize_obs"],
        core=c.get("policy_core", "none"),
        core_size=c.get("core_size", 128),
        action_masks=c.get("action_mask", "none") != "none",
    )
    pol.load_state_dict(upgrade_state_dict(ckpt["state_dict"], ckpt.get("format", CHECKPOINT_FORMAT)))
    pol.eval()
    return pol


def check_spaces(ckpt: dict, obs_space, act_space, env_id) -> None:
    if ckpt["observation_space"] != obs_space or ckpt["action_space"] != act_space:
        raise ValueError(
            f"checkpoint spaces (obs {ckpt['observation_space']}, actions {ckpt['action_space']}) "
            f"do not match {env_id} (obs {obs_space}, actions {act_space})"
        )


class PeriodicCheckpoints:
    """``run_dir/checkpoints/step-<env steps>.pt`` every ``every`` env steps (0: never),
    keeping the newest ``keep``."""

    def __init__(self, run_dir: str, every: int, keep: int):
        self.folder = os.path.join(run_dir, "checkpoints")
        self.every, self.keep = int(every), int(keep)
        self.next = None

    def start(self, env_steps: int) -> None:
        self.next = (env_steps // self.every + 1) * self.every if self.every else None

    def due(self, env_steps: int) -> bool:
        return self.next is not None and env_steps >= self.next

    def save(self, ppo, env_id, env_kwargs, train_state: dict, mix: list[dict] | None = None) -> str:
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"step-{ppo.env_steps:012d}.pt")
        save_checkpoint(path, ppo, env_id, env_kwargs, train_state=train_state, mix=mix)
        self.start(ppo.env_steps)
        for old in _periodic(self.folder)[: -self.keep]:
            try:
                os.unlink(old)
            except OSError:
                pass
        return path


def _periodic(folder: str) -> list[str]:
    """Periodic checkpoints in ``folder``, oldest first."""
    found = []
    for p in glob.glob(os.path.join(folder, "step-*.pt")):
        m = _PERIODIC.search(os.path.basename(p))
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def resume_checkpoint(run_dir: str) -> tuple[str, dict]:
    """The checkpoint a ``--resume`` of ``run_dir`` starts from: of ``checkpoint.pt`` and
    ``checkpoints/step-*.pt``, the readable one with the most env steps (a file that does
    not load is skipped with a warning; leftovers of interrupted writes are removed).
    ValueError (one line) when there is none, or only ones without a train state."""
    if not os.path.isdir(run_dir):
        raise ValueError(f"--resume: no run directory {run_dir}")
    folder = os.path.join(run_dir, "checkpoints")
    for tmp in glob.glob(os.path.join(run_dir, _TMP_PREFIX + "*")) + glob.glob(os.path.join(folder, _TMP_PREFIX + "*")):
        try:
            os.unlink(tmp)
        except OSError:
            pass
    paths = _periodic(folder)[::-1]
    final = os.path.join(run_dir, "checkpoint.pt")
    if os.path.exists(final):
        paths.insert(0, final)
    if not paths:
        raise ValueError(f"--resume: {run_dir} holds no checkpoint (checkpoint.pt or checkpoints/step-*.pt)")
    best, first_error, weights_only = None, None, None
    for p in paths:
        try:
            ck = load_checkpoint(p)
        except ValueError as exc:
            if "incompatible fastvec version" in str(exc):
                first_error = first_error or exc
                continue
            print(f"fastvec train: warning: skipping {exc}", file=sys.stderr)
            continue
        if ck.get("train_state") is None:
            weights_only = weights_only or p
            continue
        if best is None or ck["train_state"]["env_steps"] > best[1]["train_state"]["env_steps"]:
            best = (p, ck)
    if best is not None:
        return best
    if first_error is not None:
        raise first_error
    if weights_only is not None:
        raise ValueError(
            f"--resume: {weights_only} was written by an incompatible fastvec version "
            "(weights only, no training state); start a new run with --init-from it"
        )
    raise ValueError(f"--resume: no readable checkpoint in {run_dir}")


def newest_checkpoint(path: str) -> tuple[str, dict]:
    """The checkpoint ``path`` names: a checkpoint file, or a run directory's newest (of
    ``checkpoint.pt`` and ``checkpoints/step-*.pt``, the readable one with the most env
    steps; ``checkpoint.pt`` on a tie). ValueError (one line) when there is none."""
    if not os.path.isdir(path):
        return path, load_checkpoint(path)
    final = os.path.join(path, "checkpoint.pt")
    paths = ([final] if os.path.exists(final) else []) + _periodic(os.path.join(path, "checkpoints"))[::-1]
    if not paths:
        raise ValueError(f"{path} holds no checkpoint (checkpoint.pt or checkpoints/step-*.pt)")
    best, first_error = None, None
    for p in paths:
        try:
            ck = load_checkpoint(p)
        except ValueError as exc:
            first_error = first_error or exc
            continue
        if best is None or int(ck.get("env_steps") or 0) > int(best[1].get("env_steps") or 0):
            best = (p, ck)
    if best is None:
        raise ValueError(f"{path} holds no readable checkpoint ({first_error})")
    return best
