"""One settings path (issue 39) for speaking and serving: the Listen and Serve pages' fields
are the engine's SpeakOptions and ServeSettings fields, so the window and the CLI speak and
serve with the same settings for the same choice."""

from __future__ import annotations

from pathlib import Path

from engine.cli.cmd_serve import serve_settings
from engine.cli.cmd_speak import _options
from engine.cli.main import build_parser
from engine.config.serve import ServeSettings
from engine.config.speak import SpeakOptions
from gui.app import MainWindow
from gui.pages.listen import ListenPage
from gui.pages.serve import ServePage


def test_listen_and_the_cli_speak_with_the_same_settings(qtbot, window: MainWindow,
                                                         voice: Path) -> None:
    window.ctx.set_voice(voice)
    page: ListenPage = window.show_page(ListenPage)  # type: ignore[assignment]
    parser = build_parser()
    # nothing chosen: nothing sent, the options' own defaults (the model's sampling)
    assert page.sampling() == {} and page.speak_args() == []
    assert _options(parser.parse_args(["speak", "v", "hi"])) == SpeakOptions()
    # a choice: temperature, no top-k limit (0, not the model's), a seed and a style
    page.temperature.setValue(0.7)
    page.top_k.setValue(0)
    page.seed.setValue(7)
    page.style.setEditText("calm")
    typed = _options(parser.parse_args(["speak", "v", "hi", "--temperature", "0.7",
                                        "--top-k", "0", "--seed", "7", "--instruct", "calm"]))
    assert typed.top_k == 0
    # what the speech worker is sent, and the flags Compare sends, are the CLI's choice
    assert SpeakOptions.from_dict(page.sampling()) == typed
    assert _options(parser.parse_args(["speak", "v", "hi", *page.speak_args()])) == typed
    assert _options(parser.parse_args(["compare", "v", "out", *page.speak_args()])) == typed
    # the fields' ranges are the settings' bounds; below them, "the model's own"
    assert (page.temperature.maximum(), page.top_k.maximum()) == (5.0, 4096)
    page.temperature.setValue(page.temperature.minimum())
    assert page.temperature.text() == "model's" and "temperature" not in page.sampling()
    assert "--temperature" not in page.speak_args()


def test_serve_and_the_cli_serve_with_the_same_settings(qtbot, window: MainWindow) -> None:
    page: ServePage = window.show_page(ServePage)  # type: ignore[assignment]
    parser = build_parser()
    # the form's defaults are the settings' own
    assert serve_settings(parser.parse_args(page.serve_args(None))) == \
        ServeSettings(targets=page.chosen())
    # other computers, another port, a key, Home Assistant announced on the network
    page.host.setCurrentIndex(1)
    page.port.setValue(8123)
    page.home_assistant.setChecked(True)
    page.wyoming_port.setValue(10300)
    page.zeroconf.setChecked(True)
    shown = serve_settings(parser.parse_args(page.serve_args("/tmp/key")))
    typed = serve_settings(parser.parse_args(
        ["serve", *page.chosen(), "--host", "0.0.0.0", "--port", "8123", "--api-key-file",
         "/tmp/key", "--wyoming", "tcp://0.0.0.0:10300", "--wyoming-allow-lan",
         "--zeroconf"]))
    assert shown == typed and shown.zeroconf and shown.wyoming_allow_lan
    # the port's range is the setting's bounds
    assert (page.port.minimum(), page.port.maximum()) == (0, 65535)
