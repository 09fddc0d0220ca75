"""The Train page at 1100x760 in the app's theme (issue 45): the settings form is no wider
than its column (the theme's paddings made it 410 px in a 356 px column, which cut every
box's right side), and the evaluation line reads inside its room (it wrapped to three lines
in a room of two, and the room cut the first and last in half)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtGui import QTextLayout, QTextOption
from PySide6.QtWidgets import QLabel

from engine.core.atomic import write_json
from gui.app import MainWindow
from gui.pages.train import TrainPage


def _lines(label, text: str) -> int:
    """How many lines `text` takes in a word-wrapped label as wide as `label`."""
    layout = QTextLayout(text, label.font())
    option = QTextOption()
    option.setWrapMode(QTextOption.WrapMode.WordWrap)
    layout.setTextOption(option)
    layout.beginLayout()
    count = 0
    while (line := layout.createLine()).isValid():
        line.setLineWidth(label.contentsRect().width())
        count += 1
    layout.endLayout()
    return count


@pytest.mark.parametrize("window", ["light", "dark"], indirect=True)
def test_the_form_and_the_evaluation_line_fit_at_1100x760(
        qtbot, window: MainWindow, voice: Path, tmp_path: Path) -> None:
    run = voice / "runs" / "2026-01-01_a"
    run.mkdir(parents=True)
    write_json(run / "config.json", {"run": {"steps": 24}})
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "train", "step": s, "loss/train": 9.0 - s / 10}) + "\n"
        for s in range(1, 25)))
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    qtbot.waitUntil(lambda: page._history is None, timeout=20000)
    scroll = page.settings.scroll
    # the form's boxes have their right side in view: no wider than the column
    qtbot.waitUntil(lambda: scroll.widget().width() <= scroll.viewport().width(),
                    timeout=10000)
    assert scroll.widget().minimumSizeHint().width() <= scroll.viewport().width()
    # a summary longer than two lines at this width
    write_json(run / "evaluation" / "evaluation.json", {"format": 1,
        "entries": [{"kind": "zero_shot", "mean": {"similarity": 0.462}}, *(
            {"kind": "checkpoint", "step": s, "label": f"step {s}",
             "mean": {"similarity": 0.461, "wer": 1.0}} for s in (12, 24))],
        "best": {"step": 24, "label": "step 24", "similarity": 0.461, "wer": 1.0},
        "count": {"written": 2}, "skipped": []})
    assert page.show_evaluation() is not None
    note = page.eval_note
    qtbot.waitUntil(note.isVisible, timeout=10000)
    whole = note.text()
    room = (note.height() - 4) // note.fontMetrics().lineSpacing()
    assert _lines(note, whole) > room  # the case that was cut
    # what the label paints (QLabel's own text): no longer than its room
    shown = QLabel.text(note)
    assert shown != whole and shown.endswith("…"), shown
    assert _lines(note, shown) <= room, (shown, room)
    assert whole in note.toolTip()  # read in full there
    assert window.grab().save(str(tmp_path / f"train-1100-{window.theme.theme.name}.png"))


def test_a_run_with_styles_keeps_the_evaluation_line_to_two_lines(
        qtbot, window: MainWindow, voice: Path) -> None:
    """Issue 50: the evaluation line of a run trained with styles ("styles obeyed") had a
    third line of room, so the chart tabs dropped 15 px at 1100x760 between two runs."""
    evaluation = {"format": 1, "entries": [
        {"kind": "zero_shot", "mean": {"similarity": 0.462}},
        {"kind": "checkpoint", "step": 12, "label": "step 12",
         "mean": {"similarity": 0.461, "wer": 1.0},
         "styles": {"followed": 1, "measurable": 2, "per_style": {}}}],
        "best": {"step": 12, "label": "step 12", "similarity": 0.461, "wer": 1.0},
        "count": {"written": 3}, "skipped": [{"step": 4}, {"step": 8}]}
    for name, styles in (("2026-01-01_plain", None), ("2026-01-02_styled", ["Whisper."])):
        run = voice / "runs" / name
        run.mkdir(parents=True)
        write_json(run / "config.json", {"run": {"steps": 12}})
        (run / "metrics.jsonl").write_text(json.dumps(
            {"kind": "train", "step": 12, "loss/train": 8.0}) + "\n")
        if styles:
            write_json(run / "data.json", {"styles": styles})
        write_json(run / "evaluation" / "evaluation.json", evaluation)
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    qtbot.waitUntil(lambda: page._history is None and page.eval_note.isVisible(),
                    timeout=20000)

    def tabs_top(name: str) -> int:
        i = page.run_picker.findData(str(voice / "runs" / name))
        page.run_picker.setCurrentIndex(i)
        page.run_picker.activated.emit(i)  # as a pick by hand
        qtbot.waitUntil(lambda: page._history is None, timeout=20000)
        assert page.selected_run() is not None and page.selected_run().name == name
        qtbot.wait(50)  # the layout settles
        return page.charts.mapTo(window, page.charts.rect().topLeft()).y()

    styled = tabs_top("2026-01-02_styled")
    assert "styles obeyed 1 of 2" in page.eval_note.toolTip()
    assert tabs_top("2026-01-01_plain") == styled
    note = page.eval_note
    assert note.height() == 2 * note.fontMetrics().lineSpacing() + 4
