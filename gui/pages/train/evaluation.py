"""A run's evaluation read back for the Train page, written by the engine's `evaluate`
(from the app or the command line) where `engine.layout.run.Run` says. Read through the
layout: the window never imports the engine's evaluation (it loads torch).

The file is what was measured: the engine writes each voice there before it says so
(its `metric` event), so the page draws the quality chart and its line of words from
the file every time the evaluator reports, not from the events one by one (a watcher
measures the newest checkpoint first, and two evaluations may add to one file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.core.errors import WorkspaceError
from engine.core.kinds import VoiceKind
from engine.layout.run import Run
from engine.prepare.styles import styles_obeyed
from gui.metrics import MetricsStore, Series

#: the quality chart's series and the evaluation figure each one draws
QUALITY_SERIES = {"quality/similarity": "similarity", "quality/wer": "wer"}
ZERO_SHOT = "quality/similarity_zero_shot"

#: the engine's evaluation format this reader understands (engine/quality/evaluate.py)
FORMAT = 1


def catalog_evaluation(run_dir: Path) -> dict[str, Any] | None:
    """The run's evaluation, or None when it has none (or one this app cannot read)."""
    try:
        data = Run(Path(run_dir)).evaluation()
    except WorkspaceError:
        return None  # written by another version: it names a kind of voice this one lacks
    if data is None or data.get("format") != FORMAT \
            or not isinstance(data.get("entries"), list):
        return None
    return data


def evaluation_summary(data: dict[str, Any]) -> str:
    """One line: what was measured, the best checkpoint, the baseline, what was skipped."""
    entries = data.get("entries") or []
    ckpts = [e for e in entries if e.get("kind") == VoiceKind.CHECKPOINT]
    count = data.get("count") or {}
    written = count.get("written") if isinstance(count.get("written"), int) else None
    parts = [f"Evaluation: {len(ckpts)} of {max(written, len(ckpts))} checkpoints measured"
             if written else f"Evaluation: {len(ckpts)} checkpoint(s) measured"]
    best = data.get("best") or {}
    if best.get("label"):
        sim, wer = best.get("similarity"), best.get("wer")
        figures = ", ".join(x for x in (
            f"similarity {sim:.3f}" if isinstance(sim, int | float) else "",
            f"word errors {wer:.0%}" if isinstance(wer, int | float) else "") if x)
        parts.append(f"best {best['label']}" + (f" ({figures})" if figures else ""))
    zero = next((e for e in entries if e.get("kind") == VoiceKind.ZERO_SHOT), None)
    zsim = ((zero or {}).get("mean") or {}).get("similarity")
    if isinstance(zsim, int | float):
        parts.append(f"zero-shot clone {zsim:.3f}")
    styled = style_lines(data)
    if styled:  # the best checkpoint's, else the newest measured (all in the tooltip)
        chosen = next((line for step, line in styled if step == best.get("step")),
                      styled[-1][1])
        parts.append(chosen)
    skipped = [n.get("step") for n in data.get("skipped") or [] if isinstance(n, dict)]
    if skipped:
        parts.append("not measured (deleted by training first, the report says why): step "
                     + ", ".join(str(s) for s in skipped))
    return " · ".join(parts) + ". Open report for the players and plots."


def style_lines(data: dict[str, Any]) -> list[tuple[int, str]]:
    """(step, "step 20: styles obeyed 1 of 2") of each measured checkpoint of a run
    trained with styles, by step; none for a run without."""
    return [(e["step"], f"step {e['step']}: {styles_obeyed(e['styles'])}")
            for e in sorted((e for e in data.get("entries") or []
                             if e.get("kind") == VoiceKind.CHECKPOINT
                             and isinstance(e.get("step"), int)
                             and isinstance(e.get("styles"), dict)), key=lambda e: e["step"])]


def measured_steps(data: dict[str, Any]) -> list[int]:
    """The checkpoint steps the evaluation measured, in order."""
    return sorted({e["step"] for e in data.get("entries") or []
                   if e.get("kind") == VoiceKind.CHECKPOINT and isinstance(e.get("step"), int)})


def put_quality(store: MetricsStore, data: dict[str, Any]) -> None:
    """The evaluation's figures into `store`: one point per measured checkpoint by step,
    replacing what was drawn before; the zero-shot clone's similarity as the baseline.
    The run's step counter stays where training put it."""
    entries = sorted((e for e in data.get("entries") or [] if e.get("kind") == VoiceKind.CHECKPOINT
                      and isinstance(e.get("step"), int)), key=lambda e: e["step"])
    for key, figure in QUALITY_SERIES.items():
        old = store.series.pop(key, None)
        points = [(e["step"], (e.get("mean") or {}).get(figure)) for e in entries]
        points = [(step, float(v)) for step, v in points if isinstance(v, int | float)]
        if not points:
            store.latest.pop(key, None)
            continue
        series = store.series[key] = Series(store.capacity)
        for step, value in points:
            series.append(float(step), value)
        # a chart redraws a series whose version moved: never the one it drew last
        series.version += old.version + 1 if old is not None else 0
        store.latest[key] = points[-1][1]
    zero = next((e for e in data.get("entries") or []
                 if e.get("kind") == VoiceKind.ZERO_SHOT), None)
    sim = ((zero or {}).get("mean") or {}).get("similarity")
    if isinstance(sim, int | float):
        store.latest[ZERO_SHOT] = float(sim)
