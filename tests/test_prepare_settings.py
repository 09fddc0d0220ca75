"""The voice's prepare settings from every surface: the CLI takes each of them by flag or
path (checked by the schema before anything is written) and keeps them for the voice on
`--save-settings`; the Prepare page shows the voice's own and sends a change with the
next prepare, which the clips then measure."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from engine.audio.loudness import integrated_loudness
from engine.layout.voice import open_voice
from gui.app import MainWindow
from gui.pages.prepare import PreparePage
from tests.helpers.cli_events import cli_ends
from tests.helpers.serving import ROOT
from tests.helpers.voices import file_states


def _levels(voice: Path) -> list[tuple[float, float]]:
    """(loudness LUFS, sample peak dBFS) of each prepared clip."""
    levels = []
    for clip in sorted((voice / "prepared" / "clips").glob("*.wav")):
        audio, rate = sf.read(clip, dtype="float32")
        levels.append((integrated_loudness(audio, rate),
                       20 * np.log10(float(np.max(np.abs(audio))))))
    return levels


def test_a_refused_setting_changes_nothing(tmp_path: Path, prepared_voice: Path) -> None:
    voice = Path(shutil.copytree(prepared_voice, tmp_path / "joe"))
    before = file_states(voice)
    # a flag out of its bounds: refused as the command line is read, naming the bound
    low = subprocess.run([sys.executable, "-m", "engine.cli.main", "prepare", str(voice),
                          "--target-lufs", "-50", "--save-settings"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert low.returncode == 2
    assert "--target-lufs: must be at least -40 and at most -10, not -50" in low.stderr
    # by path, and against another setting: refused by the engine before any work
    crossed, = cli_ends(["prepare", str(voice), "--set", "prepare.min_clip_s=20"])
    assert crossed["event"] == "error"
    assert "min_clip_s" in crossed["message"] and "max_clip_s" in crossed["message"], crossed
    assert file_states(voice) == before  # not the voice.toml, not a clip


def test_the_page_shows_the_voices_settings_and_prepares_with_a_change(
        qtbot, window: MainWindow, workspace: Path, prepared_voice: Path) -> None:
    voice = Path(shutil.copytree(prepared_voice, workspace / "joe"))
    open_voice(voice).update_settings(target_lufs=-21.0, vad="energy")
    window.ctx.set_voice(voice)
    page = window.show_page(PreparePage)
    assert isinstance(page, PreparePage)
    loudness = page.settings["target_lufs"]
    qtbot.waitUntil(lambda: loudness.value() == -21.0, timeout=20000)
    assert page.settings["vad"].value() == "energy"
    assert page.settings_args() == []  # the voice's own: nothing to send
    assert loudness.widget.toolTip().startswith("integrated loudness")  # the field's help

    before = np.median([lufs for lufs, _ in _levels(voice)])  # prepared at -23
    loudness.set_value(-18.0)
    assert page.settings_args() == ["--target-lufs", "-18", "--save-settings"]
    QTest.mouseClick(page.run_btn, Qt.MouseButton.LeftButton)
    assert page.job is not None
    qtbot.waitUntil(lambda: page.job is None, timeout=180000)
    assert page.state.text().startswith("Prepared in"), page.state.text()
    kept = open_voice(voice).prepare_settings
    assert (kept["target_lufs"], kept["vad"]) == (-18.0, "energy")
    # each clip at the new target, or as near as its peak ceiling (-1 dBFS) lets it
    levels = _levels(voice)
    assert all(abs(lufs - -18.0) < 0.5 or abs(peak - -1.0) < 0.1 for lufs, peak in levels), \
        levels
    assert np.median([lufs for lufs, _ in levels]) > before + 1.5
    # the page reads the kept value back, so the next prepare sends nothing again
    qtbot.waitUntil(lambda: page.settings_args() == [], timeout=20000)
