"""``fastvec`` command line: ``fastvec train``, ``fastvec eval``, ``fastvec export``, ``fastvec bench``,
``fastvec tune``, ``fastvec report``.

Each subcommand lives in its own module and is imported only when used, so that
``fastvec bench --help`` does not import torch. The current directory is searched last
for modules, so that an env of your own (``MODULE:NAME``, ``fastvec.env_ids``) in the
folder the command runs from is found, as ``python -m fastvec`` would find it.
"""

from __future__ import annotations

import sys

_COMMANDS = {
    "train": ("fastvec.train.commands.cli", "Train PPO on a gymnasium env with fastvec."),
    "eval": ("fastvec.train.commands.cli", "Evaluate a checkpoint written by `fastvec train`."),
    "export": ("fastvec.train.commands.export", "Write a trained policy as a TorchScript or ONNX file."),
    "bench": ("fastvec.bench", "Env steps/s of fastvec against gymnasium's SyncVectorEnv on an env."),
    "tune": ("fastvec.tune", "Time fastvec's layouts (workers, batches, placement) on an env; print the fastest."),
    "report": ("fastvec.report", "Compare groups of finished runs: mean, median, IQM with 95% intervals, P(A > B)."),
}


def _usage() -> str:
    lines = ["usage: fastvec COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<7} {text}" for name, (_, text) in _COMMANDS.items()]
    lines += ["", "Run `fastvec COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"fastvec {__version__}")
        return 0
    name = argv[0]
    if name not in _COMMANDS:
        print(f"fastvec: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    import importlib
    import os

    if "" not in sys.path and os.getcwd() not in sys.path:  # (a console script's path lacks it)
        sys.path.append(os.getcwd())
    module = importlib.import_module(_COMMANDS[name][0])
    return int(module.main(name, argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
