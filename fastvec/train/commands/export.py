"""``fastvec export``: a trained policy written as one file that runs without fastvec.

    fastvec export RUN --format torchscript|onnx OUT [--stochastic]

``RUN`` is a run directory (its newest checkpoint: ``checkpoint.pt`` or
``checkpoints/step-*.pt``) or a checkpoint file. ``OUT`` is the file written: a TorchScript
module (``torch.jit.load(OUT)``) or an ONNX model (``onnxruntime.InferenceSession(OUT)``),
either one holding the policy's actor as ``fastvec.train.model.deployed.DeployedPolicy``
computes it: observations in (and a recurrent policy's state), actions out, the
observation normaliser inside, deterministic unless ``--stochastic``. Inputs ``obs`` (and
``state``); outputs ``action`` (and ``next_state``); the batch dimension is free.

The file carries what the run was (env id, spaces, env steps, state size) as JSON: a
TorchScript file's extra file ``fastvec_policy.json``, an ONNX model's metadata key
``fastvec_policy``.

Prints one JSON object (the file, its inputs and outputs) and exits 0. Bad input (an
unknown format, a run directory without a checkpoint, a format whose packages are not
installed) gives one line ``fastvec export: error: ...`` and exit status 2.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import warnings

import numpy as np
import torch

from ..._cli_util import OneLineParser
from ..algo.checkpoints import newest_checkpoint, policy_from_checkpoint
from ..model.deployed import DeployedPolicy

__all__ = ["FORMATS", "export_policy", "main"]

FORMATS = ("torchscript", "onnx")
"""The formats ``fastvec export`` writes."""

_NEEDS = {"onnx": ("onnx", "onnxscript")}  # the packages a format's writer imports, beside torch


def export_policy(run: str, out: str, *, format: str, deterministic: bool = True) -> dict:
    """Write the policy of ``run`` (a run directory or a checkpoint file) to ``out`` in
    ``format`` (``FORMATS``); see the module docstring. Returns what was written: the
    file, the checkpoint it came from, its inputs and outputs as ``{name: [shape,
    dtype]}`` (``"batch"`` for the free dimension). ValueError (one line) on bad input."""
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")
    _check_installed(format)
    path, ckpt = newest_checkpoint(run)
    policy = policy_from_checkpoint(ckpt)
    module = DeployedPolicy(policy, deterministic=deterministic)
    example = _example_inputs(ckpt["observation_space"], module)
    names = ["obs", "state"][: len(example)]
    outputs = ["action", "next_state"][: len(example)]
    with torch.no_grad():
        produced = module(*example)
    produced = produced if isinstance(produced, tuple) else (produced,)
    info = {
        "format": format,
        "path": os.path.abspath(out),
        "checkpoint": os.path.abspath(path),
        "env_id": ckpt.get("env_id"),
        "env_kwargs": ckpt.get("env_kwargs") or {},
        "env_steps": ckpt.get("env_steps"),
        "observation_space": str(ckpt["observation_space"]),
        "action_space": str(ckpt["action_space"]),
        "deterministic": bool(deterministic),
        "state_size": module.state_size,
        "inputs": {n: _signature(t) for n, t in zip(names, example)},
        "outputs": {n: _signature(t) for n, t in zip(outputs, produced)},
    }
    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    if format == "torchscript":
        _write_torchscript(module, example, out, info)
    else:
        _write_onnx(module, example, out, info, (names, outputs))
    return info


def _check_installed(format: str) -> None:
    for pkg in _NEEDS.get(format, ()):
        try:
            __import__(pkg)
        except ImportError:
            raise ValueError(
                f"the {format} format needs the {' and '.join(_NEEDS[format])} packages, and {pkg} is not "
                'installed: pip install "fastvec[export]"'
            ) from None


def _example_inputs(obs_space, module: DeployedPolicy) -> tuple[torch.Tensor, ...]:
    """A batch of two observations (drawn from the space, seeded) and, for a recurrent
    policy, a zero state: what the writers trace the forward with."""
    obs_space.seed(0)
    obs = torch.as_tensor(np.stack([np.asarray(obs_space.sample()) for _ in range(2)]))
    if not module.recurrent:
        return (obs,)
    return obs, torch.zeros(2, module.state_size)


def _signature(t: torch.Tensor) -> list:
    return [["batch", *t.shape[1:]], str(t.dtype).removeprefix("torch.")]


@contextlib.contextmanager
def _quiet():
    """torch's own notes while it writes (deprecations, the tracer's on nn.LSTM's size
    checks, the ONNX exporter's on torchvision's absence) kept off the command's output."""
    log = logging.getLogger("torch.onnx")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, UserWarning, torch.jit.TracerWarning))
            yield
    finally:
        log.setLevel(level)


def _write_torchscript(module: DeployedPolicy, example, out: str, info: dict) -> None:
    # Traced, not scripted: the forward's branches on the policy's kind are fixed here.
    with torch.no_grad(), _quiet():
        traced = torch.jit.trace(module, example, check_trace=module.deterministic)
        torch.jit.save(traced, out, _extra_files={"fastvec_policy.json": json.dumps(info)})


def _write_onnx(module: DeployedPolicy, example, out: str, info: dict, names) -> None:
    import onnx

    inputs, outputs = names
    batch = torch.export.Dim("batch", min=1)
    dynamic = tuple({0: batch} for _ in example)
    with torch.no_grad(), _quiet():
        torch.onnx.export(
            module,
            example,
            out,
            input_names=inputs,
            output_names=outputs,
            dynamic_shapes=dynamic,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    model = onnx.load(out)
    onnx.helper.set_model_props(model, {"fastvec_policy": json.dumps(info)})
    onnx.save(model, out)


def build_parser() -> OneLineParser:
    p = OneLineParser(
        prog="fastvec export",
        description="Write a trained policy as a TorchScript or ONNX file that runs without fastvec.",
    )
    p.add_argument("run", help="a run directory (its newest checkpoint) or a checkpoint file")
    p.add_argument("out", help="the file to write")
    p.add_argument("--format", required=True, choices=FORMATS, help="torchscript (torch.jit.load) or onnx")
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of the most likely one")
    return p


def main(name: str = "export", argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        info = export_policy(args.run, args.out, format=args.format, deterministic=not args.stochastic)
    except (ValueError, OSError) as exc:
        if os.environ.get("FASTVEC_DEBUG"):
            raise
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"fastvec export: error: {msg}", file=sys.stderr)
        return 2
    print(json.dumps(info))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main("export", sys.argv[1:]))
