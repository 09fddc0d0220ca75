"""An error's remedy is data (issue 39): a setting it names is "{section.field}", and each
surface words it: the CLI as its flag, the window as the field's label, the API as the
keyword. No engine error outside the CLI writes a setting's flag itself."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli.main import build_parser, cli_words
from engine.cli.settings import FLAGS
from engine.config.schema import label_of, lookup
from engine.core.errors import InputError
from gui.jobs import settings_worded

ROOT = Path(__file__).resolve().parents[1]
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")


def _raised_texts(path: Path) -> list[tuple[int, str]]:
    """The string parts of every `raise` statement's exception in a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(sub.lineno, sub.value) for node in ast.walk(tree)
            if isinstance(node, ast.Raise) and node.exc is not None
            for sub in ast.walk(node.exc)
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str)]


def test_no_engine_error_names_a_setting_by_its_flag() -> None:
    build_parser()  # every command's settings and the flags it has for them
    setting_flags = set(FLAGS.values())
    assert {"--predictor-frames", "--lr", "--precision", "--workers"} <= setting_flags
    found = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        if (ROOT / "engine" / "cli") in path.parents:
            continue  # the CLI's own words
        for line, text in _raised_texts(path):
            found += [f"{where}:{line} {flag}" for flag in _FLAG.findall(text)
                      if flag in setting_flags]
    assert found == []


def test_each_surface_words_the_setting_an_error_names() -> None:
    err = InputError("{model.predictor_frames} must be above 0, not 0.",
                     "Give {model.predictor_frames} a fraction such as 0.25.")
    assert err.settings == ["model.predictor_frames"]
    assert err.message == "predictor_frames must be above 0, not 0."  # the API's keyword
    assert err.worded(cli_words) == ("--predictor-frames must be above 0, not 0.",
                                     "Give --predictor-frames a fraction such as 0.25.")
    # a setting no command has a flag for is named as the config names it
    assert cli_words("model.subtalker_weight") == "model.subtalker_weight"
    assert label_of(*lookup("model.predictor_frames")) == "Code predictor frames"


def test_the_window_shows_a_refusal_of_the_engine_in_its_fields_labels() -> None:
    """The CLI's JSON error carries the settings and the texts with them as data; the window
    words them as its fields' labels, never as flags."""
    proc = subprocess.run([sys.executable, "-m", "engine.cli.main", "--json", "train",
                           str(ROOT / "no-such-voice"), "--base", "b", "--lora-predictor"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    event = json.loads(proc.stdout.strip().splitlines()[-1])
    assert event["event"] == "error"
    assert event["message"].startswith("--lora-predictor puts LoRA adapters")  # a terminal's
    assert event["settings"] == ["model.lora_predictor", "model.trainable"]
    message, hint = settings_worded(event)
    assert message == ("LoRA on the code predictor too puts LoRA adapters on the code "
                       "predictor, so it needs What trains set to lora.")
    assert "--" not in message + hint and "What trains" in hint
    # an event without settings is shown as the engine wrote it
    assert settings_worded({"message": "Disk full.", "hint": "Free space."}) == (
        "Disk full.", "Free space.")


def test_a_serve_refusal_reaches_the_serve_page_in_its_words(tmp_path: Path) -> None:
    """The server's refusal names its settings as data: the CLI says the flag, the Serve
    page the label of its own field (`gui.pages.serve`'s SettingField of ServeSettings)."""
    proc = subprocess.run([sys.executable, "-m", "engine.cli.main", "--json", "serve",
                           "--workspace", str(tmp_path), "--host", "0.0.0.0", "--port", "0"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    event = json.loads(proc.stdout.strip().splitlines()[-1])
    assert event["message"].startswith("Refusing to serve on 0.0.0.0 without an API key")
    assert event["hint"].startswith("Use --api-key-file, or --host 127.0.0.1")  # a terminal's
    assert event["settings"] == ["serve.api_key_file", "serve.host"]
    _, hint = settings_worded(event)
    assert hint == "Use Require a key, or Listen on 127.0.0.1 (this computer only)."


def test_a_refused_prepare_setting_is_named_as_data(tmp_path: Path) -> None:
    from engine.layout.voice import create_voice

    voice = create_voice(tmp_path / "v", "Ada")
    with pytest.raises(InputError) as info:
        voice.update_settings(target_lufs=5.0)
    err = info.value
    assert err.settings == ["prepare.target_lufs"]
    assert err.message == "target_lufs must be at least -40 and at most -10, not 5."
    message, _ = settings_worded({"template": err.template, "hint_template": None})
    assert message == "Loudness must be at least -40 and at most -10, not 5."
