"""What the window shows about a voice, read straight from its folder.

The filesystem is the database (design doc): the engine writes, the window
reads. Reading is tolerant: a file the engine has not written yet, or one of
an older layout, leaves a field empty instead of failing the page.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import soundfile as sf

RECOMMENDED_MINUTES = 10.0


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    try:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    rows.append(obj)
    except OSError:
        pass
    return rows


def is_voice(path: Path) -> bool:
    return (path / "voice.toml").is_file()


def list_voices(workspace: Path) -> list[Path]:
    if not workspace.is_dir():
        return []
    try:
        return sorted((p for p in workspace.iterdir() if p.is_dir() and is_voice(p)),
                      key=lambda p: p.name.lower())
    except OSError:
        return []


def voice_config(voice: Path) -> dict[str, Any]:
    try:
        with (voice / "voice.toml").open("rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def speaker_name(voice: Path) -> str:
    cfg = voice_config(voice)
    nested = cfg.get("voice") if isinstance(cfg.get("voice"), dict) else {}
    for key in ("display_name", "speaker", "name"):
        value = cfg.get(key) or nested.get(key)
        if isinstance(value, str) and value:
            return value
    return voice.name


@dataclass
class Take:
    id: str
    path: Path
    text: str
    duration_s: float
    source: str
    excluded: bool
    meta: dict[str, Any] = field(default_factory=dict)
    issues: list[dict[str, Any]] = field(default_factory=list)
    usable: bool | None = None

    @property
    def prompt_id(self) -> str | None:
        value = self.meta.get("prompt_id")
        return str(value) if value else None


def _audio_duration(path: Path) -> float:
    try:
        return float(sf.info(str(path)).duration)
    except Exception:  # unreadable audio is the prepare step's business
        return 0.0


def list_takes(voice: Path) -> list[Take]:
    """Every take in `<voice>/takes/`, with its prepare verdict when there is one."""
    folder = voice / "takes"
    takes: list[Take] = []
    if not folder.is_dir():
        return takes
    verdicts = prepared_by_take(voice)
    report = quality_report(voice) or {}
    rejected = {str(r.get("take")): r for r in report.get("rejected") or []
                if isinstance(r, dict)}
    for meta_path in sorted(folder.glob("*.json")):
        meta = _read_json(meta_path)
        if not isinstance(meta, dict):
            continue
        take_id = str(meta.get("id") or meta_path.stem)
        audio_name = meta.get("audio") or meta.get("file") or meta.get("path")
        audio = folder / audio_name if audio_name else None
        if audio is None or not audio.exists():
            found = [p for p in folder.glob(f"{meta_path.stem}.*") if p.suffix != ".json"]
            audio = found[0] if found else folder / f"{meta_path.stem}.wav"
        duration = meta.get("duration_s")
        if not isinstance(duration, int | float):
            duration = _audio_duration(audio)
        text = meta.get("text")
        if text is None:
            text = meta.get("transcript") or ""
        source = str(meta.get("origin") or
                     ("recorded" if meta.get("prompt_id") else "imported"))
        extra = meta.get("extra") if isinstance(meta.get("extra"), dict) else {}
        excluded = bool(meta.get("excluded") or extra.get("excluded"))
        take = Take(id=take_id, path=audio, text=str(text), duration_s=float(duration),
                    source=source, excluded=excluded, meta=meta)
        clips = verdicts.get(take_id)
        if clips:
            take.usable = any(c.get("usable") for c in clips)
            for c in clips:
                take.issues.extend(i for i in c.get("issues") or [] if isinstance(i, dict))
        elif take_id in rejected:
            r = rejected[take_id]
            take.usable = False
            take.issues.append({"code": r.get("code"), "message": r.get("reason")})
        takes.append(take)
    return takes


def prepared_clips(voice: Path) -> list[dict[str, Any]]:
    return _read_jsonl(voice / "prepared" / "manifest.jsonl")


def prepared_by_take(voice: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for clip in prepared_clips(voice):
        key = str(clip.get("source_take") or clip.get("id") or "")
        out.setdefault(key, []).append(clip)
    return out


def quality_report(voice: Path) -> dict[str, Any] | None:
    report = _read_json(voice / "prepared" / "report.json")
    return report if isinstance(report, dict) else None


@dataclass
class Run:
    name: str
    path: Path
    checkpoints: list[Path]
    metrics_file: Path
    config: dict[str, Any]


# engine/train/checkpoint.py: <run>/checkpoint_step_NNNNNNN/, complete once COMPLETE exists
_CKPT = re.compile(r"^checkpoint_step_(\d+)$")


def checkpoint_step(path: Path) -> int | None:
    m = _CKPT.match(path.name)
    return int(m.group(1)) if m else None


def _run_checkpoints(run_dir: Path) -> list[Path]:
    try:
        found = [p for p in run_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None
                 and (p / "COMPLETE").exists()]
    except OSError:
        return []
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def list_runs(voice: Path) -> list[Run]:
    runs: list[Run] = []
    folder = voice / "runs"
    if not folder.is_dir():
        return runs
    for run_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        ckpts = _run_checkpoints(run_dir)
        cfg = _read_json(run_dir / "config.json")
        runs.append(Run(run_dir.name, run_dir, ckpts, run_dir / "metrics.jsonl",
                        cfg if isinstance(cfg, dict) else {}))
    return runs


def list_exports(voice: Path) -> list[Path]:
    folder = voice / "exports"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and (p / "config.json").exists())


def list_renders(voice: Path) -> list[dict[str, Any]]:
    """Rendered audio, newest first, with its sidecar description when present."""
    folder = voice / "renders"
    if not folder.is_dir():
        return []
    items: list[dict[str, Any]] = []
    for wav in folder.glob("*.wav"):
        meta = _read_json(wav.with_suffix(".json"))
        entry: dict[str, Any] = meta if isinstance(meta, dict) else {}
        entry["path"] = wav
        entry.setdefault("mtime", wav.stat().st_mtime)
        items.append(entry)
    items.sort(key=lambda e: e["mtime"], reverse=True)
    return items


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
    cfg = voice_config(voice)
    takes = [t for t in list_takes(voice)]
    minutes = sum(t.duration_s for t in takes if not t.excluded) / 60.0
    report = quality_report(voice) or {}
    usable = (report.get("totals") or {}).get("minutes_usable")
    if usable is None:
        clips = prepared_clips(voice)
        if clips:
            usable = sum(float(c.get("duration_s") or 0) for c in clips if c.get("usable")) / 60
    advice = report.get("advice") or []
    verdict = " ".join(str(a) for a in advice) if advice else ""
    if not verdict:
        if usable is None:
            verdict = "Not prepared yet"
        elif usable >= RECOMMENDED_MINUTES:
            verdict = "Ready to train"
        else:
            verdict = f"{RECOMMENDED_MINUTES - usable:.1f} more usable minutes recommended"
    return VoiceSummary(
        name=voice.name, speaker=speaker_name(voice),
        language=str(cfg.get("language", "") or ""), takes=len(takes),
        recorded_minutes=minutes, usable_minutes=None if usable is None else float(usable),
        verdict=verdict, runs=len(list_runs(voice)), exports=len(list_exports(voice)),
        renders=len(list_renders(voice)),
    )
