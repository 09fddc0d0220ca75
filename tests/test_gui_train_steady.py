"""The Train page holds still and speaks the window's words (issue 45, "smaller"): the
evaluation line keeps its room whether it shows or not (the tabs stayed put), a new run's
Log starts empty and names no command-line flag, and one quality point sits inside its
chart, not on its edge."""

from __future__ import annotations

import json
from pathlib import Path

from engine.core.atomic import write_json
from gui.app import MainWindow
from gui.pages.train import TrainPage
from tests.helpers.processes import flood_program


def _run(voice: Path, name: str = "2026-01-01_a", steps: int = 40) -> Path:
    run = voice / "runs" / name
    run.mkdir(parents=True)
    write_json(run / "config.json", {"run": {"steps": steps}})
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "train", "step": s, "loss/train": 9.0 - s / 10}) + "\n"
        for s in range(1, steps + 1)))
    for step in (20, 40):
        ckpt = run / f"checkpoint_step_{step:07d}"
        ckpt.mkdir()
        (ckpt / "COMPLETE").write_text("")
    return run


def _page(qtbot, window: MainWindow, voice: Path) -> TrainPage:
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    qtbot.waitUntil(lambda: page._history is None, timeout=20000)
    qtbot.wait(200)
    return page


def _tabs_top(page: TrainPage) -> int:
    return page.charts.mapTo(page, page.charts.rect().topLeft()).y()


def test_the_evaluation_line_keeps_its_room(qtbot, window: MainWindow, voice: Path) -> None:
    run = _run(voice)
    page = _page(qtbot, window, voice)
    assert not page.eval_note.isVisible()
    before = _tabs_top(page)
    # one checkpoint measured (step 20): the line shows, the tabs stay where they were
    write_json(run / "evaluation" / "evaluation.json", {"format": 1,
        "entries": [{"kind": "checkpoint", "step": 20, "label": "step 20",
                     "mean": {"similarity": 0.71, "wer": 0.12}}],
        "best": {"step": 20, "label": "step 20", "similarity": 0.71, "wer": 0.12},
        "count": {"written": 2}, "skipped": [{"step": 40, "reason": "deleted"}]})
    assert page.show_evaluation() is not None
    qtbot.wait(200)
    assert page.eval_note.isVisible() and page.eval_note.text()
    assert _tabs_top(page) == before
    # its whole text is there to read, however narrow the window
    assert page.eval_note.toolTip() == page.eval_note.text()
    # one quality point: inside the chart's x range, not on its edge, and in its y range
    charts = page.charts
    charts.redraw()
    (x0, x1), (y0, y1) = charts.quality_plot.getViewBox().viewRange()
    margin = 0.2 * (x1 - x0)
    assert x0 + margin <= 20 <= x1 - margin, (x0, x1)
    assert y0 <= 0.12 and 0.71 <= y1, (y0, y1)
    # a new run: the line goes, the tabs still stay
    page.eval_note.hide()
    qtbot.wait(100)
    assert _tabs_top(page) == before


def test_a_new_runs_log_is_its_own_in_the_windows_words(qtbot, window: MainWindow,
                                                         voice: Path) -> None:
    run = _run(voice)
    page = _page(qtbot, window, voice)
    page._append_log("info", "a line of the last run")
    job = page.start(program=flood_program(5, run=str(run.parent / "2026-01-02_b")))
    assert job is not None
    with qtbot.waitSignal(job.finished, timeout=30000):
        pass
    log = page.log.toPlainText()
    assert "a line of the last run" not in log
    assert "Training started with the settings in the form: " in log
    assert " --" not in log, log
