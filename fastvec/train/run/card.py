"""The model card of a run directory: ``README.md``, the way the Hugging Face hub's
reinforcement-learning model cards read, so the folder can be published as it is.

``write_model_card(run_dir, config, result, command)`` writes it: YAML front matter (the
library, tags, and a ``model-index`` with the ``mean_reward`` metric), then the env and
the algorithm, the final return with its spread, the learning curve
(``learning_curve.png``, drawn by the monitor), the commands that reproduce the run, the
settings that differ from ``PPOConfig``'s defaults, and all of them folded away.
``fastvec train`` writes it at the end of every run (a resume rewrites it); the
commands of a run's invocations are kept in ``RUN_DIR/commands.json``.
"""

from __future__ import annotations

import json
import os
import shlex

from ..config.settings import PPOConfig

__all__ = ["write_model_card", "command_line", "record_command", "nondefault_settings"]

CARD = "README.md"
COMMANDS = "commands.json"


def command_line(argv: list[str], world: int = 1) -> str:
    """``fastvec train``'s arguments ``argv`` as one shell line; a rank of a
    ``world``-rank run (whose arguments lost ``--nproc``) gets it back."""
    argv = list(argv)
    if world > 1 and not any(a == "--nproc" or a.startswith("--nproc=") for a in argv):
        argv += ["--nproc", str(world)]
    return shlex.join(["fastvec", "train", *argv])


def record_command(run_dir: str, line: str, resumed: bool) -> list[str]:
    """The run's commands so far with ``line`` last: a resume's is added to the ones
    kept in ``run_dir``; a new run starts the list. Kept in ``COMMANDS``."""
    path = os.path.join(run_dir, COMMANDS)
    lines: list[str] = []
    if resumed and os.path.exists(path):
        with open(path) as f:
            lines = list(json.load(f))
    lines.append(line)
    with open(path, "w") as f:
        json.dump(lines, f, indent=1)
    return lines


def nondefault_settings(config: PPOConfig) -> dict:
    """The settings of ``config`` that differ from ``PPOConfig()``'s, in its order."""
    default = PPOConfig().to_dict()
    return {k: v for k, v in config.to_dict().items() if v != default.get(k)}


def _value(v) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def _front_matter(env_id: str, result: dict) -> str:
    """The hub's metadata: library, tags, and the mean return as ``mean_reward``."""
    lines = ["---", "library_name: fastvec", "tags:", "- reinforcement-learning", f"- {json.dumps(env_id)}", "- ppo"]
    mean, std = result.get("final_mean_return"), result.get("final_return_std")
    if mean is not None:
        lines += [
            "model-index:",
            "- name: PPO",
            "  results:",
            "  - task:",
            "      type: reinforcement-learning",
            "      name: reinforcement-learning",
            "    dataset:",
            f"      name: {json.dumps(env_id)}",
            f"      type: {json.dumps(env_id)}",
            "    metrics:",
            "    - type: mean_reward",
            f"      value: {mean:.2f} +/- {(std or 0.0):.2f}",
            "      name: mean_reward",
            "      verified: false",
        ]
    return "\n".join([*lines, "---", ""])


def _result_section(result: dict) -> list[str]:
    mean, std, n = result.get("final_mean_return"), result.get("final_return_std"), result.get("final_return_episodes")
    out = ["## Result", ""]
    if mean is None:
        out += ["No episode finished during the run, so there is no return to report.", ""]
    else:
        out += [
            f"Mean return **{mean:.2f} ± {(std or 0.0):.2f}** over the last {n} episodes the training envs finished.",
            "",
            "This is the training envs' return at the run's end (mean ± standard deviation over those episodes, "
            "actions sampled from the policy as it learned), not a separate evaluation. To evaluate the saved "
            "policy greedily: `fastvec eval RUN_DIR --episodes 10`.",
            "",
        ]
    rows = [
        ("mean return", mean),
        ("standard deviation", std),
        ("episodes", n),
        ("env steps", result.get("env_steps")),
        ("wall time (s)", result.get("wall_seconds")),
        ("solved", result.get("solved")),
        ("interrupted", result.get("interrupted")),
        ("seed", result.get("seed")),
        ("policy", result.get("policy")),
    ]
    out += ["| | |", "|---|---|", *(f"| {k} | {_value(v)} |" for k, v in rows), ""]
    return out


def _settings_section(config: PPOConfig) -> list[str]:
    changed = nondefault_settings(config)
    out = ["## Settings", ""]
    if changed:
        out += ["The settings that differ from `fastvec.train.PPOConfig`'s defaults:", ""]
        out += ["| setting | value |", "|---|---|", *(f"| `{k}` | `{_value(v)}` |" for k, v in changed.items()), ""]
    else:
        out += ["Every setting is `fastvec.train.PPOConfig`'s default.", ""]
    full = json.dumps(config.to_dict(), indent=1)
    out += ["<details>", "<summary>All settings</summary>", "", "```json", full, "```", "", "</details>", ""]
    return out


def _commands_section(commands: list[str]) -> list[str]:
    out = ["## Reproduce", ""]
    if not commands:
        return [*out, "The run was started from Python (`fastvec.train.run_training`), not a command line.", ""]
    if len(commands) > 1:
        out += ["The run was resumed; its commands, in order:", ""]
    return [*out, "```bash", *commands, "```", ""]


def write_model_card(run_dir: str, config: PPOConfig, result: dict, commands: list[str] | None = None) -> str:
    """``run_dir``/README.md for the run of ``config`` that gave ``result`` (its
    ``result.json``), reproduced by the shell lines ``commands`` (none: a run from
    Python). Returns the card's path."""
    env_id = result.get("env_id")
    if not env_id:
        raise ValueError("a model card needs the run's env id (result['env_id'])")
    lines = [
        _front_matter(env_id, result),
        f"# PPO on {env_id}",
        "",
        f"A policy for `{env_id}` trained with fastvec's PPO "
        f"(`fastvec train`): {result.get('env_steps')} env steps on {result.get('num_envs')} envs. "
        "`checkpoint.pt` holds the weights; `fastvec eval` plays it, `fastvec export` writes it for "
        "ONNX Runtime or plain PyTorch.",
        "",
        *_result_section(result),
    ]
    if os.path.exists(os.path.join(run_dir, "learning_curve.png")):
        lines += ["## Learning curve", "", "![mean return against env steps](learning_curve.png)", ""]
    lines += [*_commands_section(list(commands or ())), *_settings_section(config)]
    path = os.path.join(run_dir, CARD)
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path
