"""`<voice>/prepared/`: the names of what prepare writes, and the one reader of its manifest.

```
prepared/clips/<clip>.wav     24 kHz mono clips (engine.prepare.pipeline)
prepared/manifest.jsonl       one clip per line: id, path (relative to the voice), text,
                              duration_s, sample_rate, usable, issues, source_take, and
                              style (its description; "" none), style_source, style_measured
prepared/report.json          the voice's quality report; report.txt the same for people
prepared/cache/<take>.json    what each take produced (prepare's own cache)
prepared/decisions.json       the user's keep/exclude calls on clips
prepared/styles.json          the user's own style descriptions of clips (engine.prepare.styles)
prepared/codes/               codec codes and x-vectors (engine.data.codes); index.json
prepared/staging/             a prepare's new clips and cache entries, moved into place
                              only when it finishes with something to train on
```

A manifest row is usable unless it says otherwise: prepare writes `usable` on
every row (false for a clip its checks blocked), so a row without the field
never carries a verdict of prepare's; it comes from a manifest made by hand
or by another tool, whose author listed the clip to train on. Every reader
(code extraction, the training summary, the memory plan, the window) applies
`row_is_usable`, so a clip counts or not the same way everywhere.

The reference clip (whose x-vector is the speaker, and what a zero-shot
preview clones) is chosen here too, so training, `compare`, `evaluate` and the
window take the same one. Light: no torch, no Qt.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.atomic import read_json, write_text
from engine.core.errors import TrainingError, WorkspaceError
from engine.core.jsonl import BadLine, jsonl_line, read_jsonl
from engine.layout.run import list_runs

PREPARED = "prepared"
CLIPS = "clips"
MANIFEST = "manifest.jsonl"
REPORT = "report.json"
REPORT_TEXT = "report.txt"
CACHE = "cache"
DECISIONS = "decisions.json"
STYLES = "styles.json"
CODES = "codes"
CODES_INDEX = "index.json"
STAGING = "staging"
#: one prepare per voice at a time (engine.prepare.pipeline holds it)
LOCK = ".lock"
#: how `clip_references` names the voice's reference clip
LISTEN_REFERENCE = "Listen's reference clip"
#: reference clips: prefer this many seconds of speech (the encoder pools over time)
IDEAL_REFERENCE_S = 8.0


@dataclass(frozen=True)
class PreparedFolder:
    """Where each thing prepare and code extraction write lives, for one voice."""

    voice_dir: Path

    @property
    def path(self) -> Path:
        return self.voice_dir / PREPARED

    @property
    def clips_dir(self) -> Path:
        return self.path / CLIPS

    def clip_file(self, clip_id: str) -> Path:
        return self.clips_dir / f"{clip_id}.wav"

    @staticmethod
    def clip_entry(clip_id: str) -> str:
        """A clip's `path` as the manifest stores it: relative to the voice, '/'-separated."""
        return f"{PREPARED}/{CLIPS}/{clip_id}.wav"

    def row_file(self, row: Mapping[str, Any]) -> Path:
        """The audio file of a manifest row."""
        return self.voice_dir / str(row["path"])

    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST

    @property
    def report(self) -> Path:
        return self.path / REPORT

    @property
    def report_text(self) -> Path:
        return self.path / REPORT_TEXT

    @property
    def cache_dir(self) -> Path:
        return self.path / CACHE

    @property
    def styles(self) -> Path:
        return self.path / STYLES

    @property
    def decisions(self) -> Path:
        return self.path / DECISIONS

    @property
    def lock(self) -> Path:
        return self.path / LOCK

    @property
    def codes_dir(self) -> Path:
        return self.path / CODES

    @property
    def codes_index(self) -> Path:
        return self.codes_dir / CODES_INDEX

    # what a prepare makes lands here first (engine.prepare.pipeline): a prepare that
    # would leave nothing to train on, or is cancelled, leaves clips/ and cache/ as they were
    @property
    def staging_dir(self) -> Path:
        return self.path / STAGING

    def staged_clip(self, clip_id: str) -> Path:
        return self.staging_dir / CLIPS / f"{clip_id}.wav"

    def staged_cache(self, take_id: str) -> Path:
        return self.staging_dir / CACHE / f"{take_id}.json"


def prepared_folder(voice_dir: str | os.PathLike[str]) -> PreparedFolder:
    return PreparedFolder(Path(voice_dir))


def clip_voice(clip: str | os.PathLike[str]) -> Path | None:
    """The voice folder a prepared clip file lies in (None: not in a `prepared/clips/`)."""
    path = Path(clip)
    if path.parent.name == CLIPS and path.parent.parent.name == PREPARED:
        return path.parent.parent.parent
    return None


# --- the manifest ------------------------------------------------------------------------

def row_is_usable(row: Mapping[str, Any]) -> bool:
    """Whether a manifest row is training data: its `usable`, and True without one."""
    return bool(row.get("usable", True))


def read_manifest(voice_dir: str | os.PathLike[str], *, usable_only: bool = True,
                  strict: bool = True) -> list[dict[str, Any]]:
    """The prepared clips of a voice (usable ones by default), in manifest order.

    Strict (training, synthesis): no manifest or a damaged line is a WorkspaceError.
    Not strict (the window, a size estimate): either reads as what could be read.
    """
    folder = prepared_folder(voice_dir)
    path = folder.manifest
    if not strict:
        rows = read_jsonl(path)
    else:
        if not path.is_file():
            raise WorkspaceError(f"{folder.voice_dir.name} has no prepared clips.",
                                 "Run prepare first (voxshard-engine prepare VOICE).")
        try:
            rows = read_jsonl(path, strict=True)
        except BadLine as exc:
            raise WorkspaceError(f"{path} line {exc.line_no} {exc.reason}; prepare the voice "
                                 "again.") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkspaceError(f"{path} cannot be read ({exc}); prepare the voice "
                                 "again.") from exc
    return [r for r in rows if row_is_usable(r)] if usable_only else rows


def write_manifest(voice_dir: str | os.PathLike[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """Replace the manifest with `rows` (atomically: a reader sees the old or the new one)."""
    write_text(prepared_folder(voice_dir).manifest, "".join(jsonl_line(r) for r in rows))


def read_report(voice_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """report.json, or None when it is missing or damaged."""
    data = read_json(prepared_folder(voice_dir).report)
    return data if isinstance(data, dict) else None


# --- the reference clip ------------------------------------------------------------------

def choose_reference(voice_dir: str | os.PathLike[str], clips: Sequence[Mapping[str, Any]],
                     wanted: str | None = None,
                     report: Mapping[str, Any] | None = None) -> str:
    """The clip whose x-vector becomes the speaker: `wanted`, or the best one.

    Best = fewest quality warnings, then highest SNR (from report.json, or
    `report` when the caller holds it already), then duration closest to
    IDEAL_REFERENCE_S (the encoder pools statistics over time: longer clean
    speech gives a steadier vector), then id for a stable tie-break.
    """
    ids = [str(c["id"]) for c in clips]
    if not ids:
        raise TrainingError("The voice has no usable clips.",
                            "Record or import more audio and prepare again.")
    if wanted is not None:
        if wanted not in ids:
            raise TrainingError(f"Reference clip {wanted!r} is not a usable prepared clip.",
                                "Pick one of the clips listed in the prepare report.")
        return wanted
    snr: dict[str, float] = {}
    try:
        for c in ((report if report is not None else read_report(voice_dir)) or {}
                  ).get("clips", []):
            if c.get("id") is not None and c.get("snr_db") is not None:
                snr[str(c["id"])] = float(c["snr_db"])
    except (AttributeError, TypeError, ValueError):
        snr = {}  # a report of another shape ranks by warnings and duration alone

    def rank(c: Mapping[str, Any]) -> tuple[float, float, float, str]:
        warnings = len(c.get("issues") or [])  # usable clips carry warnings only
        return (warnings, -snr.get(str(c["id"]), 0.0),
                abs(float(c.get("duration_s", 0.0)) - IDEAL_REFERENCE_S), str(c["id"]))

    return str(min(clips, key=rank)["id"])


def extracted_reference(voice_dir: str | os.PathLike[str]) -> str | None:
    """The clip code extraction took the x-vector from (codes/index.json), if recorded."""
    index = read_json(prepared_folder(voice_dir).codes_index)
    ref = index.get("reference_clip") if isinstance(index, dict) else None
    return ref if isinstance(ref, str) and ref else None


def reference_clip(voice_dir: str | os.PathLike[str],
                   clips: Sequence[Mapping[str, Any]] | None = None,
                   report: Mapping[str, Any] | None = None) -> Path | None:
    """The voice's reference clip file: the one training took the x-vector from, else
    the one it would take (`choose_reference`); None without a usable clip.

    Also the default reference of every zero-shot preview (compare, evaluate, the
    window's Listen page), so the preview and the trained voice start from the
    same recording. `clips` (every manifest row) and `report`: what a caller
    holding them already would otherwise have read again.
    """
    folder = prepared_folder(voice_dir)
    if clips is None:
        clips = read_manifest(voice_dir, usable_only=False, strict=False)
    usable = [c for c in clips if row_is_usable(c) and c.get("id") is not None and c.get("path")]
    if not usable:
        return None
    by_id = {str(c["id"]): c for c in usable}
    chosen = extracted_reference(voice_dir)
    if chosen not in by_id:  # not extracted yet, or the voice was prepared again since
        chosen = choose_reference(voice_dir, usable, report=report)
    return folder.row_file(by_id[chosen])


# --- seconds of speech: one rule for every count of them ----------------------------------

@dataclass(frozen=True)
class SpeechCount:
    """The seconds of speech each take counts toward the recommended minutes.

    One rule for every such count (the prepare report's usable minutes, the window's
    minutes in use and its recording progress): a take the last prepare judged as it
    is now counts the usable clips it gave, trimmed and sliced (a silent or rejected
    take counts nothing); a take prepare has not judged (new, changed since, or left
    out then and included since) counts its length, or nothing when it is known not
    to train (`cannot_train`: its own recorded verdict). Leaving a take out is the
    caller's to apply: the Import page counts a take again the moment it is ticked.
    """

    usable_s: Mapping[str, float]  # take id -> seconds of its usable clips
    #: take id -> content hash, for the takes the last prepare judged while in use
    judged: Mapping[str, str]
    #: a report from before `takes_in_use`: the hashes it saw, and the ids it judged
    hashes: frozenset[str] = frozenset()

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, Any]], report: Mapping[str, Any] | None
           ) -> SpeechCount:
        usable: dict[str, float] = {}
        for r in rows:
            take = str(r.get("source_take") or "")
            if row_is_usable(r) and take:
                usable[take] = usable.get(take, 0.0) + _seconds(r.get("duration_s"))
        report = report or {}
        judged = report.get("takes_in_use")
        if isinstance(judged, dict):
            return cls(usable, {str(k): str(v) for k, v in judged.items()})
        # an older report: every take with rows or a verdict of its own was judged
        ids = set(usable) | {str(r.get("take")) for r in report.get("rejected") or []
                             if isinstance(r, dict) and r.get("code") != "excluded"}
        ids |= {str(r.get("source_take")) for r in rows if r.get("source_take")}
        hashes = frozenset(str(h) for h in report.get("take_hashes") or [])
        return cls(usable, dict.fromkeys(ids, ""), hashes)

    def seconds(self, take_id: str, sha256: str, duration_s: float | None,
                cannot_train: bool = False) -> float:
        """What the take counts while it is in use."""
        seen = self.judged.get(take_id)
        if seen is not None and (seen == sha256 or (not seen and sha256 in self.hashes)):
            return self.usable_s.get(take_id, 0.0)
        return 0.0 if cannot_train else _seconds(duration_s)


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


# --- what refers to a prepared clip -------------------------------------------------------

def clip_references(voice_dir: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Who names each prepared clip, in words a person reads, by clip id: Listen's
    reference (`reference_clip`, which training also takes the speaker from), a run's
    speaker reference (data.json), a run's evaluation (its reference clips and its
    zero-shot reference). Prepare says which of them a clip it removes leaves behind."""
    voice = Path(voice_dir)
    out: dict[str, list[str]] = {}

    def add(clip: str | None, who: str) -> None:
        if clip and who not in out.setdefault(clip, []):
            out[clip].append(who)

    listen = reference_clip(voice)
    add(listen.stem if listen is not None else None, LISTEN_REFERENCE)
    for run in list_runs(voice):
        add(run.recorded_reference(), f"run {run.name}'s speaker")
        evaluation = run.evaluation() or {}
        ref = evaluation.get("reference")
        for clip in (ref.get("clips") or []) if isinstance(ref, dict) else []:
            add(str(clip.get("id")) if isinstance(clip, dict) else None,
                f"run {run.name}'s evaluation")
        for entry in evaluation.get("entries") or []:
            path = entry.get("reference") if isinstance(entry, dict) else None
            if isinstance(path, str) and clip_voice(path) is not None:
                add(Path(path).stem, f"run {run.name}'s evaluation")
    return out
