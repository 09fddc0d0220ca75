"""Settings as layers (issue 51): a training setting's value comes from the first layer that
gives it (the request, a config file, the devices, the run being resumed, voice.toml, the
preset, the default), and every value says where it came from; any setting can be given by
its path (`--set`) or a whole config by file (`--config`), checked by the schema."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from engine.cli.main import build_parser, sub_parser
from engine.cli.settings import apply_set
from engine.config.layers import (
    DEFAULT,
    Layer,
    assignment,
    flatten,
    merge,
    read_file,
)
from engine.config.train import TrainConfig
from engine.core.errors import InputError
from engine.layout.run import Run
from engine.train.driver import train
from engine.train.presets import VOLUMES, band_preset, optim_preset
from engine.train.request import TrainRequest
from engine.train.run import TrainRun
from tests.helpers.cli_events import cli_ends
from tests.helpers.voices import voice_with_clips

ROOT = Path(__file__).resolve().parents[1]
#: the tiny test model's size, as the presets name it
SMALL = "the preset for a model under 0.6B"
FEW = "the preset for few minutes (under 10 min)"


def test_the_first_layer_that_gives_a_value_wins_and_says_where_it_came_from() -> None:
    layers = [Layer("the request", {"optim.lr": 1e-3, "run.steps": None}),
              Layer("the run r1 being resumed", {"optim.lr": 2e-3, "run.steps": 40,
                                                 "optim.weight_decay": 0.5}),
              Layer("voice.toml", {"optim.lr": 3e-3, "model.predictor_frames": 0.5}),
              Layer("the preset for 0.6B", {"optim.lr": 4e-6, "optim.warmup_steps": 20})]
    merged = merge(TrainConfig, layers)
    assert merged.get("optim.lr") == 1e-3
    assert merged.provenance["optim.lr"] == "the request"
    # None is "not given": the next layer speaks
    assert (merged.get("run.steps"), merged.provenance["run.steps"]) == (
        40, "the run r1 being resumed")
    assert merged.provenance["model.predictor_frames"] == "voice.toml"
    assert merged.provenance["optim.warmup_steps"] == "the preset for 0.6B"
    assert (merged.get("optim.beta1"), merged.provenance["optim.beta1"]) == (0.9, DEFAULT)
    assert "optim.lr 0.001 from the request" in [" ".join(line.split())
                                                 for line in merged.lines()]
    assert not [line for line in merged.lines() if line.endswith(DEFAULT)]
    # one value per setting of the tree, and the tree is a config
    assert TrainConfig.from_dict(merged.tree).optim.weight_decay == 0.5
    without_request = merge(TrainConfig, layers[1:])
    assert without_request.provenance["optim.lr"] == "the run r1 being resumed"


def test_partial_trees_set_and_files_are_read_by_the_schema(tmp_path: Path) -> None:
    # a section's table, or a field whose name no other section shares
    assert flatten({"optim": {"lr": 1e-5}, "predictor_frames": 0.5}, TrainConfig, "t") == {
        "optim.lr": 1e-5, "model.predictor_frames": 0.5}
    with pytest.raises(InputError, match=r"seed, which data\.seed and run\.seed share"):
        flatten({"seed": 1}, TrainConfig, "t")
    with pytest.raises(InputError) as err:
        flatten({"optim": {"lrr": 1}}, TrainConfig, "voice.toml [train]")
    assert "voice.toml [train] names optim.lrr, which is not a setting" in str(err.value)
    assert "The settings of optim are: lr, weight_decay" in str(err.value.hint)

    assert assignment("optim.lr=1e-5", TrainConfig) == ("optim.lr", 1e-5)
    assert assignment("run.val_every=7", TrainConfig) == ("run.val_every", 7)
    assert assignment("parallel.cpu_offload=on", TrainConfig) == ("parallel.cpu_offload", True)
    assert assignment("model.trainable=lora", TrainConfig) == ("model.trainable", "lora")
    refusals = {"optim.lr=-1": ("optim.lr = -1.0; it must be above 0, not -1",
                                "Give optim.lr a value above 0."),
                "run.val_every=2.5": ("run.val_every must be a whole number, not '2.5'",
                                      "at least 0"),
                "model.trainable=all": ("must be one of talker, talker+text", None),
                "optim.nope=1": ("--set names optim.nope, which is not a setting",
                                 "The settings of optim are: lr,"),
                "nope.lr=1": ("nope.lr, which is not a setting", "the sections are: model,"),
                "optim.lr": ("is not section.field=value", "--set optim.lr=1e-5")}
    for text, (message, hint) in refusals.items():
        with pytest.raises(InputError) as err:
            assignment(text, TrainConfig)
        assert message in str(err.value), text
        assert hint is None or hint in str(err.value.hint), (text, err.value.hint)

    saved = TrainConfig().replace(optim={"lr": 3e-4}, run={"steps": 30}).to_dict()
    (tmp_path / "config.json").write_text(json.dumps({**saved, "provenance": {"x": "y"}}))
    from_json = read_file(tmp_path / "config.json", TrainConfig)
    assert (from_json["optim.lr"], from_json["run.steps"]) == (3e-4, 30)
    (tmp_path / "c.toml").write_text("[optim]\nlr = 5e-5\n[run]\nsteps = 12\n")
    assert read_file(tmp_path / "c.toml", TrainConfig) == {"optim.lr": 5e-5, "run.steps": 12}
    (tmp_path / "bad.toml").write_text("[optim]\nlr = 0\n")
    with pytest.raises(InputError, match=r"bad.toml has optim.lr = 0; it must be above 0"):
        read_file(tmp_path / "bad.toml", TrainConfig)


def _planned(voice: Path, base: Path, **options: Any) -> dict[str, Any]:
    return train(voice, str(base), workers=1, dry_run=True, **options)


def test_request_resume_voice_and_preset_in_that_order(tmp_path: Path,
                                                       tiny_model_dir: Path) -> None:
    voice = voice_with_clips(tmp_path, 16, 4.0)  # about a minute: the "few" band
    out = _planned(voice, tiny_model_dir)
    prov, cfg = out["provenance"], out["config"]
    few, small = band_preset(0, 0), optim_preset(0)
    assert (cfg["optim"]["lr"], prov["optim.lr"]) == (small["lr"], SMALL)
    assert (cfg["run"]["epochs"], prov["run.epochs"]) == (few["run"]["epochs"], FEW)
    assert prov["run.checkpoint_every"] == FEW
    assert prov["model.speaker_name"] == "voice.toml"
    assert (prov["parallel.workers"], prov["model.base"]) == ("the request", "the request")
    assert prov["run.name"] == "the run's folder"
    assert prov["optim.beta1"] == DEFAULT
    # what the dry run prints: the values and their sources
    shown = [line.split() for line in out["summary"].splitlines()]
    assert ["optim.lr", f"{small['lr']:g}", "from", *SMALL.split()] in shown

    # voice.toml [train] as a partial tree of the config, over the preset
    with (voice / "voice.toml").open("a") as fh:
        fh.write("\n[train]\npredictor_frames = 0.5\nlora_predictor = true\n"
                 "[train.optim]\nlr = 5e-4\n")
    out = _planned(voice, tiny_model_dir)
    assert (out["config"]["optim"]["lr"], out["provenance"]["optim.lr"]) == (5e-4,
                                                                             "voice.toml")
    assert out["provenance"]["model.predictor_frames"] == "voice.toml"
    # the voice's LoRA setting is for its LoRA runs
    assert out["config"]["model"]["lora_predictor"] is False
    assert _planned(voice, tiny_model_dir, trainable="lora")["config"]["model"][
        "lora_predictor"] is True
    # the request over voice.toml
    out = _planned(voice, tiny_model_dir, lr=2e-4)
    assert (out["config"]["optim"]["lr"], out["provenance"]["optim.lr"]) == (2e-4,
                                                                             "the request")

    # a resumed run's own values over voice.toml and the preset; the request over the run
    saved = TrainConfig.from_dict(_planned(voice, tiny_model_dir)["config"]).replace(
        optim={"lr": 3e-4}, run={"name": "r1", "steps": 40, "checkpoint_every": 7},
        model={"predictor_frames": 0.75})
    run = voice / "runs" / "r1"
    run.mkdir(parents=True)
    Run(run).write_config(saved.to_dict())
    out = _planned(voice, tiny_model_dir, resume=True, run="r1", steps=50)
    prov, cfg = out["provenance"], out["config"]
    resumed = "the run r1 being resumed"
    assert (cfg["optim"]["lr"], prov["optim.lr"]) == (3e-4, resumed)
    assert (cfg["run"]["checkpoint_every"], prov["run.checkpoint_every"]) == (7, resumed)
    assert (cfg["model"]["predictor_frames"], prov["model.predictor_frames"]) == (0.75,
                                                                                  resumed)
    assert (cfg["run"]["steps"], prov["run.steps"]) == (50, "the request")
    out = _planned(voice, tiny_model_dir, resume=True, run="r1", steps=50,
                   settings={"optim.lr": 1e-4})
    assert (out["config"]["optim"]["lr"], out["provenance"]["optim.lr"]) == (1e-4,
                                                                             "the request")


def test_the_run_saves_its_config_with_where_each_value_came_from(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    voice = voice_with_clips(tmp_path, 16, 4.0)
    job = TrainRun(TrainRequest.of(voice, str(tiny_model_dir), workers=1, run="r",
                                   settings={"optim.weight_decay": 0.05}))
    job.resolve()
    job.plan()
    job._storage()  # the run's folder and its config, as a real start writes them
    run = Run(voice / "runs" / "r")
    assert run.provenance()["optim.weight_decay"] == "the request"
    assert run.provenance()["optim.lr"] == SMALL
    # the config readers get the config alone
    assert TrainConfig.from_dict(run.config()).optim.weight_decay == 0.05
    assert json.loads(run.config_file.read_text())["provenance"] == run.provenance()


def test_set_and_config_on_the_command_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    voice = voice_with_clips(tmp_path, 16, 4.0)
    config = tmp_path / "previous" / "config.json"
    config.parent.mkdir()
    previous = TrainConfig().replace(optim={"lr": 3e-4, "weight_decay": 0.2},
                                     run={"name": "old", "val_every": 9})
    config.write_text(json.dumps(previous.to_dict()))
    shape = [str(voice), "--base", str(tiny_model_dir), "--workers", "1"]
    refusals = {"optim.lrr=1": ("--set names optim.lrr, which is not a setting",
                                "The settings of optim are: lr, weight_decay"),
                "optim.lr=-1": ("--set has optim.lr = -1.0; it must be above 0, not -1",
                                "Give optim.lr a value above 0.")}
    result, *errors = cli_ends(
        ["train", *shape, "--dry-run", "--set", "optim.weight_decay=0.05",
         "--set", "run.val_every=7", "--set", "optim.beta2=0.99", "--config", str(config),
         "--lr", "2e-4"],
        *[[command, *shape, "--set", setting, *(["--dry-run"] if command == "train" else [])]
          for setting in refusals for command in ("train", "plan")])
    cfg, prov = result["config"], result["provenance"]
    assert (cfg["optim"]["weight_decay"], cfg["run"]["val_every"], cfg["optim"]["beta2"]) \
        == (0.05, 7, 0.99)
    assert prov["optim.beta2"] == prov["run.val_every"] == "the request"
    assert (cfg["optim"]["lr"], prov["optim.lr"]) == (2e-4, "the request")
    # the file under the flags, over the preset; where it ran is not taken
    assert prov["run.epochs"] == "the config file config.json"
    assert cfg["run"]["name"] != "old"
    for error, (message, hint) in zip(errors, [r for r in refusals.values() for _ in "tp"],
                                      strict=True):
        assert error["event"] == "error" and message in error["message"], error
        assert hint in (error.get("hint") or ""), error


def test_every_preset_resolves_inside_the_schema_bounds(tmp_path: Path) -> None:
    from engine.config.layers import checked
    from engine.train.presets import KNOWN_TALKER_HIDDEN, preset_layers

    for hidden in (*KNOWN_TALKER_HIDDEN.values(), 0):
        for band in range(len(VOLUMES)):
            layers = preset_layers(1.0, hidden, VOLUMES[band].key)
            for layer in layers:
                for path, value in layer.values.items():
                    checked(path, value, TrainConfig, layer.source)
            merged = merge(TrainConfig, layers)
            TrainConfig.from_dict(merged.tree)
            assert {merged.provenance[p] for p in ("run.epochs", "optim.lr")} == {
                layers[0].source, layers[1].source}


def test_every_command_that_takes_settings_takes_them_by_path(tmp_path: Path) -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in subs.choices.items():
        if any(getattr(a, "setting_path", None) for a in command._actions):
            assert "--set" in command._option_string_actions, name
    # a path stands for the command's flag, checked and typed by the setting's rule; the
    # flag itself, given too, wins
    args = parser.parse_args(["speak", "m", "hi", "--set", "speak.temperature=0.5",
                              "--set", "speak.top_k=5", "--top-k", "7"])
    apply_set(sub_parser(parser, "speak"), args)
    assert (args.temperature, args.top_k) == (0.5, 7)
    # a file's tables of this command's sections under --set (another command's are theirs)
    file = tmp_path / "speak.toml"
    file.write_text("[speak]\ntemperature = 0.3\nseed = 4\n[optim]\nlr = 1e-5\n")
    args = parser.parse_args(["speak", "m", "hi", "--config", str(file),
                              "--set", "speak.seed=9"])
    apply_set(sub_parser(parser, "speak"), args)
    assert (args.temperature, args.seed) == (0.3, 9)
    file.write_text("[speak]\ntemperatur = 0.3\n")
    with pytest.raises(InputError, match=r"names speak\.temperatur, which is not a setting"):
        apply_set(sub_parser(parser, "speak"), args)
    voice = voice_with_clips(tmp_path, 4, 4.0)
    wrong_choice, unknown = cli_ends(["prepare", str(voice), "--set", "prepare.vad=nope"],
                                 ["speak", str(voice), "hi", "--set", "optim.lr=1"])
    assert wrong_choice["event"] == unknown["event"] == "error"
    assert "prepare.vad = 'nope'; it must be one of silero, energy" in \
        wrong_choice["message"], wrong_choice
    assert "optim.lr, which is not a setting of this command" in unknown["message"]
    assert "speak.temperature" in unknown["hint"]


def test_a_config_file_names_the_base_when_the_request_does_not(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    voice = voice_with_clips(tmp_path, 16, 4.0)
    file = tmp_path / "c.toml"
    file.write_text(f"[model]\nbase = {json.dumps(str(tiny_model_dir))}\n"
                    "[optim]\nlr = 5e-5\n[parallel]\nworkers = 1\n")
    out = train(voice, None, config=str(file), dry_run=True)
    assert out["config"]["model"]["base"] == str(tiny_model_dir)
    assert out["provenance"]["model.base"] == out["provenance"]["optim.lr"] == \
        "the config file c.toml"
    with pytest.raises(InputError, match="No base model given"):
        train(voice, None, dry_run=True)
