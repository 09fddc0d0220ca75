"""The Read page while a render runs (issue 52): a finished take shows in its line's row
from that line's takes on disk alone; the book is planned again only when the render ends
(re-planned per finished take, a 1,000-line book cost the window a full re-read of the
script, its voices and every take per line: bench/bench_read_page.py)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.core.events import Emitter, Event
from engine.read import read
from gui.pages.read import ReadPage
from tests.helpers.reading import SHORT, read_workspace

LINES = ["The lamp was lit at dusk.", "The bay was calm.", "Nobody spoke."]


def test_a_finished_take_fills_its_row_without_reading_the_script_again(
        qtbot, window, workspace: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    read_workspace(workspace, tiny_model_dir)
    script = tmp_path / "lamp.txt"
    script.write_text("\n\n".join(LINES) + "\n", encoding="utf-8")
    page = window.show_page(ReadPage)
    page.narrator.setCurrentIndex(page.narrator.findData("ada"))
    page.script.setText(str(script))
    page.refresh()
    # short takes, no word check (the tiny model says no words), no retries
    page.fields["max_frames"].widget.setValue(SHORT)
    page.fields["retries"].widget.setValue(0)
    page.fields["word_check"].widget.setChecked(False)
    assert [page.table.item(r, 5).text() for r in range(3)] == ["not rendered"] * 3
    page.table.selectRow(1)
    assert page.takes.count() == 0

    # the engine's own render, its events as a job hands them to the page
    events: list[Event] = []
    request = page._request()  # what the page's job would be asked
    assert request is not None and not request.word_check
    read(request, Emitter(events.append))
    progress = [json.loads(e.to_json()) for e in events
                if e.kind == "progress" and e.data.get("stage") == "render"]
    assert progress
    # the script edited while the render runs: the page keeps the plan it started with
    script.write_text("A new first line.\n\n" + "\n\n".join(LINES[1:]) + "\n",
                      encoding="utf-8")
    for event in progress:
        page._event(event)
    assert [page.table.item(r, 4).text() for r in range(3)] == LINES
    assert [page.table.item(r, 5).text() for r in range(3)] == ["1"] * 3
    assert page.takes.count() == 1  # the selected line's take, listed as it came
    # the render's end plans the book again: the edited line is a line without a take
    page._done()
    assert page.table.item(0, 4).text() == "A new first line."
    assert page.table.item(0, 5).text() == "not rendered"
