"""Issue 51: one help text per setting, its schema field's (the `#:` comment above it): the
Train form's tooltips and the `train` command's flags say that text, and no other."""

from __future__ import annotations

import argparse

from engine.cli.main import build_parser
from engine.config.schema import field_help, lookup
from engine.config.train import REQUEST_SETTINGS, ModelConfig, ParallelConfig
from gui.pages.train.settings import FORM_SETTINGS, TrainSettings


def _subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_every_train_form_widget_says_its_fields_help(qtbot) -> None:
    form = TrainSettings()
    qtbot.addWidget(form)
    widgets = {path: form.fields[lookup(path)[1]].widget for path in FORM_SETTINGS}
    widgets["parallel.workers"] = form.workers
    widgets["model.base"] = form.base
    for path, widget in widgets.items():
        cls, name = lookup(path)
        assert field_help(cls)[name], path  # every setting the form shows has its help
        assert widget.toolTip() == field_help(cls)[name], path
    # one text for the code predictor's share, where there were three
    assert form.predictor_frames.toolTip().startswith("the share of each step's audio frames")


def test_every_train_flag_says_its_fields_help() -> None:
    for command in ("train", "plan"):
        flags = {a.dest: a for a in _subcommand(command)._actions}
        paths = [p for p in REQUEST_SETTINGS if lookup(p)[1] in flags]
        assert "model.predictor_frames" in paths and "parallel.workers" in paths
        for path in [*paths, "model.base"]:
            cls, name = lookup(path)
            shown = flags[name].help.replace("%%", "%")
            # the field's help, then what the schema adds: its bounds and default
            assert shown.startswith(field_help(cls)[name]), (command, path, shown)
            rest = shown[len(field_help(cls)[name]):]
            assert rest == "" or (rest.startswith(" (") and rest.endswith(")")), (path, rest)
    assert field_help(ModelConfig)["base"] and field_help(ParallelConfig)["workers"]
