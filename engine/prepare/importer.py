"""Import: audio files and folders into a voice's takes, with their transcripts.

The audio is copied byte for byte (prepare does all conversion later). Each
file is probed first; one that cannot be used is skipped with a one-line
reason and the rest of the batch goes on. A file already in the voice (same
SHA-256) is skipped, so importing a folder twice does not duplicate takes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.audio.io import AUDIO_EXTENSIONS, BadAudioFile, probe
from engine.core.errors import AudioError, Cancelled, InputError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.layout.voice import Voice, display_path, file_sha256
from engine.prepare.transcribe import transcribe_takes
from engine.prepare.transcripts import TranscriptIndex, find_sidecar, load_transcripts


def _expand(paths: list[Path], skipped: list[dict[str, str]]) -> list[Path]:
    """Files named directly, plus audio files found (recursively, sorted) in folders."""
    out: list[Path] = []
    seen: set[str] = set()

    def add(p: Path) -> None:
        key = os.path.normpath(p.absolute())
        if key not in seen:
            seen.add(key)
            out.append(p)

    for p in paths:
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    f = Path(root) / name
                    if f.suffix.lower() in AUDIO_EXTENSIONS and not name.startswith("."):
                        add(f)
        elif p.suffix.lower() in AUDIO_EXTENSIONS:
            add(p)  # even if missing or unreadable: the probe says why
        elif not p.exists() and not p.is_symlink():
            skipped.append({"path": display_path(p), "code": "missing",
                            "reason": "does not exist"})
        else:
            skipped.append({"path": display_path(p), "code": "not_audio",
                            "reason": "is not a WAV, FLAC, OGG or MP3 file (by its extension)"})
    return out


@dataclass
class _ImportBatch:
    """One import's state between its steps: what the voice already holds (by
    SHA-256), the transcripts to look in, and the rows imported and skipped."""

    voice: Voice
    em: Emitter
    index: TranscriptIndex | None
    known: dict[str, str]
    max_s: float
    skipped: list[dict[str, str]]
    sidecars: dict[Path, TranscriptIndex | None] = field(default_factory=dict)
    imported: list[dict[str, Any]] = field(default_factory=list)

    def skip(self, f: Path, code: str, reason: str, level: str = "warning") -> None:
        self.skipped.append({"path": display_path(f), "code": code, "reason": reason})
        self.em.log(f"{display_path(f)} {reason}; skipped.", level=level, code=code)

    def transcript(self, f: Path) -> tuple[str | None, str | None]:
        """The file's text and where it came from: the explicit list, then a sidecar."""
        text = self.index.lookup(f) if self.index is not None else None
        if text is not None:
            return text, "list"
        text = find_sidecar(f, self.sidecars)
        return text, ("sidecar" if text is not None else None)

    def usable(self, f: Path) -> bool:
        """The probe and the length limit pass; else the file is skipped with why."""
        try:
            info = probe(f)
            if info.duration_s > self.max_s:
                raise BadAudioFile(f"is too long ({info.duration_s / 60:.1f} min; the limit "
                                   f"is {self.max_s / 60:.0f} min per file)", "too_long_file")
        except BadAudioFile as exc:
            self.skip(f, exc.reason_code, exc.message)
            return False
        return True

    def already_imported(self, f: Path) -> bool:
        try:
            digest = file_sha256(f) if f.is_file() else None
        except OSError:
            digest = None  # add_take reports why it cannot copy
        if digest is None or digest not in self.known:
            return False
        self.skipped.append({"path": display_path(f), "code": "already_imported",
                             "reason": f"is already take {self.known[digest]}"})
        self.em.log(f"{display_path(f)} is already take {self.known[digest]}; skipped.")
        return True

    def add(self, f: Path) -> None:
        """Copy one file in as a take; an audio error skips this file only."""
        text, text_from = self.transcript(f)
        if not self.usable(f) or self.already_imported(f):
            return
        try:
            take = self.voice.add_take(f, text or "", source=display_path(f))
        except AudioError as exc:  # this file only; disk or workspace errors stop the batch
            cause = exc if isinstance(exc, BadAudioFile) else exc.__cause__
            bad = cause if isinstance(cause, BadAudioFile) else None
            self.skip(f, bad.reason_code if bad else exc.code,
                      bad.message if bad else exc.message)
            return
        self.known[take.sha256] = take.id
        self.imported.append({"take": take.id, "source": take.source, "text": take.text,
                              "text_from": text_from, "duration_s": take.duration_s})


def import_files(voice: Voice, paths: list[str | os.PathLike[str]],
                 transcripts: str | os.PathLike[str] | TranscriptIndex | None = None,
                 on_event: EventCallback | Emitter | None = None,
                 cancel: Any = None, transcribe: bool | str | None = None) -> dict[str, Any]:
    """Copy audio files (and the audio in folders) into `voice` as takes.

    Transcripts: the explicit list `transcripts` first, then a same-named .txt,
    then an LJSpeech metadata.csv next to the audio or one folder up.
    `transcribe` (True, or a recogniser spec such as "pocketsphinx" or a Whisper
    model): afterwards, speech recognition fills the missing transcripts of the
    imported takes and flags doubtful ones (`engine.prepare.transcribe`).
    Returns {"imported": [...], "skipped": [...], "summary": str} (plus
    "transcription" when transcribing).
    """
    em = as_emitter(on_event)
    if not paths:
        raise InputError("No files or folders to import.")
    index: TranscriptIndex | None
    if transcripts is None or isinstance(transcripts, TranscriptIndex):
        index = transcripts
    else:
        index = load_transcripts(transcripts)
    skipped: list[dict[str, str]] = []
    files = _expand([Path(p) for p in paths], skipped)
    batch = _ImportBatch(voice, em, index, {t.sha256: t.id for t in voice.list_takes()},
                         float(voice.prepare_settings["max_file_minutes"]) * 60.0, skipped)
    for i, f in enumerate(files):
        if cancel is not None and cancel():
            raise Cancelled("Import was cancelled; files imported so far are kept.")
        em.progress("import", i, len(files), file=display_path(f.name))
        batch.add(f)
    em.progress("import", len(files), len(files))
    transcription = None
    if transcribe and batch.imported:
        transcription = transcribe_imported(voice, batch.imported, transcribe, em, cancel)
    out = {"imported": batch.imported, "skipped": skipped,
           "summary": _summary(voice, batch.imported, skipped, transcription)}
    if transcription is not None:
        out["transcription"] = transcription
    return out


def _summary(voice: Voice, imported: list[dict[str, Any]], skipped: list[dict[str, str]],
             transcription: dict[str, Any] | None) -> str:
    minutes = sum(t["duration_s"] or 0.0 for t in imported) / 60.0
    lines = [f"Imported {len(imported)} file(s), {minutes:.2f} min, into {voice.path}."]
    no_text = sum(1 for t in imported if not t["text"])
    if transcription is not None:
        lines.append(transcription["summary"])
    elif no_text:
        lines.append(f"{no_text} of them have no transcript.")
    if skipped:
        lines.append(f"Skipped {len(skipped)}:")
        lines += [f"  {s['path']}: {s['reason']}" for s in skipped]
    return "\n".join(lines)


def transcribe_imported(voice: Voice, imported: list[dict[str, Any]], spec: bool | str, em: Emitter,
                cancel: Any) -> dict[str, Any]:
    """Speech recognition over the takes just imported; their rows get the new text."""
    result = transcribe_takes(voice, None if spec is True else str(spec),
                              takes=[t["take"] for t in imported], on_event=em, cancel=cancel)
    by_take = {r["take"]: r for r in result["takes"]}
    for row in imported:
        heard = by_take.get(row["take"])
        if heard is not None:
            if heard["filled"]:
                row["text"], row["text_from"] = heard["text"], "asr"
            row["doubtful"] = heard["doubtful"]
    return result
