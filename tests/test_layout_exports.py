"""Which export a command means, and what counts as one: one rule in engine.layout.exports."""

from __future__ import annotations

import os
from pathlib import Path

from engine import catalog
from engine.layout.exports import (
    EXPORT_CONFIG,
    comparisons,
    latest_export,
    list_exports,
    new_comparison_dir,
)
from engine.synth.voice import available_sources


def _export(voice: Path, name: str, mtime: float, complete: bool = True) -> Path:
    folder = voice / "exports" / name
    folder.mkdir(parents=True)
    if complete:
        (folder / EXPORT_CONFIG).write_text("{}")
        os.utime(folder / EXPORT_CONFIG, (mtime, mtime))
    return folder


def test_the_newest_complete_export_is_the_latest(tmp_path: Path) -> None:
    voice = tmp_path / "v"
    assert list_exports(voice) == [] and latest_export(voice) is None
    old = _export(voice, "b-old", 1_000.0)
    new = _export(voice, "a-new", 2_000.0)  # the name sorts first, the time says newest
    _export(voice, "c-half", 3_000.0, complete=False)  # no config.json: still being written
    _export(voice, ".tmp-d", 4_000.0)  # the export's hidden staging folder
    assert list_exports(voice) == [new, old]
    assert latest_export(voice) == new
    # the window's picker and the catalog read the same rule
    assert [s["path"] for s in available_sources(voice)] == [str(new), str(old)]
    assert sorted(e.name for e in catalog.list_exports(voice)) == ["a-new", "b-old"]


def test_comparisons_are_the_finished_ones_in_time_order(tmp_path: Path) -> None:
    voice = tmp_path / "v"
    first = new_comparison_dir(voice)
    assert first.parent == voice / "renders" and first.name.startswith("compare-")
    done = [voice / "renders" / "compare-20260101-000000",
            voice / "renders" / "compare-20260102-000000"]
    for d in done:
        d.mkdir(parents=True)
        (d / "index.json").write_text("{}")
    (voice / "renders" / "compare-20260103-000000").mkdir()  # still rendering
    assert comparisons(voice) == done == catalog.comparisons(voice)
