"""The Serve page at the smallest window (issue 45): the Requests table shows several rows
while a server runs with Home Assistant on, and a served name never wraps inside itself."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtGui import QTextLayout, QTextOption

from gui.app import MainWindow
from gui.pages.serve import WORD_JOINER, ServePage, serving_text
from tests.helpers.voices import make_voice


def _breaks(text: str, label, width: int) -> list[int]:
    """Where a word-wrapped label of `width` px starts each line of `text` after the first."""
    layout = QTextLayout(text, label.font())
    option = QTextOption()
    option.setWrapMode(QTextOption.WrapMode.WordWrap)
    layout.setTextOption(option)
    layout.beginLayout()
    starts = []
    while True:
        line = layout.createLine()
        if not line.isValid():
            break
        line.setLineWidth(width)
        starts.append(line.textStart())
    layout.endLayout()
    return starts[1:]


@pytest.mark.parametrize("window", ["light", "dark"], indirect=True)
def test_the_requests_table_has_rows_to_show_at_1100x760(
        qtbot, window: MainWindow, workspace: Path, tmp_path: Path) -> None:
    # in the app's own theme: its padding made the rows taller, and the table showed one
    theme = window.theme.theme.name
    voice = make_voice(workspace)
    export = voice / "exports" / "ada-v1"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    window.resize(1100, 760)
    page = window.show_page(ServePage)
    assert isinstance(page, ServePage)
    page.home_assistant.setChecked(True)
    # serving (a stand-in for the engine's job), with Home Assistant's panel and its line
    page.job = SimpleNamespace(outcome=None)  # type: ignore[assignment]
    page._started_with = 1
    page._on_event({"event": "state", "state": "serving", "url": "http://127.0.0.1:8000/v1",
                    "voices": ["ada", "ada/ada-v1"], "wyoming": "tcp://127.0.0.1:10200",
                    "wyoming_voices": [["ada", "ada (best: fine-tuned)"],
                                       ["ada/ada-v1", "ada/ada-v1 (fine-tuned)"]]})
    for _ in range(4):
        page._add_request({"status": 200, "voice": "ada/ada-v1", "format": "wav",
                           "audio_s": 1.5, "seconds": 0.4})
    # the layout settles over turns of the event loop (a loaded machine takes longer)
    qtbot.waitUntil(lambda: page.log.viewport().height() >= 3 * page.log.rowHeight(0),
                    timeout=10000)
    rows = page.log.viewport().height() / page.log.rowHeight(0)
    assert rows >= 3, rows
    assert window.height() <= 760
    shots = Path(os.environ.get("VOXSHARD_SHOTS", tmp_path))
    assert window.grab().save(str(shots / f"serve-1100-{theme}.png"))
    page._rate_timer.stop()
    page.job = None


def test_a_served_name_never_wraps_inside_itself(qtbot, window: MainWindow) -> None:
    page = window.page(ServePage)
    names = ["ada/ada-v1", "ada/2026-01-01_run-a"]
    text = serving_text(1, ["ada", *names])
    spans = []
    for name in names:
        shown = next(p for p in text.split(", ") if p.replace(WORD_JOINER, "").rstrip(".")
                     == name)
        start = text.index(shown)
        spans.append((name, start, start + len(shown.rstrip("."))))
    for width in range(120, 700, 5):
        for at in _breaks(text, page.state, width):
            for name, a, b in spans:
                assert not a < at < b, f"{width} px: {name!r} broken at {at - a}"
