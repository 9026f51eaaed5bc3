"""The model card ``fastvec train`` leaves in its run directory (``fastvec.train.run.card``).

The card's numbers against ``result.json`` and against the returns the checkpoint keeps
(their mean and spread recomputed here with ``statistics``); its front matter read as
YAML, in the hub's model-index form; its command given back to ``fastvec train
--list-keys``, which must print the run's own settings; a resume's card with both
commands; and the card of a run that finished no episode.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics

import pytest
import yaml

from fastvec.train import PPOConfig, load_checkpoint, write_model_card
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.run.card import command_line

ARGS = ["CartPole-v1", "--total-steps", "2048", "--num-envs", "4", "--seed", "2", "--no-progress", "--no-tensorboard"]
ARGS += ["--set", "lr=0.001", "--set", "hidden=32,32", "--env-kwargs", "sutton_barto_reward=false"]


def _card(run) -> tuple[dict, str]:
    text = (run / "README.md").read_text()
    _, front, body = text.split("---\n", 2)
    return yaml.safe_load(front), body


def _commands(body: str) -> list[str]:
    return re.search(r"## Reproduce\n\n(?:.*\n\n)?```bash\n(.*?)\n```", body, re.S).group(1).splitlines()


def _listed_settings(capsys, line: str) -> dict:
    """``line`` given back to ``fastvec train`` with ``--list-keys``: the settings it would train with."""
    argv = shlex.split(line)
    assert argv[:2] == ["fastvec", "train"]
    capsys.readouterr()
    assert cli_main("train", [*argv[2:], "--list-keys"]) == 0
    return json.loads(capsys.readouterr().out)


def test_card_numbers_command_and_settings(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli_main("train", [*ARGS, "--logdir", str(run)]) == 0
    result = json.loads((run / "result.json").read_text())
    ckpt = load_checkpoint(str(run / "checkpoint.pt"))
    window = ckpt["train_state"]["tracker"]["window"]
    assert len(window) == result["final_return_episodes"] == 20
    assert result["final_mean_return"] == round(statistics.fmean(window), 4)
    assert result["final_return_std"] == round(statistics.pstdev(window), 4) > 0

    meta, body = _card(run)
    assert meta["library_name"] == "fastvec"
    assert {"reinforcement-learning", "CartPole-v1"} <= set(meta["tags"])
    (model,) = meta["model-index"]
    (entry,) = model["results"]
    assert entry["task"]["type"] == "reinforcement-learning" and entry["dataset"]["name"] == "CartPole-v1"
    (metric,) = entry["metrics"]
    mean, std = result["final_mean_return"], result["final_return_std"]
    assert metric["type"] == "mean_reward" and metric["value"] == f"{mean:.2f} +/- {std:.2f}"
    assert f"**{mean:.2f} ± {std:.2f}** over the last 20 episodes" in body
    assert f"| mean return | {mean} |" in body and f"| standard deviation | {std} |" in body
    assert f"| env steps | {result['env_steps']} |" in body
    assert "![mean return against env steps](learning_curve.png)" in body and (run / "learning_curve.png").exists()

    config = ckpt["config"]
    (line,) = _commands(body)
    assert _listed_settings(capsys, line) == config  # the command, run again, trains with the same settings
    changed = dict(re.findall(r"^\| `(\w+)` \| `(.*)` \|$", body, re.M))
    default = PPOConfig().to_dict()
    assert changed == {k: json.dumps(v) if not isinstance(v, str) else v for k, v in config.items() if v != default[k]}
    assert {"lr", "hidden", "num_envs", "seed"} <= set(changed)
    full = re.search(r"<summary>All settings</summary>\n\n```json\n(.*?)\n```", body, re.S).group(1)
    assert json.loads(full) == config


def test_resume_rewrites_the_card_with_both_commands(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli_main("train", [*ARGS, "--logdir", str(run)]) == 0
    assert cli_main("train", ["--resume", str(run), "--total-steps", "3072", "--no-progress", "--no-tensorboard"]) == 0
    result = json.loads((run / "result.json").read_text())
    meta, body = _card(run)
    assert result["resumed"] and result["env_steps"] == 3072
    mean, std = result["final_mean_return"], result["final_return_std"]
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == f"{mean:.2f} +/- {std:.2f}"
    first, again = _commands(body)
    assert shlex.split(first)[2:] == [*ARGS, "--logdir", str(run)]
    assert shlex.split(again)[2:] == [
        "--resume",
        str(run),
        "--total-steps",
        "3072",
        "--no-progress",
        "--no-tensorboard",
    ]
    config = load_checkpoint(str(run / "checkpoint.pt"))["config"]
    assert config["total_steps"] == 3072
    assert _listed_settings(capsys, again) == config


def test_card_without_episodes_and_from_python(tmp_path):
    cfg = PPOConfig(total_steps=64)
    result = {"env_id": "my_envs:Maze-v0", "final_mean_return": None, "final_return_std": None}
    result.update(final_return_episodes=0, env_steps=64, num_envs=2)
    path = write_model_card(str(tmp_path), cfg, result)
    meta, body = _card(tmp_path)
    assert path == str(tmp_path / "README.md")
    assert "model-index" not in meta and "my_envs:Maze-v0" in meta["tags"]
    assert "No episode finished during the run" in body
    assert "started from Python" in body and "```bash" not in body
    assert dict(re.findall(r"^\| `(\w+)` \| `(.*)` \|$", body, re.M)) == {"total_steps": "64"}
    with pytest.raises(ValueError, match="needs the run's env id"):
        write_model_card(str(tmp_path), cfg, {"env_id": None})


def test_command_line_quotes_and_keeps_the_ranks():
    argv = ["CartPole-v1", "--env-kwargs", "a=1, b='x y'", "--logdir", "runs/my run"]
    line = command_line(argv, world=2)
    assert shlex.split(line) == ["fastvec", "train", *argv, "--nproc", "2"]
    assert command_line([*argv, "--nproc", "2"], world=2).count("--nproc") == 1
    assert command_line(argv) == shlex.join(["fastvec", "train", *argv])
