"""The Prepare page shows who was heard in each slice, plays a slice, and flips a decision."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from PySide6.QtWidgets import QTreeWidgetItem

from gui.app import MainWindow
from gui.pages.importer import ImportPage
from gui.pages.prepare import PreparePage


def _rows(page: PreparePage) -> list[QTreeWidgetItem]:
    return [page.slices.topLevelItem(i) for i in range(page.slices.topLevelItemCount())]


def test_prepare_page_who_was_heard(qtbot, pulse, window: MainWindow, workspace: Path,
                                    interview_voice: Path) -> None:
    voice = Path(shutil.copytree(interview_voice, workspace / "interview"))
    window.ctx.set_voice(voice)
    page = window.show_page(PreparePage)
    assert isinstance(page, PreparePage)
    qtbot.waitUntil(lambda: page.slices.topLevelItemCount() > 0, timeout=10000)
    report = json.loads((voice / "prepared" / "report.json").read_text())
    assert len(_rows(page)) == len(report["clips"])  # one recording, two voices: every slice
    assert "most speech" in page.speaker_note.text()
    heard = {r.text(1) for r in _rows(page)}
    assert heard == {"this voice", "another speaker", "two voices at once"}
    other = next(r for r in _rows(page) if r.text(1) == "another speaker")
    clip = next(c for c in report["clips"] if c["id"] == other.text(0))
    assert other.text(2) == f"{clip['speaker']['similarity']:.2f}"
    assert other.text(3) == "left out"

    page.slices.setCurrentItem(other)
    assert page.flip_btn.text() == "Keep" and page.play_btn.isEnabled()
    with qtbot.waitSignal(window.ctx.player.started, timeout=10000):
        page.play_slice()
    assert window.ctx.player.current == voice / "prepared" / "clips" / f"{other.text(0)}.wav"
    window.ctx.player.stop()

    # keep it: the decision is saved and prepare re-runs from its cache
    flipped = other.text(0)
    wav = voice / "prepared" / "clips" / f"{flipped}.wav"
    mtime = wav.stat().st_mtime_ns
    with qtbot.waitSignal(window.ctx.data_changed, timeout=120000):
        page.flip_btn.click()
    # the decision file alone already changes the voice: wait for prepare's own end too
    qtbot.waitUntil(lambda: page.job is None, timeout=120000)
    qtbot.waitUntil(lambda: any(r.text(0) == flipped and r.text(3) == "kept by you"
                                for r in _rows(page)), timeout=20000)
    assert json.loads((voice / "prepared" / "decisions.json").read_text()) == {flipped: "keep"}
    after = json.loads((voice / "prepared" / "report.json").read_text())
    assert wav.stat().st_mtime_ns == mtime  # from the cache: nothing was recomputed
    codes = {i["code"] for c in after["clips"] if c["id"] == flipped for i in c["issues"]}
    assert "speaker_kept" in codes and "another_speaker" not in codes

    # and back: leaving it out again forgets the call
    row = next(r for r in _rows(page) if r.text(0) == flipped)
    page.slices.setCurrentItem(row)
    assert page.flip_btn.text() == "Leave out" and page.flip_btn.isEnabled()
    with qtbot.waitSignal(window.ctx.data_changed, timeout=120000):
        page.flip_btn.click()
    qtbot.waitUntil(lambda: page.job is None, timeout=120000)
    qtbot.waitUntil(lambda: any(r.text(0) == flipped and r.text(3) == "left out"
                                for r in _rows(page)), timeout=20000)
    assert json.loads((voice / "prepared" / "decisions.json").read_text()) == {}


def test_import_page_speaker_reference(qtbot, window: MainWindow, voice: Path,
                                       mixtures, tmp_path: Path) -> None:
    """The Import page hands its speaker reference to `import --speaker-reference`:
    the engine keeps the clip in the voice, and prepare enrols the target from it."""
    from engine.layout.voice import open_voice
    from engine.prepare.pipeline import prepare
    from tests.helpers.mixtures import write_mixture

    files = write_mixture(mixtures["music15"], tmp_path / "src")
    window.ctx.set_voice(voice)
    page = window.show_page(ImportPage)
    assert isinstance(page, ImportPage)
    assert not page.ref_clear.isEnabled() and "none" in page.ref_label.text()
    page.set_speaker_reference(files["enrol1"])
    assert page.ref_clear.isEnabled() and files["enrol1"].name in page.ref_label.text()
    page.ref_clear.click()
    assert page.speaker_reference is None
    page.set_speaker_reference(files["enrol0"])
    with qtbot.waitSignal(window.ctx.data_changed, timeout=60000):
        job = page.import_paths([files["interview"]])
        assert job is not None
    assert job.outcome == "succeeded"
    kept = voice / "speaker_reference.wav"
    assert kept.read_bytes() == files["enrol0"].read_bytes()
    report = prepare(open_voice(voice))
    assert report["speakers"]["enrolment"] == "speaker reference"
    assert report["speakers"]["clips_another_speaker"] > 0


def test_a_flip_within_the_same_second_still_shows(qtbot, window: MainWindow, workspace: Path,
                                                    interview_voice: Path) -> None:
    """Two prepares that end within one second write reports whose time (to the second)
    and totals can agree while one slice's decision differs: the page shows the newer one.
    (Seen in CI: the row kept saying "kept by you" after Leave out.)"""
    from engine.layout.voice import open_voice
    from engine.prepare.pipeline import prepare
    from engine.prepare.target import write_decision

    voice = Path(shutil.copytree(interview_voice, workspace / "interview"))
    report_file = voice / "prepared" / "report.json"
    first = json.loads(report_file.read_text())
    other = next(c for c in first["clips"]
                 if (c.get("speaker") or {}).get("who") == "another speaker")
    write_decision(open_voice(voice), other["id"], "keep")
    prepare(open_voice(voice))
    kept = json.loads(report_file.read_text())
    kept["created"] = first["created"]  # as if both prepares ended within the same second
    window.ctx.set_voice(voice)
    page = window.show_page(PreparePage)
    assert isinstance(page, PreparePage)
    page.show_report(kept)
    row = next(r for r in _rows(page) if r.text(0) == other["id"])
    assert row.text(3) == "kept by you"
    page.show_report(first)
    assert kept["totals"] == first["totals"]  # the slice stays unusable (no usable clip)
    row = next(r for r in _rows(page) if r.text(0) == other["id"])
    assert row.text(3) == "left out"
