"""CLI flags come from the config dataclasses: one type, default and help per setting."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from engine.cli.main import build_parser
from engine.cli.settings import add_field
from engine.config.schema import field_help
from engine.config.speak import SpeakOptions
from engine.config.train import ModelConfig, RunConfig


@dataclass
class _Knobs:
    """A config section as the engine writes them."""

    #: how loud, in LUFS
    #: (two comment lines join)
    loudness: float | None = -20.0
    count: int = 3
    #: on or off
    enabled: bool = False

    def method(self) -> None:
        #: not a field
        pass


def test_field_help_reads_the_comment_above_each_field() -> None:
    assert field_help(_Knobs) == {"loudness": "how loud, in LUFS (two comment lines join)",
                                  "enabled": "on or off"}


def test_a_flag_takes_type_default_and_help_from_its_field() -> None:
    p = argparse.ArgumentParser()
    action = add_field(p, _Knobs, "loudness")
    add_field(p, _Knobs, "count")
    add_field(p, _Knobs, "enabled")
    assert action.help == "how loud, in LUFS (two comment lines join) (default -20)"
    assert action.option_strings == ["--loudness"]
    args = p.parse_args(["--loudness", "-16.5", "--count", "7", "--enabled"])
    assert (args.loudness, args.count, args.enabled) == (-16.5, 7, True)
    # not given: None, so the engine (or a voice's saved setting) decides
    assert vars(p.parse_args([])) == {"loudness": None, "count": None, "enabled": None}
    assert p.parse_args(["--no-enabled"]).enabled is False
    with pytest.raises(SystemExit):
        p.parse_args(["--count", "many"])


def _help_of(parser: argparse.ArgumentParser, command: str, flag: str) -> str:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if flag in a.option_strings)
    return str(action.help)


def test_speak_and_train_help_show_the_config_defaults() -> None:
    parser = build_parser()
    chunk = _help_of(parser, "speak", "--chunk-chars")
    assert chunk.endswith(f"(at least 20 and at most 400; default {SpeakOptions().chunk_chars})")
    assert chunk.startswith(field_help(SpeakOptions)["chunk_chars"])
    assert _help_of(parser, "compare", "--batch-size").endswith(
        f"(at least 1 and at most 64; default {SpeakOptions().batch_size})")
    # a bounded setting says its bounds before its default, both from the field
    assert _help_of(parser, "train", "--lora-rank").endswith(
        f"(at least 1; default {ModelConfig().lora_rank})")
    assert _help_of(parser, "train", "--keep").endswith(
        f"(at least 2; default {RunConfig().keep_checkpoints})")


def test_speak_flags_not_given_leave_the_options_defaults() -> None:
    from engine.cli.cmd_speak import _options

    parser = build_parser()
    args = parser.parse_args(["speak", "voice", "hello"])
    assert _options(args) == SpeakOptions()
    args = parser.parse_args(["speak", "voice", "hi", "--chunk-chars", "90", "--top-k", "5",
                              "--no-loudness", "--greedy"])
    assert _options(args) == SpeakOptions(chunk_chars=90, top_k=5, loudness_lufs=None,
                                          do_sample=False, subtalker_do_sample=False)


def test_every_speech_option_is_a_flag_of_speak_and_compare() -> None:
    """Sampling of codebooks 1..15 and the pauses were settable by the API and HTTP only."""
    from engine.cli.cmd_speak import _options

    parser = build_parser()
    given = ["--subtalker-temperature", "0.5", "--subtalker-top-k", "20",
             "--subtalker-top-p", "0.8", "--no-subtalker-do-sample", "--do-sample",
             "--sentence-pause-s", "0.1", "--paragraph-pause-s", "1.5"]
    want = SpeakOptions(subtalker_temperature=0.5, subtalker_top_k=20, subtalker_top_p=0.8,
                        subtalker_do_sample=False, do_sample=True, sentence_pause_s=0.1,
                        paragraph_pause_s=1.5)
    assert _options(parser.parse_args(["speak", "voice", "hi", *given])) == want
    compare = parser.parse_args(["compare", "voice", "out", *given, "--sentences", "hi"])
    assert _options(compare) == want


def test_every_setting_is_taken_by_some_command() -> None:
    """Each setting of the schema is a flag of a command (or a --set path of train and
    plan, which take any training setting); the few a command names its own way are
    listed with that name, which must exist."""
    from engine.cli.settings import _settings_of
    from engine.config.layers import paths
    from engine.config.schema import SECTIONS
    from engine.config.train import TrainConfig

    parser = build_parser()
    commands = next(a for a in parser._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    flagged = {path for command in commands.values() for path in _settings_of(command)}
    own_words = {"serve.targets": ("serve", "voices"), "read.script": ("read", "script"),
                 "read.project": ("read", "project"), "read.cast": ("read", "cast"),
                 "read.styles": ("read", "styles"), "read.regenerate": ("read", "regenerate"),
                 "read.pick": ("read", "pick"), "read.out": ("read", "output"),
                 "cluster_serve.address": ("serve", "address")}
    for path, (command, dest) in own_words.items():
        assert dest in {a.dest for a in commands[command]._actions}, (path, command, dest)
    every = [f"{name}.{f.name}" for name, cls in SECTIONS.items()
             for f in dataclasses.fields(cls)]
    missing = [p for p in every
               if p not in flagged and p not in paths(TrainConfig) and p not in own_words]
    assert missing == []


def test_serve_flags_default_to_the_serve_settings() -> None:
    from engine.cli.cmd_serve import serve_settings
    from engine.config.serve import ServeSettings

    args = build_parser().parse_args(["serve"])
    want = ServeSettings()
    assert (args.host, args.port, args.rows, args.queue, args.timeout_s, args.max_input,
            args.max_body, args.max_loaded, args.dtype) == (
        want.host, want.port, want.rows, want.queue, want.timeout_s, want.max_input,
        want.max_body, want.max_loaded, want.dtype)
    assert _help_of(build_parser(), "serve", "--port").endswith(
        f"(at least 0 and at most 65535; default {want.port})")
    assert serve_settings(args) == want
    # a number outside its setting's bounds is refused by the parser, in the field's words
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--port", "70000"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["speak", "v", "hi", "--temperature", "0"])
