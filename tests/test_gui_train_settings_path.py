"""One settings path (issue 39): the window's run settings are the config's fields, so the
window and the CLI send the same settings for the same choice, with the engine's presets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.cli.cmd_train import train_kwargs
from engine.cli.main import build_parser
from engine.config.layers import Layer
from engine.config.train import ModelConfig, TrainConfig
from engine.train.presets import KNOWN_TALKER_HIDDEN, optim_preset, preset_layers
from engine.train.request import TrainRequest
from engine.train.resolve import DataSummary, resolve_config
from gui.app import MainWindow
from gui.pages.train import TrainPage

SMALL = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
LARGE = "Qwen/Qwen3-TTS-12Hz-1.7B-Base"


def _resolved(args: argparse.Namespace, minutes: float) -> dict[str, Any]:
    """The config the driver resolves from parsed `train` flags for a voice of `minutes`
    (the CLI's own path: its keywords, the request, the presets, the overrides)."""
    request = TrainRequest.of(args.voice, args.base, **train_kwargs(args)).validated()
    summary = DataSummary(clips=60, seconds=minutes * 60,
                          ids=tuple(f"c{i}" for i in range(60)))
    asked = Layer("the request", {**request.values(), "model.base": args.base,
                                  "parallel.workers": request.given("workers") or 1,
                                  "parallel.use_gpu": False}, chosen=True)
    cfg, _ = resolve_config([asked, *preset_layers(minutes, KNOWN_TALKER_HIDDEN[args.base],
                                                   request.preset)], summary, "r")
    return cfg.to_dict()


def test_the_window_and_the_cli_train_the_same_for_the_same_choice(
        qtbot, window: MainWindow, voice: Path) -> None:
    window.ctx.set_voice(voice)
    page: TrainPage = window.show_page(TrainPage)  # type: ignore[assignment]
    s, parser = page.settings, build_parser()
    # 0.6B + LoRA on the standard preset
    s.base.setEditText(SMALL)
    s.preset.setCurrentIndex(1)
    s.trainable.setCurrentIndex(s.trainable.findData("lora"))
    shown = parser.parse_args(page.train_args())
    # LoRA's own settings are offered, at the engine's defaults
    assert s.lora_rank.isEnabled() and s.lora_alpha.isEnabled() and s.lora_predictor.isEnabled()
    assert (s.lora_rank.value(), s.lora_alpha.value()) == (ModelConfig().lora_rank,
                                                          ModelConfig().lora_alpha)
    # the CLI, given the same choice, the rest (the run's length and rate: the preset's of
    # a 20-minute voice) its own defaults
    typed = parser.parse_args(["train", str(voice), "--base", SMALL, "--trainable", "lora",
                               "--workers", str(s.workers.value())])
    assert shown.lr is None and shown.steps is None  # the engine's preset decides
    assert _resolved(shown, 20.0) == _resolved(typed, 20.0)
    # the learning rate shown is the engine's for 0.6B (the window sent 1.7B's for every
    # model)
    assert _resolved(shown, 20.0)["optim"]["lr"] == s.lr.value() == optim_preset(
        KNOWN_TALKER_HIDDEN[SMALL])["lr"] != optim_preset(KNOWN_TALKER_HIDDEN[LARGE])["lr"]
    s.base.setEditText(LARGE)
    assert _resolved(parser.parse_args(page.train_args()), 20.0)["optim"]["lr"] == \
        s.lr.value() == optim_preset(KNOWN_TALKER_HIDDEN[LARGE])["lr"]
    # a changed rank and alpha reach the engine by the flags the CLI has for them
    s.lora_rank.setValue(8)
    s.lora_alpha.setValue(8.0)
    s.lora_predictor.setChecked(True)
    cfg = _resolved(parser.parse_args(page.train_args()), 20.0)["model"]
    assert (cfg["lora_rank"], cfg["lora_alpha"], cfg["lora_predictor"]) == (8, 8.0, True)
    # another choice: LoRA's settings are not offered, nor sent
    s.trainable.setCurrentIndex(s.trainable.findData("talker"))
    assert not s.lora_rank.isEnabled()
    assert not any(a.startswith("--lora") for a in page.train_args())


def test_a_run_s_settings_come_back_into_the_fields_the_config_made(qtbot) -> None:
    """Every field the form shows is a config field: a run's config fills each of them
    (a new option needs no code here: it is in the form's list, or it is not shown)."""
    from gui.pages.train.settings import FORM_SETTINGS, TrainSettings

    form = TrainSettings()
    qtbot.addWidget(form)
    cfg = TrainConfig().replace(model={"trainable": "lora", "lora_rank": 4, "lora_alpha": 2.0,
                                       "predictor_frames": 0.5},
                                run={"steps": 77, "checkpoint_every": 7},
                                parallel={"precision": "fp16", "cpu_offload": True})
    form.load_run_config(cfg.to_dict())
    for path in FORM_SETTINGS:
        section, _, name = path.partition(".")
        assert form.fields[name].value() == cfg.to_dict()[section][name], path


def test_prepare_says_the_voice_s_own_recommended_minutes(qtbot, window: MainWindow,
                                                         voice: Path) -> None:
    from gui.pages.prepare import PreparePage

    window.ctx.set_voice(voice)
    page: PreparePage = window.show_page(PreparePage)  # type: ignore[assignment]
    page.show_report({"totals": {"minutes_usable": 6.0, "recommended_minutes": 20.0,
                                 "percent_of_recommendation": 30.0}, "takes": []})
    assert page.cards["percent"].label.text() == "of the recommended 20 min"


def test_a_value_typed_out_of_range_is_said_not_silently_put_back(
        qtbot, window: MainWindow, voice: Path) -> None:
    """Issue 50: LoRA rank 0 typed in the form went back to the last value without a word;
    the field says the engine's rule for it and the value it keeps."""
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    settings = page.settings
    settings.trainable.setCurrentIndex(settings.trainable.findData("lora"))
    field = settings.fields["lora_rank"]
    spin = field.widget
    kept = field.value()
    spin.setFocus()
    spin.lineEdit().selectAll()
    qtbot.keyClicks(spin.lineEdit(), "0")
    assert field.problem.startswith("LoRA rank must be"), field.problem
    assert "not 0" in field.problem and f"it stays {kept}" in field.problem
    spin.lineEdit().selectAll()
    qtbot.keyClicks(spin.lineEdit(), "8")
    assert field.problem == "" and field.value() == 8
