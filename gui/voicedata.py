"""Deprecated: the old names, now read through engine.catalog (the one reading of a voice).

Kept only until the Train page, gui/screenshots.py and the journey test move to
`engine.catalog` (or `ctx.reader`'s snapshots); new code uses those directly.
These calls read the disk on the calling thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import catalog
from engine.catalog import RunInfo as Run
from engine.catalog import TakeInfo as Take
from engine.catalog import checkpoint_step, list_runs, list_takes, prepared_clips, quality_report
from engine.workspace import RECOMMENDED_MINUTES

__all__ = ["RECOMMENDED_MINUTES", "Run", "Take", "VoiceSummary", "checkpoint_step",
           "list_exports", "list_renders", "list_runs", "list_takes", "list_voices",
           "prepared_clips", "quality_report", "speaker_name", "summarize"]

speaker_name = catalog.speaker_name
list_renders = catalog.list_renders


def list_voices(workspace: Path) -> list[Path]:
    return [v.path for v in catalog.list_voices(workspace)]


def list_exports(voice: Path) -> list[Path]:
    return [e.path for e in catalog.list_exports(voice)]


@dataclass
class VoiceSummary:
    name: str
    speaker: str
    language: str
    takes: int
    recorded_minutes: float
    usable_minutes: float | None
    verdict: str
    runs: int
    exports: int
    renders: int


def summarize(voice: Path) -> VoiceSummary:
    s: dict[str, Any] = catalog.voice_summary(voice)
    prep = s.get("prepared") or {}
    usable = prep.get("minutes_usable")
    return VoiceSummary(
        name=voice.name, speaker=str(s["display_name"]), language=str(s["language"]),
        takes=int(s["takes"]), recorded_minutes=float(s["minutes_recorded"]),
        usable_minutes=float(usable) if isinstance(usable, int | float) else None,
        verdict=str(s["verdict"]), runs=int(s["runs"]), exports=int(s["exports"]),
        renders=int(s["renders"]))
