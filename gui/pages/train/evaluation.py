"""A run's evaluation read back for the Train page, written by the engine's `evaluate`
(from the app or the command line) where `engine.layout.run.Run` says. Read through the
layout: the window never imports the engine's evaluation (it loads torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.layout.run import Run

#: the engine's evaluation format this reader understands (engine/quality/evaluate.py)
FORMAT = 1


def catalog_evaluation(run_dir: Path) -> dict[str, Any] | None:
    """The run's evaluation, or None when it has none (or one this app cannot read)."""
    data = Run(Path(run_dir)).evaluation()
    if data is None or data.get("format") != FORMAT \
            or not isinstance(data.get("entries"), list):
        return None
    return data


def evaluation_summary(data: dict[str, Any]) -> str:
    """One line: what was measured, the best checkpoint, the baseline, what was skipped."""
    entries = data.get("entries") or []
    ckpts = [e for e in entries if e.get("kind") == "checkpoint"]
    parts = [f"Evaluation: {len(ckpts)} checkpoint(s) measured"]
    best = data.get("best") or {}
    if best.get("label"):
        sim, wer = best.get("similarity"), best.get("wer")
        figures = ", ".join(x for x in (
            f"similarity {sim:.3f}" if isinstance(sim, int | float) else "",
            f"word errors {wer:.0%}" if isinstance(wer, int | float) else "") if x)
        parts.append(f"best {best['label']}" + (f" ({figures})" if figures else ""))
    zero = next((e for e in entries if e.get("kind") == "zero_shot"), None)
    zsim = ((zero or {}).get("mean") or {}).get("similarity")
    if isinstance(zsim, int | float):
        parts.append(f"zero-shot clone {zsim:.3f}")
    skipped = [n.get("step") for n in data.get("skipped") or [] if isinstance(n, dict)]
    if skipped:
        parts.append("not measured (deleted by training first): step "
                     + ", ".join(str(s) for s in skipped))
    return " · ".join(parts) + ". Open report for the players and plots."
